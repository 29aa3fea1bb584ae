"""fencekv for asyncio: the same API as :class:`fencekv.Client`, awaited.

    import fencekv.aio

    async with fencekv.aio.Client("127.0.0.1:7420") as client:
        async with client.lock("inventory", ttl=10, wait=5) as lease:
            await client.put("inventory/sku-1", b"41", lease=lease)

One connection per client, many calls in flight matched by msgid, a reader
task; reconnects over the addresses as the sync client does. Every method
is a coroutine; ``scan``, ``locks`` and ``refusals`` are async iterators,
``lock`` an async context manager, ``watch`` an async iterator.
"""

from __future__ import annotations

import asyncio
import random
import select
import socket
import ssl as _ssl
import time
from typing import (Any, AsyncIterator, Dict, Iterable, List, Optional, Sequence, Tuple,
                    Union)

from . import _proto, errors
from .types import (Bytes, Duration, Entry, Event, Grant, LockInfo, Member, Refusal, Status,
                    TxnResult, WriteResult, entry_of, lock_info_of, member_of, refusal_of,
                    status_of, write_result_of)

__all__ = ["Client", "Lease", "Watcher"]

#: A connection idle this long is checked, before a call goes out on it,
#: for a close by the server (a restarted server): with nothing in flight,
#: anything readable on it is an end.
PROBE_IDLE = 0.001


class _NotSent(Exception):
    pass


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 addr: str, tls: bool, client: "Client") -> None:
        self.reader, self.writer, self.addr, self.tls = reader, writer, addr, tls
        self.client = client
        self.pending: Dict[int, Tuple[asyncio.Future, bool, Any]] = {}
        self.abandoned: Dict[int, Any] = {}  # timed-out acquires: a late grant is released
        self.next_id = 0
        self.err: Optional[BaseException] = None
        self.used = time.monotonic()
        self.task = asyncio.ensure_future(self._read_loop())

    @property
    def dead(self) -> bool:
        return self.err is not None

    def start(self, method: str, params: Optional[Dict[str, Any]], name: Any = None
              ) -> Tuple[int, asyncio.Future]:
        if self.err is not None:
            raise _NotSent()
        msgid = self.next_id
        self.next_id = (msgid + 1) & 0xFFFFFFFF
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        self.pending[msgid] = (fut, method not in _proto.READS, name)
        self.used = time.monotonic()
        try:
            self.writer.write(_proto.pack_request(msgid, method, params))
        except (OSError, RuntimeError) as e:
            self.pending.pop(msgid, None)
            self.fail(e)
            raise _NotSent() from e
        return msgid, fut

    def abandon(self, msgid: int) -> None:
        entry = self.pending.pop(msgid, None)
        if entry is not None and entry[2] is not None:
            self.abandoned[msgid] = entry[2]

    def usable(self) -> bool:
        if self.err is not None or self.writer.is_closing():
            return False
        if time.monotonic() - self.used < PROBE_IDLE or self.pending or self.tls:
            return True
        # Idle a while: has the server closed it meanwhile? (Peek, not read.)
        sock = self.writer.get_extra_info("socket")
        if sock is None:
            return True
        try:
            r, _, _ = select.select([sock.fileno()], [], [], 0)
        except (OSError, ValueError):
            r = [True]
        if not r:
            return True
        try:
            dup = socket.socket(fileno=socket.dup(sock.fileno()))
        except OSError:
            return True
        try:
            b = dup.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError as e:
            self.fail(e)
            return False
        finally:
            dup.close()
        if b == b"":
            self.fail(ConnectionResetError("the server closed the connection"))
            return False
        return True

    async def _read_loop(self) -> None:
        unpacker = _proto.unpacker()
        try:
            while True:
                b = await self.reader.read(1 << 18)
                if not b:
                    self.fail(ConnectionResetError("the server closed the connection"))
                    return
                unpacker.feed(b)
                for msg in unpacker:
                    self._dispatch(msg)
        except asyncio.CancelledError:
            self.fail(errors.ClientClosed("closed"))
            raise
        except (OSError, _ssl.SSLError) as e:
            self.fail(e)
        except Exception as e:  # a malformed answer: an error, not a hang
            self.fail(errors.ProtocolError(f"malformed message from {self.addr}: {e}"))

    def _dispatch(self, msg: Any) -> None:
        if not isinstance(msg, list) or not msg:
            raise errors.ProtocolError(f"not a message: {msg!r}")
        if msg[0] == 1 and len(msg) == 4:
            _, msgid, err, result = msg
            entry = self.pending.pop(msgid, None)
            if entry is None:
                name = self.abandoned.pop(msgid, None)
                if name is not None and err is None and isinstance(result, dict):
                    asyncio.ensure_future(self.client._release_quietly(name, result.get("token")))
                return
            fut = entry[0]
            if fut.done():
                return
            if err is not None:
                fut.set_exception(errors.from_wire(err))
            elif not isinstance(result, dict):
                fut.set_exception(errors.ProtocolError("result is not a map"))
            else:
                fut.set_result(result)
        elif msg[0] == 2 and len(msg) == 3:
            if msg[1] == "error":
                p = msg[2]
                self.fail(errors.from_wire(p[0] if isinstance(p, list) and p else {}))
        else:
            raise errors.ProtocolError(f"unexpected message: {msg!r}"[:200])

    def fail(self, cause: BaseException) -> None:
        if self.err is not None:
            return
        self.err = cause
        pending, self.pending = self.pending, {}
        self.abandoned.clear()
        for fut, effect, _ in pending.values():
            if not fut.done():
                fut.set_exception(self.failure(effect))
        try:
            self.writer.close()
        except (OSError, RuntimeError):
            pass

    def failure(self, effect: bool) -> errors.Error:
        cause = self.err
        if isinstance(cause, errors.ClientClosed):
            return errors.ClientClosed("the client was closed")
        msg = f"connection to {self.addr} failed: {cause}"
        if effect:
            msg += " (the request was sent: it may or may not have been applied)"
        e = errors.ConnectionLost(msg, addr=self.addr, outcome_unknown=effect)
        e.__cause__ = cause
        return e

    async def close(self) -> None:
        self.fail(errors.ClientClosed("closed"))
        self.task.cancel()
        try:
            await self.task
        except (asyncio.CancelledError, Exception):
            pass


class Client:
    """The asyncio client; see :class:`fencekv.Client` for the semantics.

    It connects on ``async with``, :meth:`connect`, or its first call.
    """

    def __init__(self, addrs: Union[str, Sequence[str]] = "127.0.0.1:7420", *,
                 timeout: float = 10.0, connect_timeout: float = 2.0,
                 ssl: Optional[_ssl.SSLContext] = None, user: Optional[str] = None,
                 secret: Optional[Union[str, bytes]] = None,
                 min_backoff: float = 0.05, max_backoff: float = 1.0) -> None:
        self.addrs = _proto.parse_addrs(addrs)
        self.timeout = float(timeout)
        self.connect_timeout = float(connect_timeout)
        self._ssl, self._user, self._secret = ssl, user, secret
        self._min_backoff, self._max_backoff = min_backoff, max(max_backoff, min_backoff)
        self._backoff = 0.0
        self._next_dial = 0.0
        self._dial_err: Optional[BaseException] = None
        self._dial_lock: Optional[asyncio.Lock] = None
        self._conn: Optional[_Conn] = None
        self._closed = False
        self.connects = 0

    @property
    def addr(self) -> str:
        return self._conn.addr if self._conn is not None else ""

    @property
    def closed(self) -> bool:
        return self._closed

    def _addrs_str(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.addrs)

    async def connect(self) -> "Client":
        await self._connection()
        return self

    async def __aenter__(self) -> "Client":
        return await self.connect()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        c = self._conn
        if c is not None:
            await c.close()

    async def _connection(self) -> _Conn:
        c = self._conn
        if c is not None and c.usable():
            return c
        if self._dial_lock is None:
            self._dial_lock = asyncio.Lock()
        async with self._dial_lock:
            if self._closed:
                raise errors.ClientClosed("the client is closed")
            old = self._conn
            if old is not None and not old.dead:
                return old
            wait = self._next_dial - time.monotonic()
            if wait > 0:
                raise errors.ConnectionLost(
                    f"no server answered: {self._dial_err} (next attempt in {wait * 1000:.0f} ms)",
                    addr=self._addrs_str())
            first = 0
            if old is not None:
                for i, (h, p) in enumerate(self.addrs):
                    if f"{h}:{p}" == old.addr:
                        first = i + 1
                await old.close()
            try:
                c = await self._dial_round(first)
            except errors.ConnectionLost as e:
                self._backoff = min(max(2 * self._backoff, self._min_backoff), self._max_backoff)
                self._next_dial = time.monotonic() + self._backoff * (0.8 + 0.4 * random.random())
                self._dial_err = e
                raise
            self._backoff, self._next_dial, self._dial_err = 0.0, 0.0, None
            self._conn = c
            return c

    async def _dial_round(self, first: int) -> _Conn:
        problems = []
        n = len(self.addrs)
        for i in range(n):
            host, port = self.addrs[(first + i) % n]
            try:
                return await self._dial_one(host, port)
            except (errors.Unauthenticated, errors.PermissionDenied):
                raise
            except (OSError, asyncio.TimeoutError, errors.Error) as e:
                problems.append(f"{host}:{port}: {e or type(e).__name__}")
        raise errors.ConnectionLost("no server answered: " + "; ".join(problems),
                                    addr=self._addrs_str())

    async def _dial_one(self, host: str, port: int) -> _Conn:
        addr = f"{host}:{port}"
        r, w = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=self._ssl,
                                    server_hostname=host if self._ssl else None,
                                    limit=_proto.MAX_BUFFER),
            self.connect_timeout)
        sock = w.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(r, w, addr, self._ssl is not None, self)
        try:
            try:
                try:
                    await self._call_on(conn, "ping", None, self.connect_timeout)
                except _NotSent:
                    raise conn.failure(False) from None
            except errors.Timeout:
                raise errors.ConnectionLost(f"{addr} accepted but did not answer a ping within "
                                            f"{self.connect_timeout:g}s", addr=addr) from None
            except errors.ConnectionLost as e:
                hint = "" if self._ssl is not None else " (a TLS server? pass ssl=)"
                raise errors.ConnectionLost(f"{e}{hint}", addr=addr) from None
            if self._user:
                try:
                    await self._call_on(conn, "auth",
                                        {"name": self._user, "secret": self._secret or b""},
                                        max(self.timeout, 10.0))
                except _NotSent:
                    raise conn.failure(False) from None
        except BaseException:
            await conn.close()
            raise
        self.connects += 1
        return conn

    async def _call_on(self, conn: _Conn, method: str, params: Optional[Dict[str, Any]],
                       timeout: float, name: Any = None) -> Dict[str, Any]:
        """One call on conn; raises _NotSent if nothing of it was written."""
        msgid, fut = conn.start(method, params, name)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout)
        except asyncio.TimeoutError:
            conn.abandon(msgid)
            raise errors.Timeout(f"{method} to {conn.addr}: no answer within {timeout:g}s",
                                 addr=conn.addr,
                                 outcome_unknown=method not in _proto.READS) from None
        except asyncio.CancelledError:
            conn.abandon(msgid)
            raise

    async def _call(self, method: str, params: Optional[Dict[str, Any]] = None,
                    timeout: Optional[float] = None, name: Any = None) -> Dict[str, Any]:
        if self._closed:
            raise errors.ClientClosed("the client is closed")
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        retried = False
        for _ in range(len(self.addrs) + 3):
            conn = await self._connection()
            try:
                return await self._call_on(conn, method, params,
                                           max(deadline - time.monotonic(), 0), name)
            except _NotSent:
                continue  # nothing of it was written: send it on a new connection
            except errors.ConnectionLost as e:
                if (isinstance(e, errors.Timeout) or e.outcome_unknown or retried
                        or method not in _proto.READS or time.monotonic() >= deadline):
                    raise
                retried = True  # a read is safe to send again
        raise errors.ConnectionLost(f"{method}: the connection kept breaking before the call "
                                    "could be sent", addr=self._addrs_str())

    async def _release_quietly(self, name: Any, token: Any) -> None:
        if token:
            try:
                await self.release(name, token)
            except errors.Error:
                pass

    def _leave(self, conn: Optional[_Conn], why: BaseException) -> None:
        if conn is not None and len(self.addrs) > 1 and self._conn is conn:
            conn.fail(errors.ConnectionLost(f"left {conn.addr} for the next address: {why}",
                                            addr=conn.addr))

    # -- the protocol's methods -----------------------------------------------

    async def call(self, method: str, params: Optional[Dict[str, Any]] = None,
                   timeout: Optional[float] = None) -> Dict[str, Any]:
        return await self._call(method, params, timeout)

    async def ping(self) -> str:
        return (await self._call("ping")).get("version", "")

    async def get(self, key: Bytes, *, consistency: Optional[str] = None) -> Entry:
        p: Dict[str, Any] = {"key": _proto.data(key)}
        if consistency:
            p["consistency"] = consistency
        return entry_of(await self._call("get", p), _proto.as_bytes(key))

    async def put(self, key: Bytes, value: Bytes, *, token: int = 0, strict: bool = False,
                  lock: Optional[Bytes] = None, lease: Any = None) -> WriteResult:
        p = _proto.write_params(key, token, strict, lock, lease)
        p["value"] = _proto.data(value)
        return write_result_of(await self._call("put", p))

    async def delete(self, key: Bytes, *, token: int = 0, strict: bool = False,
                     lock: Optional[Bytes] = None, lease: Any = None) -> WriteResult:
        return write_result_of(await self._call("delete", _proto.write_params(
            key, token, strict, lock, lease)))

    async def cas(self, key: Bytes, revision: int, value: Bytes, *, token: int = 0,
                  strict: bool = False, lock: Optional[Bytes] = None,
                  lease: Any = None) -> WriteResult:
        p = _proto.write_params(key, token, strict, lock, lease)
        p["revision"] = revision
        p["value"] = _proto.data(value)
        return write_result_of(await self._call("cas", p))

    async def incr(self, key: Bytes, delta: int = 1, *, token: int = 0, strict: bool = False,
                   lock: Optional[Bytes] = None, lease: Any = None) -> WriteResult:
        p = _proto.write_params(key, token, strict, lock, lease)
        p["delta"] = delta
        return write_result_of(await self._call("incr", p))

    async def txn(self, ops: Iterable[Any], *, compare: Optional[Iterable[Any]] = None,
                  token: int = 0, strict: bool = False, lock: Optional[Bytes] = None,
                  lease: Any = None) -> TxnResult:
        return _proto.txn_result(await self._call("txn", _proto.txn_params(
            ops, compare, token, strict, lock, lease)))

    async def scan_page(self, prefix: Optional[Bytes] = None, *, start: Optional[Bytes] = None,
                        limit: int = 0, consistency: Optional[str] = None
                        ) -> Tuple[List[Entry], bool]:
        r = await self._call("scan", _proto.page_params(prefix, start, limit, consistency))
        return [entry_of(m) for m in r.get("items") or []], bool(r.get("more"))

    async def scan(self, prefix: Optional[Bytes] = None, *, start: Optional[Bytes] = None,
                   page_size: int = 0, consistency: Optional[str] = None
                   ) -> AsyncIterator[Entry]:
        while True:
            items, more = await self.scan_page(prefix, start=start, limit=page_size,
                                               consistency=consistency)
            for e in items:
                yield e
            if not more or not items:
                return
            start = items[-1].key + b"\x00"

    async def acquire(self, name: Bytes, ttl: Duration, *, wait: Duration = 0,
                      holder: Optional[Bytes] = None, lock_delay: Duration = 0,
                      limit: Optional[int] = None) -> Grant:
        p = _proto.acquire_params(name, ttl, wait, holder, lock_delay, limit)
        w = _proto.seconds(wait)
        until = time.monotonic() + w
        pause = 0.05
        while True:
            try:
                r = await self._call("acquire", p, timeout=w + self.timeout, name=name)
                return Grant(_proto.as_name(name), r.get("token", 0), r.get("ttl_ms", 0) / 1000.0)
            except errors.Error as e:
                left = until - time.monotonic() - pause
                if w <= 0 or not _proto.requeue(e) or left <= 0 or self._closed:
                    raise
                await asyncio.sleep(pause)
                p["wait_ms"] = max(_proto.ms(left), 1)
                pause = min(2 * pause, 1.0)

    async def renew(self, name: Bytes, token: int, *, timeout: Optional[float] = None) -> float:
        r = await self._call("renew", {"lock": _proto.data(name), "token": token}, timeout)
        return r.get("ttl_ms", 0) / 1000.0

    async def release(self, name: Bytes, token: int, *, timeout: Optional[float] = None) -> None:
        await self._call("release", {"lock": _proto.data(name), "token": token}, timeout)

    async def lock_info(self, name: Bytes, *, consistency: Optional[str] = None,
                        timeout: Optional[float] = None) -> LockInfo:
        p: Dict[str, Any] = {"lock": _proto.data(name)}
        if consistency:
            p["consistency"] = consistency
        return lock_info_of(await self._call("lock_info", p, timeout), _proto.as_name(name))

    async def locks(self, prefix: Optional[Bytes] = None, *, start: Optional[Bytes] = None,
                    page_size: int = 0, consistency: Optional[str] = None
                    ) -> AsyncIterator[LockInfo]:
        while True:
            r = await self._call("locks", _proto.page_params(prefix, start, page_size,
                                                             consistency))
            items = [lock_info_of(m) for m in r.get("locks") or []]
            for i in items:
                yield i
            if not r.get("more") or not items:
                return
            start = _proto.as_bytes(items[-1].lock) + b"\x00"

    async def status(self) -> Status:
        return status_of(await self._call("status"))

    async def members(self) -> List[Member]:
        return [member_of(m) for m in (await self._call("members")).get("members") or []]

    async def term(self) -> int:
        return (await self._call("term")).get("term", 0)

    async def refusals(self, since: int = 0, page_size: int = 1000) -> AsyncIterator[Refusal]:
        while True:
            r = await self._call("refusals", {"since": since, "limit": page_size})
            items = [refusal_of(m) for m in r.get("refusals") or []]
            for i in items:
                yield i
            if len(items) < page_size:
                return
            since = items[-1].seq

    async def auth(self, name: str, secret: Union[str, bytes]) -> str:
        self._user, self._secret = name, secret
        return (await self._call("auth", {"name": name, "secret": secret})).get("principal", "")

    def lock(self, name: Bytes, ttl: Duration = 10.0, *, wait: Duration = 0,
             margin: Optional[Duration] = None, holder: Optional[Bytes] = None,
             lock_delay: Duration = 0, release_timeout: Duration = 5.0,
             limit: Optional[int] = None) -> "Lease":
        """A lease on name for ``async with``; see :class:`fencekv.Lease`."""
        return Lease(self, name, ttl, wait=wait, margin=margin, holder=holder,
                     lock_delay=lock_delay, release_timeout=release_timeout, limit=limit)

    def watch(self, prefix: Optional[Bytes] = None, *, start_revision: int = 0,
              locks: bool = False) -> "Watcher":
        """An async iterator of changes (connects on first use, or
        ``async with``); see :class:`fencekv.Watcher`."""
        return Watcher(self, prefix, start_revision=start_revision, locks=locks)


class Lease:
    """A lock held while an ``async with`` block runs; see :class:`fencekv.Lease`.

    ``lost`` is an :class:`asyncio.Event`, set once the lease may be lost.
    """

    def __init__(self, client: Client, name: Bytes, ttl: Duration, *, wait: Duration = 0,
                 margin: Optional[Duration] = None, holder: Optional[Bytes] = None,
                 lock_delay: Duration = 0, release_timeout: Duration = 5.0,
                 limit: Optional[int] = None) -> None:
        self.client = client
        self.name = _proto.as_name(name)
        self.ttl = _proto.seconds(ttl)
        self.margin = self.ttl / 10 if margin is None else _proto.seconds(margin)
        if not 0 <= self.margin < self.ttl:
            raise ValueError(f"margin {self.margin}s: want 0 or more, and less than the TTL")
        self.wait = _proto.seconds(wait)
        self.lock_delay = lock_delay
        self.limit = limit  # a semaphore's permits: this lease is one of them
        self.release_timeout = _proto.seconds(release_timeout)
        self._ours = holder is None
        self.holder = _proto.unique_holder() if holder is None else _proto.as_name(holder)
        self.period = (self.ttl - self.margin) / 3
        self.token = 0
        self.found = False
        self.lost = asyncio.Event()
        self.lost_reason: Optional[errors.Error] = None
        self._refused = False
        self._deadline = 0.0
        self._held = False
        self._task: Optional[asyncio.Task] = None

    @property
    def deadline(self) -> float:
        return self._deadline

    def check(self) -> None:
        if not self.lost.is_set() and self._held and time.monotonic() >= self._deadline:
            self._lose(errors.LeaseLost(f"no renew of {self.name!r} (token {self.token}) "
                                        f"succeeded within {self.ttl - self.margin:g}s"))
        if self.lost.is_set():
            raise self.lost_reason or errors.LeaseLost("lease lost")
        if not self._held:
            raise errors.LeaseLost(f"lock {self.name!r} is not held")

    def _lose(self, why: errors.Error) -> None:
        if not self.lost.is_set():
            self.lost_reason = why
            self.lost.set()

    async def __aenter__(self) -> "Lease":
        c = self.client
        sent = time.monotonic()
        try:
            g = await c.acquire(self.name, self.ttl, wait=self.wait, holder=self.holder,
                                lock_delay=self.lock_delay, limit=self.limit)
            token = g.token
        except errors.Error as e:
            if not (self._ours and _proto.unknown_outcome(e)):
                raise
            token = await self._find_grant(e)
            self.found = True
        self.token = token
        if self.wait > 0 or self.found:
            sent = time.monotonic()
            try:
                await c.renew(self.name, token, timeout=self.period)
            except errors.Error:
                await self._release_retrying()
                raise
        self._deadline = sent + self.ttl - self.margin
        self._held = True
        self._task = asyncio.ensure_future(self._keep())
        return self

    async def _find_grant(self, err: errors.Error) -> int:
        until = time.monotonic() + self.release_timeout
        pause = 0.02
        while True:
            try:
                info = await self.client.lock_info(self.name, timeout=self.release_timeout / 3)
                break
            except errors.Error as e:
                if not _proto.retryable(e) or time.monotonic() + pause >= until:
                    raise err from None
                await asyncio.sleep(pause)
                pause = min(2 * pause, 0.5)
        token = info.token_of(self.holder)  # a semaphore's permits too
        if token:
            return token
        raise err

    async def _keep(self) -> None:
        c = self.client
        keep = self.ttl - self.margin
        every = self.period
        next_at = self._deadline - keep + every
        last: Optional[BaseException] = None
        while True:
            now = time.monotonic()
            if now >= self._deadline:
                self._lose(errors.LeaseLost(
                    f"no renew of {self.name!r} (token {self.token}) succeeded within "
                    f"{keep:g}s of its TTL of {self.ttl:g}s" + (f" (last: {last})" if last else "")))
                return
            if now < next_at:
                await asyncio.sleep(min(next_at, self._deadline) - now)
                continue
            if c.closed:
                self._lose(errors.LeaseLost(f"no renew of {self.name!r} can be sent: the client "
                                            "is closed"))
                return
            sent = time.monotonic()
            conn = c._conn
            try:
                await c.renew(self.name, self.token,
                              timeout=max(min(sent + every, self._deadline) - sent, 0.001))
            except (errors.NotHolder, errors.LeaseExpired) as e:
                self._refused = True
                lost = errors.LeaseLost(f"renew of {self.name!r} (token {self.token}) refused: {e}")
                lost.__cause__ = e
                self._lose(lost)
                return
            except errors.Timeout as e:
                last = e
                c._leave(conn, e)
                next_at = time.monotonic()
                continue
            except errors.Error as e:
                last = e
                if _proto.retryable(e):
                    c._leave(conn, e)
                next_at = time.monotonic() + every / 4
                continue
            last = None
            self._deadline = max(self._deadline, sent + keep)
            next_at = sent + every

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        lost = await self.release()
        if lost is not None and exc is None:
            raise lost

    async def release(self) -> Optional[errors.Error]:
        if not self._held:
            return None
        self._held = False
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        lost = self.lost_reason if self.lost.is_set() else None
        if not self._refused and not self.client.closed:
            err = await self._release_retrying()
            if (err is not None and lost is None
                    and not isinstance(err, (errors.NotHolder, errors.LeaseExpired))):
                raise err
        return lost

    async def _release_retrying(self) -> Optional[errors.Error]:
        until = time.monotonic() + self.release_timeout
        pause = 0.02
        while True:
            try:
                await self.client.release(self.name, self.token,
                                          timeout=max(self.release_timeout / 3, 0.1))
                return None
            except errors.ClientClosed as e:
                return e
            except errors.Error as e:
                if not _proto.retryable(e) or time.monotonic() + pause >= until:
                    return e
                await asyncio.sleep(pause)
                pause = min(2 * pause, 0.5)


class Watcher:
    """The changes under a prefix, as an async iterator; see
    :class:`fencekv.Watcher` (the same resume rules)."""

    def __init__(self, client: Client, prefix: Optional[Bytes] = None, *,
                 start_revision: int = 0, locks: bool = False) -> None:
        self.client, self.prefix, self.locks = client, prefix, locks
        self._start = start_revision
        self._resume = _proto.WatchResume(start_revision)
        self._reader: Optional[asyncio.StreamReader] = None
        self._writer: Optional[asyncio.StreamWriter] = None
        self._unpacker: Any = None
        self._buf: List[Event] = []
        self._next_addr = 0
        self._closed = False
        self.reconnects = 0

    @property
    def revision(self) -> int:
        return self._resume.last_rev

    async def __aenter__(self) -> "Watcher":
        if self._reader is None:
            await self._connect(self._start)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        self._closed = True
        if self._writer is not None:
            self._writer.close()

    async def _request(self, msgid: int, method: str, params: Any) -> Any:
        assert self._writer is not None and self._reader is not None
        self._writer.write(_proto.pack_request(msgid, method, params))
        while True:
            for msg in self._unpacker:
                if isinstance(msg, list) and len(msg) == 4 and msg[0] == 1 and msg[1] == msgid:
                    if msg[2] is not None:
                        raise errors.from_wire(msg[2])
                    return _proto.result_map(msg[3], method)
            b = await self._reader.read(1 << 16)
            if not b:
                raise ConnectionResetError("the server closed the connection")
            self._unpacker.feed(b)

    async def _connect(self, start: int) -> None:
        c = self.client
        n = len(c.addrs)
        problems = []
        for i in range(n):
            host, port = c.addrs[(self._next_addr + i) % n]
            within = c.connect_timeout if n > 1 and not c._user else max(c.timeout, 10.0)
            try:
                self._reader, self._writer = await asyncio.wait_for(asyncio.open_connection(
                    host, port, ssl=c._ssl, server_hostname=host if c._ssl else None,
                    limit=_proto.MAX_BUFFER), c.connect_timeout)
                self._unpacker = _proto.unpacker()

                async def handshake() -> Any:
                    nonlocal start
                    if c._user:
                        await self._request(0, "auth", {"name": c._user,
                                                        "secret": c._secret or b""})
                    while True:
                        try:
                            return await self._request(1, "watch", _proto.watch_params(
                                self.prefix, self.locks, start))
                        except errors.Compacted as e:
                            if not self._resume.after_restart(e.revision):
                                raise
                            start = self._resume.resume_from()

                r = await asyncio.wait_for(handshake(), within)
            except (errors.LimitExceeded, errors.Unavailable, OSError,
                    asyncio.TimeoutError) as e:
                if self._writer is not None:
                    self._writer.close()
                problems.append(f"{host}:{port}: {e or type(e).__name__}")
                continue
            except BaseException:
                if self._writer is not None:
                    self._writer.close()
                raise
            self._resume.started_at(r.get("revision", 0))
            self._resume.begin(start)
            self._next_addr = (self._next_addr + i) % n
            return
        self._next_addr += 1
        raise errors.ConnectionLost("watch: no server answered: " + "; ".join(problems),
                                    addr=c._addrs_str())

    def __aiter__(self) -> "Watcher":
        return self

    async def __anext__(self) -> Event:
        if self._reader is None and not self._closed:
            await self._connect(self._start)
        while not self._buf:
            if self._closed:
                raise StopAsyncIteration
            try:
                for msg in self._unpacker:
                    if not (isinstance(msg, list) and len(msg) == 3 and msg[0] == 2):
                        continue
                    p = msg[2][0] if isinstance(msg[2], list) and msg[2] else {}
                    if msg[1] == "watch":
                        self._buf.extend(self._resume.events(p.get("events") or []))
                    elif msg[1] in ("watch_cancelled", "error"):
                        raise ConnectionResetError(f"watch cancelled: {p}")
                    if self._buf:
                        break
                if self._buf:
                    break
                assert self._reader is not None
                b = await self._reader.read(1 << 18)
                if not b:
                    raise ConnectionResetError("the server closed the connection")
                self._unpacker.feed(b)
            except (OSError, ValueError):
                if self._closed:
                    raise StopAsyncIteration from None
                await self._reconnect()
        return self._buf.pop(0)

    async def _reconnect(self) -> None:
        if self._writer is not None:
            self._writer.close()
        backoff = 0.05
        while True:
            await asyncio.sleep(backoff)
            if self._closed:
                raise StopAsyncIteration
            backoff = min(2 * backoff, 2.0)
            try:
                await self._connect(self._resume.resume_from())
                self.reconnects += 1
                return
            except errors.ConnectionLost:
                continue
