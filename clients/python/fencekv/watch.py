"""Watches: an iterator of changes that resumes with no gap and no repeat."""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator, List, Optional

from . import _proto, errors
from .types import Bytes, Event

if TYPE_CHECKING:
    from .client import Client

__all__ = ["Watcher"]


class Watcher:
    """The changes under a prefix, as an iterator of :class:`~fencekv.Event`::

        with client.watch("inventory/", start_revision=rev + 1) as w:
            for ev in w:
                ...

    The watch has a connection of its own (made by the constructor, which
    raises a refusal such as Compacted). When the connection drops, or the
    server cancels the watch because this side fell behind, it reconnects
    (over the client's addresses, with backoff) and resumes from the last
    revision delivered, skipping the events of it already delivered: every
    change comes once, in revision order, with no gap. If the server no
    longer keeps the revision to resume from, iterating raises
    :class:`~fencekv.Compacted` (watch again from now, after re-reading the
    state). A restarted server keeps no history, but a watch that had
    delivered everything up to the server's state resumes there.

    :meth:`close` (from any thread) ends the iteration.
    """

    def __init__(self, client: "Client", prefix: Optional[Bytes] = None, *,
                 start_revision: int = 0, locks: bool = False) -> None:
        self.client = client
        self.prefix = prefix
        self.locks = locks
        self._resume = _proto.WatchResume(start_revision)
        self._closed = threading.Event()
        self._sock: Optional[socket.socket] = None
        self._unpacker: Any = None
        self._buf: List[Event] = []
        self._next_addr = 0
        self.reconnects = 0
        self._connect(start_revision, first=True)

    @property
    def revision(self) -> int:
        """The revision of the last event delivered (or where the watch began)."""
        return self._resume.last_rev

    def _connect(self, start: int, first: bool = False) -> None:
        c = self.client
        n = len(c.addrs)
        problems = []
        for i in range(n):
            host, port = c.addrs[(self._next_addr + i) % n]
            try:
                sock = socket.create_connection((host, port), timeout=c.connect_timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if c._ssl is not None:
                    sock = c._ssl.wrap_socket(sock, server_hostname=host)
            except OSError as e:
                problems.append(f"{host}:{port}: {e}")
                continue
            try:
                unpacker = _proto.unpacker()
                within = c.connect_timeout if n > 1 and not c._user else max(c.timeout, 10.0)
                sock.settimeout(within)
                if c._user:
                    self._request(sock, unpacker, 0, "auth",
                                  {"name": c._user, "secret": c._secret or b""})
                while True:
                    try:
                        r = self._request(sock, unpacker, 1, "watch",
                                          _proto.watch_params(self.prefix, self.locks, start))
                        break
                    except errors.Compacted as e:
                        if not self._resume.after_restart(e.revision):
                            raise
                        start = self._resume.resume_from()
                sock.settimeout(None)
            except (errors.LimitExceeded, errors.Unavailable, OSError) as e:
                sock.close()
                problems.append(f"{host}:{port}: {e}")
                continue  # this node's own trouble: another may take the watch
            except BaseException:
                sock.close()
                raise
            self._resume.started_at(r.get("revision", 0))
            self._resume.begin(start)
            self._sock, self._unpacker = sock, unpacker
            self._next_addr = (self._next_addr + i) % n
            return
        self._next_addr += 1
        raise errors.ConnectionLost("watch: no server answered: " + "; ".join(problems),
                                    addr=c._addrs_str())

    @staticmethod
    def _request(sock: socket.socket, unpacker: Any, msgid: int, method: str,
                 params: Any) -> Any:
        sock.sendall(_proto.pack_request(msgid, method, params))
        while True:
            for msg in unpacker:
                if isinstance(msg, list) and len(msg) == 4 and msg[0] == 1 and msg[1] == msgid:
                    if msg[2] is not None:
                        raise errors.from_wire(msg[2])
                    return _proto.result_map(msg[3], method)
                if isinstance(msg, list) and len(msg) == 3 and msg[0] == 2 and msg[1] == "error":
                    p = msg[2]
                    raise errors.from_wire(p[0] if isinstance(p, list) and p else {})
            b = sock.recv(1 << 16)
            if not b:
                raise ConnectionResetError("the server closed the connection")
            unpacker.feed(b)

    def __iter__(self) -> Iterator[Event]:
        return self

    def __next__(self) -> Event:
        while not self._buf:
            self._fill()
        return self._buf.pop(0)

    def next_batch(self, timeout: Optional[float] = None) -> List[Event]:
        """The next events (all that came in one notification); an empty list
        if none came within timeout."""
        if not self._buf:
            self._fill(timeout)
        out, self._buf = self._buf, []
        return out

    def _fill(self, timeout: Optional[float] = None) -> None:
        until = None if timeout is None else time.monotonic() + timeout
        while not self._buf:
            if self._closed.is_set():
                raise StopIteration
            sock = self._sock
            try:
                if sock is None:
                    raise ConnectionResetError("not connected")
                for msg in self._unpacker:
                    if self._handle(msg):
                        return
                if until is not None:
                    left = until - time.monotonic()
                    if left <= 0:
                        return
                    r, _, _ = select.select([sock], [], [], left)
                    if not r:
                        return
                b = sock.recv(1 << 18)
                if not b:
                    raise ConnectionResetError("the server closed the connection")
                self._unpacker.feed(b)
            except (OSError, ValueError, _Cancelled) as e:
                if self._closed.is_set():
                    raise StopIteration from None
                self._reconnect(e)

    def _handle(self, msg: Any) -> bool:
        if not (isinstance(msg, list) and len(msg) == 3 and msg[0] == 2):
            return False  # a response: none is expected here
        method, params = msg[1], msg[2]
        p = params[0] if isinstance(params, list) and params else {}
        if method == "watch":
            self._buf.extend(self._resume.events(p.get("events") or []))
            return bool(self._buf)
        if method in ("watch_cancelled", "error"):
            raise _Cancelled(str(p.get("reason") or p.get("message") or method))
        return False

    def _reconnect(self, why: BaseException) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
            self._sock = None
        backoff = 0.05
        while True:
            if self._closed.wait(backoff):
                raise StopIteration
            backoff = min(2 * backoff, 2.0)
            try:
                self._connect(self._resume.resume_from())
                self.reconnects += 1
                return
            except errors.ConnectionLost:
                continue

    def close(self) -> None:
        """End the watch (iteration stops); safe from any thread."""
        self._closed.set()
        s = self._sock
        if s is not None:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self) -> "Watcher":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
        if self._sock is not None:
            self._sock.close()


class _Cancelled(Exception):
    """The server cancelled the watch (this side fell behind): resume."""
