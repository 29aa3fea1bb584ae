"""One connection of the sync client: pipelined calls and a reader thread."""

from __future__ import annotations

import select
import socket
import ssl as _ssl
import threading
import time
from typing import Any, Callable, Dict, Optional

from . import _proto, errors

#: How long a connection must have been idle before a call checks, without
#: reading, that the server has not closed it meanwhile (as a restarted
#: server has): one select(2) call, and a peek if it is readable.
PROBE_IDLE = 0.001

_MSG_PEEK_FLAGS = socket.MSG_PEEK | getattr(socket, "MSG_DONTWAIT", 0)


class NotSent(Exception):
    """The connection failed before any byte of the call was written."""


class Call:
    """A request waiting for its answer.

    The reader thread sets result or error, then releases ``_done``, on
    which the caller waits (the cheapest wait-and-wake CPython has).
    """

    __slots__ = ("_done", "finished", "result", "error", "effect", "method", "callback", "name")

    def __init__(self, method: str, effect: bool,
                 callback: Optional[Callable[[], None]] = None) -> None:
        self._done = threading.Lock()
        self._done.acquire()
        self.finished = False
        self.result: Any = None
        self.error: Optional[errors.Error] = None
        self.effect = effect
        self.method = method
        self.callback = callback
        self.name: Any = None  # an acquire's lock name, to release a late grant

    def finish(self, result: Any, error: Optional[errors.Error]) -> None:
        self.result, self.error = result, error
        self.finished = True
        self._done.release()
        cb = self.callback
        if cb is not None:
            cb()

    def wait(self, timeout: Optional[float]) -> bool:
        if self.finished:
            return True
        if timeout is None:
            return self._done.acquire()
        return self._done.acquire(timeout=max(timeout, 0))


class Conn:
    """A connection to one server. Many calls in flight, matched by msgid;
    one daemon thread reads the answers and completes their calls."""

    def __init__(self, sock: socket.socket, addr: str,
                 on_late_grant: Optional[Callable[["Conn", Any, Call], None]] = None) -> None:
        self.sock = sock
        self.addr = addr
        self.tls = isinstance(sock, _ssl.SSLSocket)
        self._mu = threading.Lock()  # guards pending, next_id, err
        # OpenSSL does not allow a read and a write on one connection at
        # once: under TLS the socket is non-blocking and every SSL call is
        # made holding _tls (waits for readiness are made without it).
        self._tls = threading.Lock()
        if self.tls:
            sock.setblocking(False)
        self._wmu = threading.Lock()  # orders whole messages on the socket
        self.pending: Dict[int, Call] = {}
        self._abandoned: Dict[int, Call] = {}  # timed-out acquires: a late grant is released
        self._next_id = 0
        self.err: Optional[BaseException] = None
        self.used = time.monotonic()
        self._on_late_grant = on_late_grant
        self._reader = threading.Thread(target=self._read_loop, name=f"fencekv-reader {addr}",
                                        daemon=True)
        self._reader.start()

    @property
    def dead(self) -> bool:
        return self.err is not None

    # -- sending ---------------------------------------------------------

    def start(self, call: Call, method: str, params: Optional[Dict[str, Any]]) -> None:
        """Register call and send its request. Raises NotSent if nothing of
        it was written; if part was, the call fails with the connection."""
        with self._mu:
            if self.err is not None:
                raise NotSent()
            msgid = self._next_id
            self._next_id = (msgid + 1) & 0xFFFFFFFF
            while self._next_id in self.pending or self._next_id in self._abandoned:
                self._next_id = (self._next_id + 1) & 0xFFFFFFFF
            self.pending[msgid] = call
        msg = _proto.pack_request(msgid, method, params)
        self.used = time.monotonic()
        self._send(msg, msgid)

    def notify(self, method: str, params: Optional[Dict[str, Any]]) -> None:
        if self.err is not None:
            raise NotSent()
        self._send(_proto.pack_notification(method, params), None)

    def _send(self, msg: bytes, msgid: Optional[int]) -> None:
        sent = 0
        try:
            with self._wmu:
                view = memoryview(msg)
                if not self.tls:
                    while sent < len(msg):
                        sent += self.sock.send(view[sent:])
                while sent < len(msg):
                    with self._tls:
                        try:
                            sent += self.sock.send(view[sent:])
                            continue
                        except (_ssl.SSLWantWriteError, _ssl.SSLWantReadError):
                            pass
                    if self.err is not None:
                        raise ConnectionResetError("the connection failed")
                    select.select([], [self.sock], [], 0.1)
        except (OSError, ValueError) as e:
            if sent == 0:
                with self._mu:
                    if msgid is not None:
                        self.pending.pop(msgid, None)
                self.fail(e)
                raise NotSent() from e
            self.fail(e)

    # -- waiting ---------------------------------------------------------

    def abandon(self, call: Call, keep_acquire: bool = False) -> None:
        """Forget a call whose caller stopped waiting (its timeout). A late
        grant of an acquire is handed to on_late_grant, to be released."""
        with self._mu:
            for msgid, c in self.pending.items():
                if c is call:
                    del self.pending[msgid]
                    if keep_acquire:
                        self._abandoned[msgid] = c
                    break

    # -- liveness --------------------------------------------------------

    def usable(self) -> bool:
        """Whether a call may go out here: not failed, and, when idle for a
        while, not closed by the server meanwhile (checked without reading)."""
        if self.err is not None:
            return False
        if time.monotonic() - self.used < PROBE_IDLE or self.pending:
            return True
        return not self._closed_by_peer()

    def _closed_by_peer(self) -> bool:
        try:
            r, _, _ = select.select([self.sock], [], [], 0)
        except (OSError, ValueError) as e:
            self.fail(e)
            return True
        if not r:
            return False
        if self.tls:
            # Nothing is due on an idle connection but an end: EOF, a TLS
            # close_notify, or the server's error notification before it
            # closes. (Peeking is not possible under TLS.)
            if not self.pending:
                self.fail(ConnectionResetError("the server closed the idle connection"))
                return True
            return False
        try:
            b = self.sock.recv(1, _MSG_PEEK_FLAGS)
        except BlockingIOError:
            return False
        except OSError as e:
            self.fail(e)
            return True
        if b == b"":
            self.fail(ConnectionResetError("the server closed the connection"))
            return True
        return False

    # -- reading ---------------------------------------------------------

    def _read_loop(self) -> None:
        unpacker = _proto.unpacker()
        sock = self.sock
        try:
            while True:
                try:
                    if self.tls:
                        with self._tls:
                            try:
                                b = sock.recv(1 << 18)
                            except (_ssl.SSLWantReadError, _ssl.SSLWantWriteError):
                                b = None
                        if b is None:
                            if self.err is not None:
                                return
                            select.select([sock], [], [], 1.0)
                            continue
                    else:
                        b = sock.recv(1 << 18)
                except (OSError, ValueError) as e:
                    self.fail(e)
                    return
                if not b:
                    self.fail(ConnectionResetError("the server closed the connection"))
                    return
                unpacker.feed(b)
                for msg in unpacker:
                    self._dispatch(msg)
        except Exception as e:  # a malformed answer: an error, not a hang
            self.fail(errors.ProtocolError(f"malformed message from {self.addr}: {e}"))

    def _dispatch(self, msg: Any) -> None:
        if not isinstance(msg, list) or not msg:
            raise errors.ProtocolError(f"not a message: {msg!r}")
        kind = msg[0]
        if kind == 1 and len(msg) == 4:
            _, msgid, err, result = msg
            with self._mu:
                call = self.pending.pop(msgid, None)
                late = None if call is not None else self._abandoned.pop(msgid, None)
            if call is None:
                if late is not None and err is None and self._on_late_grant is not None:
                    self._on_late_grant(self, result, late)
                return
            if err is not None:
                call.finish(None, errors.from_wire(err))
            elif not isinstance(result, dict):
                call.finish(None, errors.ProtocolError(f"{call.method}: result is not a map"))
            else:
                call.finish(result, None)
        elif kind == 2 and len(msg) == 3:
            if msg[1] == "error":
                params = msg[2]
                e = params[0] if isinstance(params, list) and params else {}
                self.fail(errors.from_wire(e))
            # other notifications: ignored (future versions may add some)
        else:
            raise errors.ProtocolError(f"unexpected message: {msg!r}"[:200])

    # -- failing ---------------------------------------------------------

    def fail(self, cause: BaseException) -> None:
        """Mark the connection broken and fail every call waiting on it."""
        with self._mu:
            if self.err is not None:
                return
            self.err = cause
            calls = list(self.pending.values())
            self.pending.clear()
            self._abandoned.clear()
        for call in calls:
            call.finish(None, self.failure(call))
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def failure(self, call: Call) -> errors.Error:
        cause = self.err
        if isinstance(cause, errors.ClientClosed):
            return errors.ClientClosed("the client was closed")
        msg = f"connection to {self.addr} failed: {cause}"
        if isinstance(cause, errors.Error) and not isinstance(cause, errors.ConnectionLost):
            msg = f"{self.addr} closed the connection: {cause}"
        if call.effect:
            msg += " (the request was sent: it may or may not have been applied)"
        e = errors.ConnectionLost(msg, addr=self.addr, outcome_unknown=call.effect)
        e.__cause__ = cause
        return e

    def close(self, cause: Optional[BaseException] = None) -> None:
        self.fail(cause or errors.ClientClosed("closed"))
        # Under TLS the reader (or a sender) may be inside an SSL call,
        # which works on the descriptor's number. Closing it then lets the
        # next connection get that number, and the old SSL object read that
        # connection's handshake and write its own alert into it (the new
        # handshake fails: bad record MAC, wrong version number). So close
        # between SSL calls: later ones see the socket closed (fd -1).
        if self.tls:
            with self._tls:
                self._close_socket()
        else:
            self._close_socket()

    def _close_socket(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass
