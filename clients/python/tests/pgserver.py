"""A PostgreSQL server of the test run's own: initdb into a temporary
directory, postgres on a free loopback port (as nobody when run as root:
PostgreSQL refuses to run as root), stopped by its PID."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import Any, Dict, List, Optional

from conftest import free_port


def postgres_bin() -> Optional[str]:
    """$FENCEKV_PG_BIN, or Debian's newest /usr/lib/postgresql/N/bin."""
    env = os.environ.get("FENCEKV_PG_BIN")
    if env:
        return env
    dirs = [d for d in glob.glob("/usr/lib/postgresql/*/bin")
            if os.path.exists(os.path.join(d, "postgres"))]
    dirs.sort(key=lambda d: int(os.path.basename(os.path.dirname(d)) or 0)
              if os.path.basename(os.path.dirname(d)).isdigit() else 0)
    return dirs[-1] if dirs else None


def missing() -> Optional[str]:
    """Why the PostgreSQL tests cannot run, or None."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg missing; install with pip install 'psycopg[binary]'"
    if postgres_bin() is None:
        return "no PostgreSQL server; install with apt-get install postgresql"
    return None


class Postgres:
    def __init__(self) -> None:
        b = postgres_bin()
        assert b is not None
        self.bin = b
        self.dir = tempfile.mkdtemp(prefix="fencekv-py-pg-")
        self.proc: Optional[subprocess.Popen] = None
        self.port = 0
        self._dbs = 0
        self._as: Dict[str, Any] = {}
        if os.geteuid() == 0:
            os.chown(self.dir, 65534, 65534)
            self._as = {"user": 65534, "group": 65534, "extra_groups": []}

    def start(self) -> "Postgres":
        data = os.path.join(self.dir, "data")
        env = dict(os.environ, LC_ALL="C")
        subprocess.run([os.path.join(self.bin, "initdb"), "-D", data, "-U", "fencekv", "-A",
                        "trust", "-E", "UTF8", "--no-sync"], cwd=self.dir, env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **self._as)
        for attempt in range(4):
            self.port = free_port()
            log = open(os.path.join(self.dir, "postgres.log"), "ab")
            self.proc = subprocess.Popen(
                [os.path.join(self.bin, "postgres"), "-D", data, "-p", str(self.port), "-k",
                 self.dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c",
                 "max_connections=40"],
                cwd=self.dir, env=env, stdout=log, stderr=subprocess.STDOUT, **self._as)
            log.close()
            if self._ready():
                return self
            if attempt < 3 and self.proc.poll() is not None:
                continue  # the port was taken between free_port and the bind
            break
        self.stop()
        raise RuntimeError(f"postgres did not start: {self.log()[-2000:]}")

    def _ready(self) -> bool:
        import psycopg

        until = time.monotonic() + 60
        pause = 0.005
        while time.monotonic() < until:
            assert self.proc is not None
            if self.proc.poll() is not None:
                return False
            try:
                psycopg.connect(self.dsn("postgres"), connect_timeout=2).close()
                return True
            except psycopg.OperationalError:
                time.sleep(pause)
                pause = min(2 * pause, 0.05)
        return False

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "postgres.log"), "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def dsn(self, db: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=fencekv dbname={db} sslmode=disable"

    def new_db(self) -> str:
        """A database of the caller's own; its DSN."""
        import psycopg

        self._dbs += 1
        name = f"t{self._dbs}"
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as c:
            c.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def waiters(dsn: str) -> List[int]:
    """The PIDs of dsn's database's sessions waiting for a lock."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as c:
        rows = c.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                         "AND wait_event_type = 'Lock'").fetchall()
    return [r[0] for r in rows]
