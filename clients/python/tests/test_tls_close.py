"""Closing a TLS connection while its reader is inside an SSL call.

The C10 flake: a client closed (after a refused auth, or a reconnect)
while its reader thread was inside SSL_read on the socket's file
descriptor; the next connection got the same descriptor number, and the
old SSL object read the new connection's handshake bytes and wrote its
bad_record_mac alert into it. The new handshake failed (WRONG_VERSION_NUMBER
or bad record MAC on the client, "bad record MAC" in the server's log) and
the new client raised ConnectionLost. The descriptor must stay open until
no SSL call is in progress on it.
"""

from __future__ import annotations

import ssl
import threading
from typing import Any, Dict

import pytest

import fencekv
from helpers import tls_auth_server


def test_tls_close_waits_for_the_ssl_call_in_progress(make_server: Any, fencekv_bin: str,
                                                      tmp_path: Any) -> None:
    server, ctx = tls_auth_server(make_server, fencekv_bin, tmp_path)
    c = fencekv.Client(server.addr, ssl=ctx, user="alice", secret="s3cret")
    conn = c._conn
    assert conn is not None and conn.tls
    sock = conn.sock
    real_recv = sock.recv
    seen: Dict[str, Any] = {}
    closed = threading.Event()

    def close_in_thread() -> None:
        c.close()
        closed.set()

    def recv(n: int) -> Any:
        # The reader is here holding the connection's TLS lock, as it is
        # inside SSL_read. The client is closed meanwhile, from another
        # thread: the descriptor must stay open until this call is over.
        if "fd" not in seen:
            seen["fd"] = sock.fileno()
            threading.Thread(target=close_in_thread, daemon=True).start()
            # With the bug close() returns at once; with the fix it waits
            # for this call, so this bound only ends the wait.
            seen["closed_during_call"] = closed.wait(1.0)
            seen["fd_during_call"] = sock.fileno()
        return real_recv(n)

    sock.recv = recv  # the reader's next SSL call goes through it
    try:
        c.call("ping")  # an answer to read: the reader calls recv for it
    except fencekv.ClientClosed:
        pass  # closed by close_in_thread before the answer was read
    assert closed.wait(10), "close() did not return"
    assert "fd" in seen, "the reader never called recv"
    assert seen["fd"] != -1
    assert not seen["closed_during_call"], "close() returned while an SSL call was in progress"
    assert seen["fd_during_call"] == seen["fd"], "the descriptor was closed under an SSL call"
    assert sock.fileno() == -1  # closed once the call was over


def test_tls_new_clients_after_closed_ones(make_server: Any, fencekv_bin: str,
                                           tmp_path: Any) -> None:
    """The C10 sequence, repeated: a client closed after a refused auth, then
    a new one, on the same TLS server; every handshake succeeds."""
    server, ctx = tls_auth_server(make_server, fencekv_bin, tmp_path)
    for i in range(15):
        with pytest.raises(fencekv.Unauthenticated):
            fencekv.Client(server.addr, ssl=ctx, user="alice", secret="wrong")
        with fencekv.Client(server.addr, ssl=ctx, user="alice", secret="s3cret") as c:
            c.put("a/x", str(i).encode())
            assert c.get("a/x").value == str(i).encode()
    assert "bad record MAC" not in server.log()
