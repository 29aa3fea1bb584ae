"""Fixtures: real `fencekv serve` processes on free loopback ports."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
REPO = HERE.parent.parent.parent


def wait_for(cond: Callable[[], object], timeout: float = 10.0, what: str = "condition",
             every: float = 0.01) -> object:
    """Poll cond until it returns something true, or fail after timeout."""
    until = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = cond()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - reported if it never holds
            last = e
        if time.monotonic() >= until:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        time.sleep(every)


def free_port(udp_too: bool = False) -> int:
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if not udp_too:
            return port
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind(("127.0.0.1", port))
            return port
        except OSError:
            continue
        finally:
            u.close()


@pytest.fixture(scope="session")
def fencekv_bin(tmp_path_factory: pytest.TempPathFactory) -> str:
    env = os.environ.get("FENCEKV_BIN")
    if env:
        return env
    out = tmp_path_factory.mktemp("bin") / "fencekv"
    subprocess.run(["go", "build", "-o", str(out), "./cmd/fencekv"], cwd=REPO, check=True)
    return str(out)


class Server:
    """One `fencekv serve` process, stopped by its PID."""

    def __init__(self, binary: str, data: str, port: Optional[int] = None,
                 extra: Optional[List[str]] = None) -> None:
        self.binary = binary
        self.data = data
        self.port = port or free_port()
        self.extra = extra or []
        self.proc: Optional[subprocess.Popen] = None
        self.log_path = os.path.join(data, "server.log")

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> "Server":
        args = [self.binary, "serve", "--data", os.path.join(self.data, "db"),
                "--listen", self.addr, "--http", ""] + self.extra
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        wait_for(self._listening, timeout, f"server on {self.addr}")
        return self

    def _listening(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited {self.proc.returncode}: {self.log()[-2000:]}")
        with open(self.log_path, "rb") as f:
            text = f.read().decode(errors="replace")
        return "fencekv serving" in text.split("@@mark@@")[-1] or \
            "serving" in text.split("@@mark@@")[-1] and self._connects()

    def _connects(self) -> bool:
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            return True
        except OSError:
            return False

    def log(self) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")

    def mark(self) -> None:
        with open(self.log_path, "a") as f:
            f.write("\n@@mark@@\n")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.mark()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.mark()

    def restart(self) -> None:
        self.stop()
        self.start()

    def sigstop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def sigcont(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


@pytest.fixture
def make_server(fencekv_bin: str) -> Iterator[Callable[..., Server]]:
    made: List[Server] = []
    dirs: List[str] = []

    def make(extra: Optional[List[str]] = None, start: bool = True) -> Server:
        d = tempfile.mkdtemp(prefix="fencekv-py-")
        dirs.append(d)
        s = Server(fencekv_bin, d, extra=extra)
        made.append(s)
        return s.start() if start else s

    yield make
    for s in made:
        s.stop()
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def server(make_server: Callable[..., Server]) -> Server:
    return make_server()


@pytest.fixture
def client(server: Server) -> Iterator["object"]:
    import fencekv
    with fencekv.Client(server.addr, timeout=5) as c:
        yield c
