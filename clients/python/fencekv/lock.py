"""Leases: a lock held, renewed in the background, and released."""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Any, Optional

from . import _proto, errors
from .types import Bytes, Duration

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Lease"]


class Lease:
    """A lock held for as long as its ``with`` block runs::

        with client.lock("inventory", ttl=10, wait=5) as lease:
            lease.check()                     # raises LeaseLost once it may be lost
            client.put("inventory/sku-1", b"41", lease=lease)

    Entering acquires the lock (waiting up to ``wait`` seconds in the
    server's FIFO queue; LockHeld if it is not granted), under a holder name
    no other client uses (``host:pid:random``) unless ``holder`` is given.
    A background thread renews the lease every third of ``ttl - margin``.

    The client keeps a deadline on its own monotonic clock: ``ttl - margin``
    after it *sent* the request that last gave the lease its full TTL (the
    acquire, or the last successful renew). The server measures the same
    lease from a later moment, so the client gives up first. Once a renew is
    refused (NotHolder, LeaseExpired) or the deadline passes without a
    successful renew, :attr:`lost` is set and :meth:`check` (and every held
    write through ``lease=``) raises :class:`~fencekv.LeaseLost`. A broken
    connection alone does not lose the lease: renews go on over the next
    connection (the server restarted, or another node), until the deadline.

    An acquire whose answer was lost (the connection broke after it was
    sent) may have been granted: the lock is then looked up, and if it is
    held under this lease's holder name, the grant is this lease's (renewed
    at once, having no send time to measure it from).

    With ``limit`` N (2..256) the lease is one of N permits of a semaphore
    (``client.lock("export", ttl=30, wait=3600, limit=3)``): everything here
    holds for the permit, which has a token of its own.

    Leaving the block releases the lock (also after a loss: the server may
    still hold it for us), unless a renew was refused. If the lease was lost
    and the block raised nothing, leaving it raises LeaseLost: the work may
    not have been protected to its end.
    """

    def __init__(self, client: "Client", name: Bytes, ttl: Duration, *, wait: Duration = 0,
                 margin: Optional[Duration] = None, holder: Optional[Bytes] = None,
                 lock_delay: Duration = 0, release_timeout: Duration = 5.0,
                 limit: Optional[int] = None) -> None:
        self.client = client
        self.name: str = _proto.as_name(name)
        self.ttl = _proto.seconds(ttl)
        self.margin = self.ttl / 10 if margin is None else _proto.seconds(margin)
        if not 0 <= self.margin < self.ttl:
            raise ValueError(f"margin {self.margin}s: want 0 or more, and less than the TTL")
        self.wait = _proto.seconds(wait)
        self.lock_delay = lock_delay
        self.limit = limit  # a semaphore's permits: this lease is one of them
        self.release_timeout = _proto.seconds(release_timeout)
        self._ours = holder is None  # a name no one else uses: a lost grant can be found
        self.holder: str = _proto.unique_holder() if holder is None else _proto.as_name(holder)
        self.period = (self.ttl - self.margin) / 3
        self.token: int = 0
        self.lost = threading.Event()
        self.lost_reason: Optional[errors.Error] = None
        self.found = False  # the grant was found by lock_info after its answer was lost
        self._refused = False
        self._sent = 0.0  # send time of the request that last gave the full TTL
        self._deadline = 0.0
        self._q: "queue.SimpleQueue[str]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._held = False

    # -- state -------------------------------------------------------------

    @property
    def deadline(self) -> float:
        """The time.monotonic() at which the lease is taken as lost unless a
        renew succeeds first."""
        return self._deadline

    def remaining(self) -> float:
        """Seconds until the client's deadline (0 once it may be lost)."""
        if self.lost.is_set():
            return 0.0
        return max(self._deadline - time.monotonic(), 0.0)

    def check(self) -> None:
        """Raise LeaseLost if the lease may be lost (the deadline is checked
        here too, so a late renewing thread cannot delay the signal)."""
        if not self.lost.is_set() and self._held and time.monotonic() >= self._deadline:
            self._lose(errors.LeaseLost(self._late_message()))
        if self.lost.is_set():
            raise self.lost_reason or errors.LeaseLost("lease lost")
        if not self._held:
            raise errors.LeaseLost(f"lock {self.name!r} is not held")

    def _late_message(self, last: Optional[BaseException] = None) -> str:
        s = (f"no renew of {self.name!r} (token {self.token}) succeeded within "
             f"{self.ttl - self.margin:g}s of its TTL of {self.ttl:g}s")
        if last is not None:
            s += f" (last: {last})"
        return s

    def _lose(self, why: errors.Error) -> None:
        if not self.lost.is_set():
            self.lost_reason = why
            self.lost.set()

    # -- acquiring ----------------------------------------------------------

    def __enter__(self) -> "Lease":
        self.acquire()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lost = self.release()
        if lost is not None and exc is None:
            raise lost

    def acquire(self) -> "Lease":
        if self._held:
            raise RuntimeError("lease already held")
        c = self.client
        sent = time.monotonic()
        try:
            g = c.acquire(self.name, self.ttl, wait=self.wait, holder=self.holder,
                          lock_delay=self.lock_delay, limit=self.limit)
            token = g.token
        except errors.Error as e:
            if not (self._ours and _proto.unknown_outcome(e)):
                raise
            token = self._find_grant(e)
            self.found = True
        self.token = token
        if self.wait > 0 or self.found:
            # The lease began when it was granted, some unknown time after the
            # acquire was sent: renew at once, and measure from that renew.
            sent = time.monotonic()
            try:
                c.renew(self.name, token, timeout=self.period)
            except errors.Error:
                self._release_retrying()
                raise
        self._sent = sent
        self._deadline = sent + self.ttl - self.margin
        self._held = True
        self.lost.clear()
        self.lost_reason = None
        self._refused = False
        self._thread = threading.Thread(target=self._keep, name=f"fencekv-lease {self.name}",
                                        daemon=True)
        self._thread.start()
        return self

    def _find_grant(self, err: errors.Error) -> int:
        """The token of the grant of an acquire whose answer was lost, found
        by this lease's holder name; else err is raised again."""
        until = time.monotonic() + self.release_timeout
        pause = 0.02
        while True:
            try:
                info = self.client.lock_info(self.name, timeout=self.release_timeout / 3)
                break
            except errors.Error as e:
                if not _proto.retryable(e) or time.monotonic() + pause >= until:
                    raise err from None
                time.sleep(pause)
                pause = min(2 * pause, 0.5)
        token = info.token_of(self.holder)  # a semaphore's permits too
        if token:
            return token
        raise err

    # -- keeping ------------------------------------------------------------

    def _keep(self) -> None:
        c = self.client
        q = self._q
        params = {"lock": _proto.data(self.name), "token": self.token}
        keep = self.ttl - self.margin
        every = self.period
        next_at = self._sent + every
        last_err: Optional[BaseException] = None

        def wait_until(t: float) -> Optional[str]:
            try:
                return q.get(timeout=max(t - time.monotonic(), 0))
            except queue.Empty:
                return None

        while True:
            while True:
                now = time.monotonic()
                if now >= self._deadline:
                    self._lose(errors.LeaseLost(self._late_message(last_err)))
                    return
                if now >= next_at:
                    break
                if wait_until(min(next_at, self._deadline)) == "stop":
                    return
            if c.closed:
                self._lose(errors.LeaseLost(f"no renew of {self.name!r} can be sent: the client "
                                            "is closed"))
                return
            sent = time.monotonic()
            try:
                conn, call = c._begin("renew", params, callback=lambda: q.put("done"))
            except errors.ClientClosed:
                self._lose(errors.LeaseLost(f"no renew of {self.name!r} can be sent: the client "
                                            "is closed"))
                return
            except errors.Error as e:  # no connection now: try again soon
                last_err = e
                next_at = time.monotonic() + every / 4
                continue
            # A renew gets one period: a node that does not answer within it
            # (stopped, cut off, without a leader) is left for the next address.
            until = min(sent + every, self._deadline)
            while not call.finished:
                item = wait_until(until)
                if item == "stop":
                    conn.abandon(call)
                    return
                if item is None:
                    break
            if not call.finished:
                conn.abandon(call)
                last_err = errors.Timeout(f"renew: no answer within {every:g}s", addr=conn.addr)
                c._leave(conn, last_err)
                next_at = time.monotonic()
                continue
            err = call.error
            if err is None:
                last_err = None
                if sent > self._sent:
                    self._sent = sent
                    self._deadline = sent + keep
                next_at = sent + every
            elif isinstance(err, (errors.NotHolder, errors.LeaseExpired)):
                self._refused = True
                lost = errors.LeaseLost(f"renew of {self.name!r} (token {self.token}) refused: "
                                        f"{err}")
                lost.__cause__ = err
                self._lose(lost)
                return
            else:
                # Connection trouble, no leader: the deadline decides; until
                # then, try again sooner than the next tick.
                last_err = err
                if _proto.retryable(err):
                    c._leave(conn, err)
                next_at = time.monotonic() + every / 4

    # -- releasing ----------------------------------------------------------

    def release(self) -> Optional[errors.Error]:
        """Stop renewing and release the lock (unless a renew was refused).
        Returns the loss (LeaseLost) if the lease was lost, else None."""
        if not self._held:
            return None
        self._held = False
        t = self._thread
        if t is not None:
            self._q.put("stop")
            t.join()
            self._thread = None
        lost = self.lost_reason if self.lost.is_set() else None
        if not self._refused and not self.client.closed:
            err = self._release_retrying()
            if (err is not None and lost is None
                    and not isinstance(err, (errors.NotHolder, errors.LeaseExpired))):
                raise err
        return lost

    def _release_retrying(self) -> Optional[errors.Error]:
        """Release within release_timeout, trying again while the connection
        fails or the server cannot serve (it may be coming back)."""
        c = self.client
        until = time.monotonic() + self.release_timeout
        pause = 0.02
        while True:
            try:
                c.release(self.name, self.token, timeout=max(self.release_timeout / 3, 0.1))
                return None
            except errors.ClientClosed as e:
                return e
            except errors.Error as e:
                if not _proto.retryable(e) or time.monotonic() + pause >= until:
                    return e
                time.sleep(pause)
                pause = min(2 * pause, 0.5)

    def __repr__(self) -> str:
        state = "lost" if self.lost.is_set() else ("held" if self._held else "not held")
        return f"<fencekv.Lease {self.name!r} token={self.token} {state}>"
