#!/usr/bin/env python3
"""Per-call cost of the fencekv Python client against redis-py on this machine.

    python3 bench.py [--seconds 3]

Starts `fencekv serve` ($FENCEKV_BIN, or built from the tree) and, if
redis-server and redis-py are present, redis-server (--save "" --appendonly
yes --appendfsync always: every write synced, as fencekv's are), each on a
free loopback port with a temporary dir, and stops them by PID. Measures get
and a fenced put (token + held lock; on Redis a plain SET) with 1 and 16
caller threads sharing one client.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Dict, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fencekv  # noqa: E402


def free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port: int, proc: subprocess.Popen) -> None:
    until = time.monotonic() + 15
    while time.monotonic() < until:
        if proc.poll() is not None:
            raise SystemExit(f"server exited {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit("server did not start")


def measure(fn: Callable[[int], None], threads: int, seconds: float) -> float:
    """Calls per second of fn over threads callers for seconds."""
    counts = [0] * threads
    stop = time.monotonic() + seconds

    def run(t: int) -> None:
        n = 0
        while time.monotonic() < stop:
            for _ in range(50):
                fn(t)
            n += 50
        counts[t] = n

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    t0 = time.monotonic()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.monotonic() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=3.0)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="fencekv-bench-")
    procs = []
    try:
        binary = os.environ.get("FENCEKV_BIN")
        if not binary:
            binary = os.path.join(tmp, "fencekv")
            subprocess.run(["go", "build", "-o", binary, "./cmd/fencekv"], check=True,
                           cwd=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
        port = free_port()
        p = subprocess.Popen([binary, "serve", "--data", os.path.join(tmp, "db"), "--listen",
                              f"127.0.0.1:{port}", "--http", ""],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        wait_port(port, p)
        results: Dict[str, Dict[int, float]] = {}
        c = fencekv.Client(f"127.0.0.1:{port}")
        c.put("bench/k", b"v" * 100)
        lease = c.lock("bench", ttl=60)
        lease.acquire()
        results["fencekv get"] = {n: measure(lambda t: c.get("bench/k"), n, args.seconds)
                                  for n in (1, 16)}
        results["fencekv fenced put"] = {
            n: measure(lambda t: c.put(f"bench/p{t}", b"v" * 100, lease=lease), n, args.seconds)
            for n in (1, 16)}
        lease.release()
        c.close()

        r: Optional[object] = None
        try:
            import redis  # type: ignore
        except ImportError:
            redis = None
        server = shutil.which("redis-server")
        if redis is not None and server:
            rport = free_port()
            rp = subprocess.Popen([server, "--port", str(rport), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                                   "--dir", tmp], stdout=subprocess.DEVNULL)
            procs.append(rp)
            wait_port(rport, rp)
            r = redis.Redis(host="127.0.0.1", port=rport,
                            connection_pool=None, max_connections=32)
            r.set("bench/k", b"v" * 100)
            results["redis-py GET"] = {n: measure(lambda t: r.get("bench/k"), n, args.seconds)
                                       for n in (1, 16)}
            results["redis-py SET"] = {
                n: measure(lambda t: r.set(f"bench/p{t}", b"v" * 100), n, args.seconds)
                for n in (1, 16)}
        print(f"{'':24}{'1 caller':>22}{'16 callers':>22}")
        for name, by in results.items():
            cells = "".join(f"{by[n]:>12,.0f}/s {1e6 / by[n]:>5.0f}us" for n in (1, 16))
            print(f"{name:24}{cells}")
        if r is not None:
            for a, b in (("fencekv get", "redis-py GET"), ("fencekv fenced put", "redis-py SET")):
                ratio = "  ".join(f"{n}: {results[b][n] / results[a][n]:.2f}x" for n in (1, 16))
                print(f"per-call cost {a} / {b}: {ratio}")
    finally:
        for p in procs:
            p.terminate()
            p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
