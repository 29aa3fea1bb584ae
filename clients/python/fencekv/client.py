"""The thread-safe client of a fencekv server or cluster."""

from __future__ import annotations

import random
import socket
import ssl as _ssl
import threading
import time
from typing import (IO, Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple,
                    Union)

from . import _proto, errors
from ._conn import Call, Conn, NotSent
from .types import (BackupInfo, Bytes, Duration, Entry, Grant, LockInfo, Member, Refusal,
                    Status, TxnResult, WriteResult, entry_of, lock_info_of, member_of,
                    refusal_of, status_of, write_result_of)

__all__ = ["Client"]


class Client:
    """A client of a fencekv server, or of any nodes of a cluster.

    ``addrs`` is ``"host:port"``, a comma-separated string of them, or a
    list. The client connects to the first that answers (a node that
    accepts but does not answer within ``connect_timeout`` is passed over),
    and when its connection breaks, to the next. It is safe to use from
    many threads: their calls are pipelined on one connection and matched
    to their answers by msgid; a daemon thread reads the answers.

    ``timeout`` (seconds) bounds each call (an acquire: its wait and then
    this). ``ssl`` is an :class:`ssl.SSLContext` for a TLS server;
    ``user`` and ``secret`` authenticate every connection the client makes.

    A call whose answer is lost raises :class:`~fencekv.ConnectionLost`
    (or :class:`~fencekv.Timeout`) with ``outcome_unknown`` True for a
    write: it may or may not have been applied, and is never sent again by
    the client. A call that was never written is sent on a new connection.
    A read whose connection broke is sent again once, on a new connection.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(self, addrs: Union[str, Sequence[str]] = "127.0.0.1:7420", *,
                 timeout: float = 10.0, connect_timeout: float = 2.0,
                 ssl: Optional[_ssl.SSLContext] = None, user: Optional[str] = None,
                 secret: Optional[Union[str, bytes]] = None,
                 min_backoff: float = 0.05, max_backoff: float = 1.0) -> None:
        self.addrs: List[Tuple[str, int]] = _proto.parse_addrs(addrs)
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self._ssl = ssl
        self._user = user
        self._secret = secret
        self._min_backoff, self._max_backoff = min_backoff, max(max_backoff, min_backoff)
        self._dial_mu = threading.Lock()
        self._backoff = 0.0
        self._next_dial = 0.0
        self._dial_err: Optional[BaseException] = None
        self._closed = False
        self._closing = threading.Event()
        self.connects = 0  # connections made so far
        self._conn: Optional[Conn] = None
        self._conn = self._dial_round(0)

    # -- connections -----------------------------------------------------

    @property
    def addr(self) -> str:
        """The address of the server the client is (or was last) connected to."""
        c = self._conn
        return c.addr if c is not None else ""

    def _connection(self) -> Conn:
        c = self._conn
        if c is not None and c.usable():
            return c
        return self._reconnect()

    def _reconnect(self) -> Conn:
        with self._dial_mu:
            if self._closed:
                raise errors.ClientClosed("the client is closed")
            old = self._conn
            if old is not None and not old.dead:
                return old  # replaced meanwhile
            wait = self._next_dial - time.monotonic()
            if wait > 0:
                raise errors.ConnectionLost(
                    f"no server answered: {self._dial_err} (next attempt in {wait * 1000:.0f} ms)",
                    addr=self._addrs_str())
            first = 0
            if old is not None:
                for i, (h, p) in enumerate(self.addrs):
                    if f"{h}:{p}" == old.addr:
                        first = i + 1  # the next address first, the failed one last
                old.close(old.err)
            try:
                c = self._dial_round(first)
            except errors.ConnectionLost as e:
                self._backoff = min(max(2 * self._backoff, self._min_backoff), self._max_backoff)
                self._next_dial = time.monotonic() + self._backoff * (0.8 + 0.4 * random.random())
                self._dial_err = e
                raise
            self._backoff, self._next_dial, self._dial_err = 0.0, 0.0, None
            if self._closed:
                c.close()
                raise errors.ClientClosed("the client is closed")
            self._conn = c
            return c

    def _addrs_str(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.addrs)

    def _dial_round(self, first: int) -> Conn:
        problems = []
        n = len(self.addrs)
        for i in range(n):
            host, port = self.addrs[(first + i) % n]
            addr = f"{host}:{port}"
            try:
                return self._dial_one(host, port)
            except (errors.Unauthenticated, errors.PermissionDenied):
                raise  # refused credentials: every node would say the same
            except (OSError, errors.Error) as e:
                problems.append(f"{addr}: {e}")
        raise errors.ConnectionLost("no server answered: " + "; ".join(problems),
                                    addr=self._addrs_str())

    def _dial_one(self, host: str, port: int) -> Conn:
        addr = f"{host}:{port}"
        sock = socket.create_connection((host, port), timeout=self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ssl is not None:
                sock = self._ssl.wrap_socket(sock, server_hostname=host)
            sock.settimeout(None)
        except BaseException:
            sock.close()
            raise
        conn = Conn(sock, addr, self._late_grant)
        try:
            # Every connection says it is alive before calls go to it: a
            # stopped node's kernel still accepts connections, and a plain
            # client at a TLS server is told so here.
            try:
                self._call_on(conn, "ping", None, self.connect_timeout)
            except errors.Timeout:
                raise errors.ConnectionLost(f"{addr} accepted but did not answer a ping within "
                                            f"{self.connect_timeout:g}s", addr=addr) from None
            except errors.ConnectionLost as e:
                hint = "" if self._ssl is not None else " (a TLS server? pass ssl=)"
                raise errors.ConnectionLost(f"{e}{hint}", addr=addr) from None
            if self._user:
                self._call_on(conn, "auth", {"name": self._user, "secret": self._secret or b""},
                              max(self.timeout, 10.0))
        except BaseException:
            conn.close()
            raise
        self.connects += 1
        return conn

    def _call_on(self, conn: Conn, method: str, params: Optional[Dict[str, Any]],
                 timeout: float) -> Dict[str, Any]:
        call = Call(method, method not in _proto.READS)
        try:
            conn.start(call, method, params)
        except NotSent:
            raise conn.failure(call) from None
        if not call.wait(timeout):
            conn.abandon(call)
            raise errors.Timeout(f"{method} to {conn.addr}: no answer within {timeout:g}s",
                                 addr=conn.addr, outcome_unknown=call.effect)
        if call.error is not None:
            raise call.error
        return call.result

    def _late_grant(self, conn: Conn, result: Any, call: Call) -> None:
        """A grant arrived after its caller gave up: release it (not from the
        reader thread, which must go on reading)."""
        token = result.get("token") if isinstance(result, dict) else None
        if token and call.name is not None:
            threading.Thread(target=self._release_quietly, args=(call.name, token),
                             daemon=True).start()

    def _release_quietly(self, name: Bytes, token: int) -> None:
        try:
            self.release(name, token)
        except errors.Error:
            pass

    def _begin(self, method: str, params: Optional[Dict[str, Any]],
               callback: Any = None) -> Tuple[Conn, Call]:
        """Send a call (on a new connection if the current one is broken)."""
        call = Call(method, method not in _proto.READS, callback)
        for _ in range(len(self.addrs) + 2):
            conn = self._connection()
            try:
                conn.start(call, method, params)
                return conn, call
            except NotSent:
                continue  # nothing of it was written: send it on a new connection
        raise errors.ConnectionLost(f"{method}: the connection kept breaking before the call "
                                    "could be sent", addr=self._addrs_str())

    def _call(self, method: str, params: Optional[Dict[str, Any]] = None,
              timeout: Optional[float] = None, name: Any = None) -> Dict[str, Any]:
        if self._closed:
            raise errors.ClientClosed("the client is closed")
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        retried = False
        while True:
            conn, call = self._begin(method, params)
            call.name = name
            if not call.wait(deadline - time.monotonic()):
                conn.abandon(call, keep_acquire=name is not None)
                raise errors.Timeout(f"{method} to {conn.addr}: no answer within {timeout:g}s",
                                     addr=conn.addr, outcome_unknown=call.effect)
            err = call.error
            if err is None:
                return call.result
            if (isinstance(err, errors.ConnectionLost) and not call.effect and not retried
                    and time.monotonic() < deadline):
                retried = True  # a read is safe to send again
                continue
            raise err

    def _leave(self, conn: Conn, why: BaseException) -> None:
        """Make the next call go to the next address: conn's node did not
        answer a lock call in time, or could not serve it."""
        if len(self.addrs) > 1 and self._conn is conn:
            conn.fail(errors.ConnectionLost(f"left {conn.addr} for the next address: {why}",
                                            addr=conn.addr))

    def close(self) -> None:
        """Close the connection; calls in flight fail with ClientClosed."""
        with self._dial_mu:
            self._closed = True
            self._closing.set()
            c = self._conn
        if c is not None:
            c.close(errors.ClientClosed("the client was closed"))

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<fencekv.Client {self._addrs_str()}>"

    # -- the protocol's methods -------------------------------------------

    def call(self, method: str, params: Optional[Dict[str, Any]] = None,
             timeout: Optional[float] = None) -> Dict[str, Any]:
        """Send any method with named params; returns its result map."""
        return self._call(method, params, timeout)

    def ping(self) -> str:
        """The server's version."""
        return self._call("ping").get("version", "")

    def get(self, key: Bytes, *, consistency: Optional[str] = None) -> Entry:
        """Read key. A missing key is not an error: ``found`` is False."""
        p: Dict[str, Any] = {"key": _proto.data(key)}
        if consistency:
            p["consistency"] = consistency
        return entry_of(self._call("get", p), _proto.as_bytes(key))

    def put(self, key: Bytes, value: Bytes, *, token: int = 0, strict: bool = False,
            lock: Optional[Bytes] = None, lease: Any = None) -> WriteResult:
        """Write value to key, fenced by token (and held: lock), or by lease
        (its token and lock; raises LeaseLost if the lease may be lost)."""
        p = _proto.write_params(key, token, strict, lock, lease)
        p["value"] = _proto.data(value)
        return write_result_of(self._call("put", p))

    def delete(self, key: Bytes, *, token: int = 0, strict: bool = False,
               lock: Optional[Bytes] = None, lease: Any = None) -> WriteResult:
        """Delete key (its fence survives); ``deleted`` says if it was live."""
        return write_result_of(self._call("delete", _proto.write_params(key, token, strict, lock,
                                                                         lease)))

    def cas(self, key: Bytes, revision: int, value: Bytes, *, token: int = 0,
            strict: bool = False, lock: Optional[Bytes] = None, lease: Any = None) -> WriteResult:
        """Write value if key is at revision (0: absent), else CompareFailed."""
        p = _proto.write_params(key, token, strict, lock, lease)
        p["revision"] = revision
        p["value"] = _proto.data(value)
        return write_result_of(self._call("cas", p))

    def incr(self, key: Bytes, delta: int = 1, *, token: int = 0, strict: bool = False,
             lock: Optional[Bytes] = None, lease: Any = None) -> WriteResult:
        """Add delta to the decimal integer at key; ``value`` is the sum."""
        p = _proto.write_params(key, token, strict, lock, lease)
        p["delta"] = delta
        return write_result_of(self._call("incr", p))

    def txn(self, ops: Iterable[Any], *, compare: Optional[Iterable[Any]] = None,
            token: int = 0, strict: bool = False, lock: Optional[Bytes] = None,
            lease: Any = None) -> TxnResult:
        """Several writes, all or none, at one revision, if every compare holds.

        ``ops`` are tuples ``("put", key, value)``, ``("delete", key)``,
        ``("incr", key, delta)`` (or the protocol's maps); ``compare`` pairs
        ``(key, revision)``.
        """
        return _proto.txn_result(self._call("txn", _proto.txn_params(ops, compare, token, strict,
                                                                      lock, lease)))

    def scan_page(self, prefix: Optional[Bytes] = None, *, start: Optional[Bytes] = None,
                  limit: int = 0, consistency: Optional[str] = None) -> Tuple[List[Entry], bool]:
        """One page of live keys in byte order, and whether more follow."""
        r = self._call("scan", _proto.page_params(prefix, start, limit, consistency))
        return [entry_of(m) for m in r.get("items") or []], bool(r.get("more"))

    def scan(self, prefix: Optional[Bytes] = None, *, start: Optional[Bytes] = None,
             page_size: int = 0, consistency: Optional[str] = None) -> Iterator[Entry]:
        """Every live key under prefix, in byte order, fetched a page at a time
        (each page is a consistent snapshot; the pages together are not)."""
        while True:
            items, more = self.scan_page(prefix, start=start, limit=page_size,
                                         consistency=consistency)
            yield from items
            if not more or not items:
                return
            start = items[-1].key + b"\x00"

    def acquire(self, name: Bytes, ttl: Duration, *, wait: Duration = 0,
                holder: Optional[Bytes] = None, lock_delay: Duration = 0,
                limit: Optional[int] = None) -> Grant:
        """Take the lock for ttl, queueing up to wait if it is held.

        With ``limit`` N (2..256) the lock is a semaphore and the grant is
        one of its N permits, with a token of its own (PROTOCOL.md §5.2);
        LimitMismatch if the lock's permits are live under another limit.
        Raises LockHeld if it is not granted. A grant that arrives after the
        call timed out is released. For a lock kept alive and released for
        you, use :meth:`lock`.
        """
        p = _proto.acquire_params(name, ttl, wait, holder, lock_delay, limit)
        w = _proto.seconds(wait)
        until = time.monotonic() + w
        pause = 0.05
        while True:
            try:
                r = self._call("acquire", p, timeout=w + self.timeout, name=name)
                return Grant(_proto.as_name(name), r.get("token", 0), r.get("ttl_ms", 0) / 1000.0)
            except errors.Error as e:
                # A queued acquire its leader dropped, unapplied: queue again.
                left = until - time.monotonic() - pause
                if w <= 0 or not _proto.requeue(e) or left <= 0 or self._closing.wait(pause):
                    raise
                p["wait_ms"] = max(_proto.ms(left), 1)
                pause = min(2 * pause, 1.0)

    def renew(self, name: Bytes, token: int, *, timeout: Optional[float] = None) -> float:
        """Give the lease its full TTL again; returns the TTL in seconds."""
        r = self._call("renew", {"lock": _proto.data(name), "token": token}, timeout)
        return r.get("ttl_ms", 0) / 1000.0

    def release(self, name: Bytes, token: int, *, timeout: Optional[float] = None) -> None:
        """Free the lock held by token (no lock-delay)."""
        self._call("release", {"lock": _proto.data(name), "token": token}, timeout)

    def lock_info(self, name: Bytes, *, consistency: Optional[str] = None,
                  timeout: Optional[float] = None) -> LockInfo:
        p: Dict[str, Any] = {"lock": _proto.data(name)}
        if consistency:
            p["consistency"] = consistency
        return lock_info_of(self._call("lock_info", p, timeout), _proto.as_name(name))

    def locks_page(self, prefix: Optional[Bytes] = None, *, start: Optional[Bytes] = None,
                   limit: int = 0, consistency: Optional[str] = None
                   ) -> Tuple[List[LockInfo], bool]:
        r = self._call("locks", _proto.page_params(prefix, start, limit, consistency))
        return [lock_info_of(m) for m in r.get("locks") or []], bool(r.get("more"))

    def locks(self, prefix: Optional[Bytes] = None, *, start: Optional[Bytes] = None,
              page_size: int = 0, consistency: Optional[str] = None) -> Iterator[LockInfo]:
        """Every held lock under prefix, in byte order of name, paged."""
        while True:
            items, more = self.locks_page(prefix, start=start, limit=page_size,
                                          consistency=consistency)
            yield from items
            if not more or not items:
                return
            start = _proto.as_bytes(items[-1].lock) + b"\x00"

    def status(self) -> Status:
        return status_of(self._call("status"))

    def members(self) -> List[Member]:
        return [member_of(m) for m in self._call("members").get("members") or []]

    def term(self) -> int:
        return self._call("term").get("term", 0)

    def refusals_page(self, since: int = 0, limit: int = 0) -> Tuple[List[Refusal], int]:
        p: Dict[str, Any] = {}
        if since:
            p["since"] = since
        if limit:
            p["limit"] = limit
        r = self._call("refusals", p)
        return [refusal_of(m) for m in r.get("refusals") or []], r.get("last", 0)

    def refusals(self, since: int = 0, page_size: int = 1000) -> Iterator[Refusal]:
        """The fenced writes the server refused, oldest first, paged."""
        while True:
            items, _ = self.refusals_page(since, page_size)
            yield from items
            if len(items) < page_size:
                return
            since = items[-1].seq

    def auth(self, name: str, secret: Union[str, bytes]) -> str:
        """Authenticate the current connection (and every later one)."""
        self._user, self._secret = name, secret
        return self._call("auth", {"name": name, "secret": secret}).get("principal", "")

    def forwarding(self) -> None:
        """Mark the connection as a cluster node's forwarder (not for clients)."""
        self._connection().notify("forwarding", None)

    def backup(self, out: IO[bytes]) -> BackupInfo:
        """Copy the store into out (a complete bbolt data file), checked with
        its CRC-32C. The copy is read on the current connection; if that
        breaks, start again."""
        conn = self._connection()
        info = self._call_on(conn, "backup", None, max(self.timeout, 60.0))
        offset, crc = 0, 0
        while True:
            r = self._call_on(conn, "backup_read", {"offset": offset}, max(self.timeout, 60.0))
            chunk = r.get("data") or b""
            out.write(chunk)
            crc = _proto.crc32c(chunk, crc)
            offset += len(chunk)
            if r.get("done"):
                if r.get("crc32c") != crc:
                    raise errors.ProtocolError(f"backup: CRC-32C {crc:#x}, server says "
                                               f"{r.get('crc32c')!r}: discard the copy")
                return BackupInfo(size=info.get("size", offset), index=info.get("index", 0),
                                  last_token=info.get("last_token", 0),
                                  revision=info.get("revision", 0), crc32c=crc)
            if not chunk:
                raise errors.ProtocolError("backup: empty chunk before the end")

    # -- helpers -----------------------------------------------------------

    def lock(self, name: Bytes, ttl: Duration = 10.0, *, wait: Duration = 0,
             margin: Optional[Duration] = None, holder: Optional[Bytes] = None,
             lock_delay: Duration = 0, release_timeout: Duration = 5.0,
             limit: Optional[int] = None) -> "Lease":
        """A lease on name to use in a ``with`` block; see :class:`Lease`."""
        from .lock import Lease
        return Lease(self, name, ttl, wait=wait, margin=margin, holder=holder,
                     lock_delay=lock_delay, release_timeout=release_timeout, limit=limit)

    def watch(self, prefix: Optional[Bytes] = None, *, start_revision: int = 0,
              locks: bool = False) -> "Watcher":
        """An iterator of the changes under prefix; see :class:`Watcher`."""
        from .watch import Watcher
        return Watcher(self, prefix, start_revision=start_revision, locks=locks)


from .lock import Lease  # noqa: E402  (for the annotations)
from .watch import Watcher  # noqa: E402
