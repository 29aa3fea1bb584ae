"""Test helpers: a proxy that can cut connections, a silent listener, a cluster."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import threading
from typing import Any, Callable, List, Optional

import pytest

from conftest import Server, free_port, wait_for


class CutProxy:
    """Forwards TCP to upstream. ``drop_answer_after(b"acquire")``: once a
    client sends bytes holding the marker, they are passed on, and the
    server's next bytes to that client are dropped and its connection cut:
    an answer that never reaches the client. ``cut()`` cuts every connection."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.ln = socket.socket()
        self.ln.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.ln.bind(("127.0.0.1", 0))
        self.ln.listen(64)
        self.addr = f"127.0.0.1:{self.ln.getsockname()[1]}"
        self._mu = threading.Lock()
        self._marker: Optional[bytes] = None
        self._pairs: List[tuple] = []
        self.dropped = threading.Event()
        #: called when an answer is dropped, before the connection is cut
        self.on_drop: Optional[Callable[[], None]] = None
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def drop_answer_after(self, marker: bytes) -> None:
        with self._mu:
            self._marker = marker
            self.dropped.clear()

    def _accept(self) -> None:
        while not self._closed:
            try:
                c, _ = self.ln.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(self.upstream)
            except OSError:
                c.close()
                continue
            pair = (c, u, {"armed": False})
            with self._mu:
                self._pairs.append(pair)
            threading.Thread(target=self._up, args=(pair,), daemon=True).start()
            threading.Thread(target=self._down, args=(pair,), daemon=True).start()

    def _up(self, pair: tuple) -> None:
        c, u, st = pair
        try:
            while True:
                b = c.recv(65536)
                if not b:
                    break
                with self._mu:
                    if self._marker is not None and self._marker in b:
                        st["armed"] = True
                        self._marker = None
                u.sendall(b)
        except OSError:
            pass
        self._close(pair)

    def _down(self, pair: tuple) -> None:
        c, u, st = pair
        try:
            while True:
                b = u.recv(65536)
                if not b:
                    break
                if st["armed"]:
                    if self.on_drop is not None:
                        self.on_drop()
                    self._close(pair)
                    self.dropped.set()
                    return
                c.sendall(b)
        except OSError:
            pass
        self._close(pair)

    def _close(self, pair: tuple) -> None:
        for s in pair[:2]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def cut(self) -> None:
        with self._mu:
            pairs, self._pairs = self._pairs, []
        for p in pairs:
            self._close(p)

    def close(self) -> None:
        self._closed = True
        self.ln.close()
        self.cut()


class SilentListener:
    """Accepts connections (the kernel does) and never answers: a stopped node."""

    def __init__(self) -> None:
        self.ln = socket.socket()
        self.ln.bind(("127.0.0.1", 0))
        self.ln.listen(64)
        self.addr = f"127.0.0.1:{self.ln.getsockname()[1]}"

    def close(self) -> None:
        self.ln.close()


class Cluster:
    """Three `fencekv serve` nodes on loopback, as cluster/run.sh starts them."""

    def __init__(self, binary: str, n: int = 3) -> None:
        self.dir = tempfile.mkdtemp(prefix="fencekv-py-cluster-")
        self.gossip = [free_port(udp_too=True) for _ in range(n)]
        join = ",".join(f"127.0.0.1:{g}" for g in self.gossip)
        self.nodes: List[Server] = []
        for i in range(n):
            d = os.path.join(self.dir, f"n{i}")
            os.makedirs(d)
            extra = ["--node", f"n{i}", "--raft", f"127.0.0.1:{free_port()}",
                     "--gossip", f"127.0.0.1:{self.gossip[i]}", "--bootstrap-expect", str(n),
                     "--join", join]
            self.nodes.append(Server(binary, d, extra=extra))

    def start(self) -> "Cluster":
        for s in self.nodes:
            s.start(timeout=30)
        return self

    @property
    def addrs(self) -> List[str]:
        return [s.addr for s in self.nodes]

    def leader(self, timeout: float = 30.0) -> Server:
        import fencekv

        def find() -> Optional[Server]:
            for s in self.nodes:
                if s.proc is None or s.proc.poll() is not None:
                    continue
                try:
                    with fencekv.Client(s.addr, timeout=1, connect_timeout=1) as c:
                        if c.status().role == "leader":
                            return s
                except fencekv.Error:
                    continue
            return None

        return wait_for(find, timeout, "a cluster leader", every=0.1)  # type: ignore[return-value]

    def describe(self, addrs: List[str]) -> str:
        """Each node's role and term as it answers now, and its log's tail:
        for a failure message."""
        import fencekv
        out = []
        for s in self.nodes:
            if s.addr not in addrs:
                continue
            try:
                with fencekv.Client(s.addr, timeout=2, connect_timeout=1) as c:
                    st = c.status()
                    out.append(f"{s.addr}: {st.role} term {st.term}")
            except fencekv.Error as e:
                out.append(f"{s.addr}: {e!r}")
            out.append("  log tail: " + s.log()[-1500:].replace("\n", "\n    "))
        return "\n".join(out)

    def stop(self) -> None:
        for s in self.nodes:
            s.stop()
        keep = os.environ.get("FENCEKV_PY_LOGS")  # a directory to keep the nodes' logs in
        if keep:
            dest = tempfile.mkdtemp(prefix="cluster-", dir=keep)
            for i, s in enumerate(self.nodes):
                try:
                    shutil.copy(s.log_path, os.path.join(dest, f"n{i}.log"))
                except OSError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)


def make_certs(d: str) -> Optional[dict]:
    """A CA and a server certificate for 127.0.0.1, made with openssl."""
    if shutil.which("openssl") is None:
        return None
    p = {k: os.path.join(d, k) for k in ("ca.key", "ca.pem", "srv.key", "srv.csr", "srv.pem",
                                         "ext")}
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "req", "-x509", *ec, "-keyout", p["ca.key"], "-out", p["ca.pem"], "-days", "2",
        "-subj", "/CN=fencekv test CA")
    run("openssl", "req", *ec, "-keyout", p["srv.key"], "-out", p["srv.csr"], "-subj",
        "/CN=127.0.0.1")
    with open(p["ext"], "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    run("openssl", "x509", "-req", "-in", p["srv.csr"], "-CA", p["ca.pem"], "-CAkey", p["ca.key"],
        "-CAcreateserial", "-out", p["srv.pem"], "-days", "2", "-extfile", p["ext"])
    return p


def bcrypt_hash(binary: str, secret: str) -> str:
    out = subprocess.run([binary, "auth", "hash"], input=secret.encode(), check=True,
                         capture_output=True).stdout.decode().strip()
    return out.split()[-1]


__all__ = ["CutProxy", "SilentListener", "Cluster", "make_certs", "bcrypt_hash", "tls_auth_server", "signal"]


def tls_auth_server(make_server: Any, fencekv_bin: str, tmp_path: Any) -> Any:
    """A server on TLS with an auth file granting alice (secret s3cret) write:a/
    and lock:a; returns it and an SSLContext trusting its CA."""
    certs = make_certs(str(tmp_path))
    if certs is None:
        pytest.skip("openssl missing")
    auth = tmp_path / "auth"
    auth.write_text(f"alice {bcrypt_hash(fencekv_bin, 's3cret')} write:a/ lock:a\n")
    server = make_server(extra=["--tls-cert", certs["srv.pem"], "--tls-key", certs["srv.key"],
                                "--auth-file", str(auth)])
    return server, ssl.create_default_context(cafile=certs["ca.pem"])
