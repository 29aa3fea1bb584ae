"""Leader election, a composition of the lock calls (wire/PROTOCOL.md §12).

An election is the lock of the same name; the leader's value is the lock's
holder, its epoch the lock's token::

    from fencekv import election

    with election.campaign(client, "nightly-report", socket.gethostname(), ttl=10) as lead:
        client.put("reports/latest", b"...", lease=lead.lease)  # fenced by the epoch
        lead.check()                                           # LeaseLost once it may be lost

    print(election.leader(client, "nightly-report"))
    with election.observe(client, "nightly-report") as states:
        for state in states:          # the current state first, then each change
            print(state.value, state.epoch)
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Optional

from . import _proto, errors
from .lock import Lease
from .types import Bytes, Duration

if TYPE_CHECKING:
    from .client import Client
    from .watch import Watcher

__all__ = ["Leader", "Leadership", "Observer", "campaign", "leader", "observe", "MAX_VALUE"]

MAX_VALUE = 4096  # the longest leader value: the lock holder's limit


class Leader(NamedTuple):
    """An election's state: who leads (value) with which epoch, or nobody
    (held False; epoch is then the last one if the server still knows it)."""

    name: str
    held: bool
    value: str
    epoch: int
    ttl: float  # lease time left; 0 when held but expiring (still the leader)


class Leadership:
    """A won election: the lease of its lock (under the candidate's value),
    renewed in the background until :meth:`resign`. Use it in a ``with``
    block, pass ``lease=leadership.lease`` (or ``token=leadership.epoch,
    lock=name``) with every write, and stop once :meth:`check` raises."""

    def __init__(self, lease: Lease, value: str) -> None:
        self.lease = lease
        self.name = lease.name
        self.value = value
        self.epoch = lease.token

    @property
    def lost(self) -> threading.Event:
        """Set once the leadership may be lost."""
        return self.lease.lost

    def check(self) -> None:
        """Raise LeaseLost if the leadership may be lost."""
        self.lease.check()

    def resign(self) -> None:
        """Give the leadership up: the next queued candidate leads at once.
        Resigning a leadership already lost (or resigned) does nothing."""
        self.lease.release()

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self.resign()

    def __repr__(self) -> str:
        return f"<fencekv.election.Leadership {self.name!r} value={self.value!r} epoch={self.epoch}>"


def _check(name: Bytes, value: Bytes, ttl: float, margin: float) -> None:
    if not _proto.as_name(name):
        raise errors.BadRequest("election name: empty", code="bad_request")
    v = _proto.as_name(value)
    if not v:
        raise errors.BadRequest("election value: empty; each candidate needs a value of its own "
                                "(its address, say)", code="bad_request")
    if len(v.encode("utf-8", "surrogateescape")) > MAX_VALUE:
        raise errors.TooLarge(f"election value: over {MAX_VALUE} bytes", code="too_large")
    if ttl <= 0:
        raise errors.BadRequest(f"election ttl {ttl}s: want above 0", code="bad_request")
    if not 0 <= margin < ttl:
        raise errors.BadRequest(f"election margin {margin}s: want 0 or more, shorter than the TTL",
                                code="bad_request")


def campaign(client: "Client", name: Bytes, value: Bytes, ttl: Duration = 10.0, *,
             margin: Optional[Duration] = None, wait: Duration = 60.0,
             timeout: Optional[Duration] = None) -> Leadership:
    """Block until this caller leads the election name with value (queueing
    first come, first served), and return the leadership. ``margin``
    (default min(ttl/3, 3s)) is how long before the lease may run out the
    leadership is taken as lost. ``timeout`` bounds the campaign (Timeout
    when it runs out; nothing is left held); None waits for good.

    An acquire whose answer was lost is looked up: a lock held under value
    is released (it has no send time to measure a deadline from) and the
    campaign goes on, so give each candidate its own value."""
    t = _proto.seconds(ttl)
    m = min(t / 3, 3.0) if margin is None else _proto.seconds(margin)
    _check(name, value, t, m)
    v = _proto.as_name(value)
    n = _proto.as_name(name)
    until = None if timeout is None else time.monotonic() + _proto.seconds(timeout)
    pause = 0.02
    while True:
        w = _proto.seconds(wait)
        if until is not None:
            left = until - time.monotonic()
            if left <= 0:
                raise errors.Timeout(f"campaign for {n!r}: not leading within {timeout}s")
            w = min(w, max(left, 0.001))
        lease = Lease(client, n, t, wait=w, margin=m, holder=v)
        try:
            lease.acquire()
            return Leadership(lease, v)
        except errors.LockHeld:
            pause = 0.02
            continue  # the wait ran out: queue again
        except errors.ClientClosed:
            raise
        except errors.Error as e:
            if _proto.unknown_outcome(e) or isinstance(e, errors.Timeout):
                try:
                    info = client.lock_info(n)
                    if info.held and info.holder == v:
                        client.release(n, info.token)
                except errors.Error:
                    pass  # a grant left behind runs out after its TTL
            elif not _proto.retryable(e):
                raise
        time.sleep(pause)
        pause = min(2 * pause, 1.0)


def _leader_of(name: str, info: Any) -> Leader:
    return Leader(name, info.held, info.holder if info.held else "", info.token, info.ttl)


def leader(client: "Client", name: Bytes) -> Leader:
    """Read the election's state once (lock_info). A lease run out whose
    expiry is not applied yet counts as leading, with ttl 0."""
    n = _proto.as_name(name)
    if not n:
        raise errors.BadRequest("election name: empty", code="bad_request")
    return _leader_of(n, client.lock_info(n))


class Observer:
    """The states of an election, as an iterator of :class:`Leader`: the
    current one first, then each change (PROTOCOL.md §12: a watch of the
    lock's events, and a lock_info after it started and after each event
    of that lock). Epochs only rise; leaders that come and go between two
    reads are coalesced; the latest state is always delivered. It goes on
    through reconnects. :meth:`close` (from any thread) ends it."""

    def __init__(self, client: "Client", name: Bytes) -> None:
        self.client = client
        self.name = _proto.as_name(name)
        if not self.name:
            raise errors.BadRequest("election name: empty", code="bad_request")
        self._closed = threading.Event()
        self._w: Optional["Watcher"] = client.watch(self.name, locks=True)
        self._first: Optional[Leader] = leader(client, self.name)

    def close(self) -> None:
        self._closed.set()
        w = self._w
        if w is not None:
            w.close()

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _read(self) -> Leader:
        pause = 0.02
        while True:
            try:
                return leader(self.client, self.name)
            except errors.Error as e:
                if isinstance(e, errors.ClientClosed) or self._closed.is_set():
                    raise
                if not (_proto.retryable(e) or isinstance(e, errors.Timeout)):
                    raise
            self._closed.wait(pause)
            pause = min(2 * pause, 1.0)

    def __iter__(self) -> Iterator[Leader]:
        last: Optional[Leader] = None
        top = 0

        def fresh(s: Leader) -> bool:
            nonlocal last, top
            if last is not None and (s.held, s.value, s.epoch) == (last.held, last.value, last.epoch):
                return False
            if s.held and top and s.epoch <= top:
                return False  # a stale answer
            last = s
            if s.held:
                top = s.epoch
            return True

        first, self._first = self._first, None
        if first is not None and fresh(first):
            yield first
        pause = 0.02
        while not self._closed.is_set():
            w = self._w
            try:
                if w is None:
                    w = self._w = self.client.watch(self.name, locks=True)
                    if self._closed.is_set():
                        w.close()
                        return
                    s = self._read()
                    if fresh(s):
                        yield s
                seen_reconnects = w.reconnects
                while not self._closed.is_set():
                    try:
                        batch = w.next_batch(0.2)
                    except StopIteration:
                        break  # closed
                    # The watch reconnected on its own (a restart, say): what
                    # changed in the gap may have no event, so read again.
                    again = w.reconnects != seen_reconnects
                    seen_reconnects = w.reconnects
                    if again or any(ev.lock == self.name and not ev.key for ev in batch):
                        s = self._read()
                        if fresh(s):
                            yield s
                    pause = 0.02
                if self._closed.is_set():
                    return
            except errors.Error:
                if self._closed.is_set():
                    return
            # The watch ended (compacted, or could not be made): start again.
            if w is not None:
                w.close()
            self._w = None
            self._closed.wait(pause)
            pause = min(2 * pause, 1.0)


def observe(client: "Client", name: Bytes) -> Observer:
    """The election's states as they change; see :class:`Observer`."""
    return Observer(client, name)
