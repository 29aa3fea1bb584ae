"""fencekv.sqlfence against a real PostgreSQL server (started here) and
SQLite, with real `fencekv serve` processes for the leases."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, List, Tuple

import pytest

import fencekv
from fencekv import sqlfence
from conftest import REPO, Server, wait_for
import pgserver

PG_MISSING = pgserver.missing()


@pytest.fixture(scope="session")
def pg() -> Iterator[pgserver.Postgres]:
    if PG_MISSING:
        pytest.skip(f"PostgreSQL part: {PG_MISSING}")
    p = pgserver.Postgres().start()
    yield p
    p.stop()


Opener = Callable[[], Any]


def prepare(conn: Any) -> None:
    sqlfence.install(conn)
    sqlfence.install(conn)  # applying it again changes nothing
    for stmt in ("CREATE TABLE stock (sku TEXT PRIMARY KEY, qty INTEGER NOT NULL, "
                 "writer TEXT NOT NULL DEFAULT '')",
                 "INSERT INTO stock (sku, qty) VALUES ('apple', 10)"):
        conn.execute(stmt)
    conn.commit()


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Tuple[str, Opener]]:
    """(dialect, open): open() is a new connection to a fresh database with
    the fence schema and a stock table (apple: 10)."""
    opened: List[Any] = []
    if request.param == "sqlite":
        path = str(tmp_path / "fenced.db")

        def open_() -> Any:
            c = sqlite3.connect(path, isolation_level="IMMEDIATE", timeout=20,
                                check_same_thread=False)
            opened.append(c)
            return c
    else:
        dsn = request.getfixturevalue("pg").new_db()  # skips without PostgreSQL
        import psycopg

        def open_() -> Any:
            c = psycopg.connect(dsn)
            opened.append(c)
            return c
    prepare(open_())
    yield request.param, open_
    for c in opened:
        c.close()


@pytest.fixture
def pgdb(pg: pgserver.Postgres) -> Iterator[Tuple[str, Opener]]:
    import psycopg

    dsn = pg.new_db()
    opened: List[Any] = []

    def open_() -> Any:
        c = psycopg.connect(dsn)
        opened.append(c)
        return c
    prepare(open_())
    yield dsn, open_
    for c in opened:
        c.close()


def ph(conn: Any) -> str:
    return "?" if isinstance(conn, sqlite3.Connection) else "%s"


def stock(open_: Opener) -> Tuple[int, str]:
    c = open_()
    try:
        row = c.execute("SELECT qty, writer FROM stock WHERE sku = 'apple'").fetchone()
        c.rollback()
        return int(row[0]), str(row[1])
    finally:
        c.close()


def fence_of(open_: Opener, resource: str) -> int:
    c = open_()
    try:
        row = c.execute(f"SELECT token FROM fencekv_fences WHERE resource = {ph(c)}",
                        (resource,)).fetchone()
        c.rollback()
        return 0 if row is None else int(row[0])
    finally:
        c.close()


def write(conn: Any, token: int, qty: int, writer: str) -> None:
    """The fenced write: check, update, commit."""
    sqlfence.check(conn, "inventory", token)
    conn.execute(f"UPDATE stock SET qty = {ph(conn)}, writer = {ph(conn)} WHERE sku = 'apple'",
                 (qty, writer))
    conn.commit()


def expired_grant(client: fencekv.Client, name: str) -> int:
    """A token whose lease ran out: its holder paused (never renewed)."""
    g = client.acquire(name, 0.2)
    wait_for(lambda: not client.lock_info(name).held, 10, f"{name}'s lease to run out")
    return g.token


def test_schema_copies_are_the_repositorys() -> None:
    for name in ("postgres", "sqlite"):
        assert sqlfence.schema(name) == (REPO / "sqlfence" / f"{name}.sql").read_text("utf-8")
    with pytest.raises(ValueError):
        sqlfence.schema("mysql")


def test_seed(db: Tuple[str, Opener], client: fencekv.Client) -> None:
    """A gets the lock and pauses past its lease; B gets it and writes; A's
    write with its token is refused (StaleToken with B's fence), and A's
    transaction does not land, not even a write made before the check and
    committed carelessly after the refusal."""
    _, open_ = db
    a_token = expired_grant(client, "inventory")
    with client.lock("inventory", ttl=10) as b:
        assert b.token > a_token
        write(open_(), b.token, 7, "B")
    a = open_()
    a.execute("UPDATE stock SET qty = 3, writer = 'A' WHERE sku = 'apple'")
    with pytest.raises(fencekv.StaleToken) as e:
        sqlfence.check(a, "inventory", a_token)
    assert e.value.fence == b.token and e.value.facts["key"] == "inventory"
    assert e.value.code == "stale_token"
    try:
        a.commit()  # careless: the transaction was aborted (PostgreSQL) or rolled back (SQLite)
    except Exception:  # noqa: BLE001 - a driver may refuse the commit outright
        a.rollback()
    assert stock(open_) == (7, "B")
    assert fence_of(open_, "inventory") == b.token
    # The same holder checks again: an equal token holds.
    write(open_(), b.token, 6, "B")
    assert stock(open_) == (6, "B")


def test_fence_survives(db: Tuple[str, Opener], make_server: Callable[..., Server]) -> None:
    """The fence outlives the connections that raised it and a crash of the
    fencekv server: after a kill -9 and restart, the old token is still
    refused on a new connection, and the next grant passes."""
    _, open_ = db
    server = make_server()
    with fencekv.Client(server.addr, timeout=5) as c:
        old = expired_grant(c, "inventory")
        g = c.acquire("inventory", 1)
        write(open_(), g.token, 7, "B")
    server.kill9()
    server.start()
    conn = open_()
    with pytest.raises(fencekv.StaleToken) as e:
        sqlfence.check(conn, "inventory", old)
    assert e.value.fence == g.token
    conn.rollback()
    with fencekv.Client(server.addr, timeout=5) as c:
        wait_for(lambda: not c.lock_info("inventory").held, 15, "the lease to run out")
        with c.lock("inventory", ttl=10) as lease:
            assert lease.token > g.token
            write(conn, lease.token, 5, "C")
    assert stock(open_) == (5, "C")
    assert fence_of(open_, "inventory") > g.token


def test_bad_input_changes_nothing(db: Tuple[str, Opener]) -> None:
    dialect, open_ = db
    conn = open_()
    for resource, token in [("inventory", 0), ("inventory", -1), ("inventory", 2**63),
                            ("inventory", True), ("inventory", 1.5), ("", 5), ("x" * 1025, 5),
                            ("é" * 513, 5), (b"inventory", 5)]:
        with pytest.raises(fencekv.BadRequest):
            sqlfence.check(conn, resource, token)  # type: ignore[arg-type]
    sqlfence.check(conn, "x" * 1024, 2**63 - 1)  # the limits themselves hold
    conn.rollback()
    # Autocommit outside a transaction: the check would commit alone.
    auto = open_()
    if dialect == "sqlite":
        auto.isolation_level = None
    else:
        auto.autocommit = True
    with pytest.raises(fencekv.BadRequest):
        sqlfence.check(auto, "inventory", 5)
    assert fence_of(open_, "inventory") == 0
    assert fence_of(open_, "x" * 1024) == 0
    with pytest.raises(TypeError):
        sqlfence.check(object(), "inventory", 5)


def test_with_lock(db: Tuple[str, Opener], server: Server) -> None:
    """with_lock commits under a held lease, and does not commit once the
    lease is lost (released behind its back: the next renew is refused)."""
    _, open_ = db
    conn = open_()
    with fencekv.Client(server.addr, timeout=5) as c, \
            fencekv.Client(server.addr, timeout=5) as other:
        with sqlfence.with_lock(c, conn, "inventory", ttl=1) as lease:
            conn.execute("UPDATE stock SET qty = 8, writer = 'with_lock' WHERE sku = 'apple'")
        assert stock(open_) == (8, "with_lock")
        assert fence_of(open_, "inventory") == lease.token

        with pytest.raises(fencekv.LeaseLost):
            with sqlfence.with_lock(c, conn, "inventory", ttl=1) as lease:
                conn.execute("UPDATE stock SET qty = 1, writer = 'lost' WHERE sku = 'apple'")
                other.release("inventory", lease.token)
                assert lease.lost.wait(10), "the refused renew did not lose the lease"
        assert stock(open_) == (8, "with_lock")

        # The block raises: rolled back, raised again, the lock released.
        with pytest.raises(ZeroDivisionError):
            with sqlfence.with_lock(c, conn, "inventory", ttl=5):
                conn.execute("UPDATE stock SET qty = 2, writer = 'raised' WHERE sku = 'apple'")
                1 / 0
        assert stock(open_) == (8, "with_lock")
        assert not c.lock_info("inventory").held

        # Already in a transaction: refused before the lock is taken.
        conn.execute("SELECT 1")
        if isinstance(conn, sqlite3.Connection):
            conn.execute("UPDATE stock SET qty = qty WHERE sku = 'apple'")
        with pytest.raises(fencekv.BadRequest):
            with sqlfence.with_lock(c, conn, "inventory", ttl=5):
                pass
        conn.rollback()


def test_with_lock_interrupts_a_running_statement(db: Tuple[str, Opener], server: Server) -> None:
    """A statement still running when the lease is lost is interrupted, and
    the transaction rolled back."""
    dialect, open_ = db
    conn = open_()
    forever = ("SELECT pg_sleep(60)" if dialect == "postgres" else
               "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
               "SELECT count(*) FROM c")
    with fencekv.Client(server.addr, timeout=5) as c, \
            fencekv.Client(server.addr, timeout=5) as other:
        start = time.monotonic()
        with pytest.raises(Exception) as e:
            with sqlfence.with_lock(c, conn, "inventory", ttl=1) as lease:
                conn.execute("UPDATE stock SET qty = 1, writer = 'lost' WHERE sku = 'apple'")
                other.release("inventory", lease.token)
                conn.execute(forever)
        took = time.monotonic() - start
    assert lease.lost.is_set(), e.value
    assert "cancel" in str(e.value).lower() or "interrupt" in str(e.value).lower(), e.value
    assert took < 30, f"the statement ran {took:.1f}s after the loss"
    assert stock(open_) == (10, "")


def test_overlap_read_committed(pgdb: Tuple[str, Opener]) -> None:
    """The stale holder's transaction began first (and read) and tries to
    write last, under READ COMMITTED: the check refuses it, and the row is
    the newer holder's."""
    _, open_ = pgdb
    write(open_(), 32, 9, "earlier")  # the fence row exists
    a = open_()
    a.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    assert a.execute("SELECT qty FROM stock WHERE sku = 'apple'").fetchone()[0] == 9
    write(open_(), 34, 7, "B")
    with pytest.raises(fencekv.StaleToken) as e:
        sqlfence.check(a, "inventory", 33)
    assert e.value.fence == 34
    a.rollback()
    assert stock(open_) == (7, "B")


def test_concurrent_checks_commit_in_token_order(pgdb: Tuple[str, Opener]) -> None:
    """Under READ COMMITTED, A (33) has checked and not committed; B (34)
    checks concurrently and waits on the fence row; when A commits, B
    passes; a third, stale check (33 again) afterwards is refused."""
    dsn, open_ = pgdb
    a = open_()
    sqlfence.check(a, "inventory", 33)
    done: List[BaseException] = []

    def b() -> None:
        try:
            write(open_(), 34, 7, "B")
        except BaseException as e:  # noqa: BLE001 - reported below
            done.append(e)

    t = threading.Thread(target=b)
    t.start()
    wait_for(lambda: len(pgserver.waiters(dsn)) == 1, 10, "B to wait on the fence row")
    a.execute("UPDATE stock SET qty = 3, writer = 'A' WHERE sku = 'apple'")
    a.commit()
    t.join(20)
    assert not t.is_alive() and not done, done
    assert stock(open_) == (7, "B")
    c = open_()
    with pytest.raises(fencekv.StaleToken):
        sqlfence.check(c, "inventory", 33)


def test_checked_then_paused(pgdb: Tuple[str, Opener]) -> None:
    """What the fence does not promise: A passed the check with 33 and then
    paused, holding the fence row's lock; B (34) waits at its check
    (lock_timeout bounds the wait: 55P03), and A's write lands first when A
    resumes. The commits still come in token order: B's is last."""
    import psycopg

    dsn, open_ = pgdb
    a = open_()
    sqlfence.check(a, "inventory", 33)
    bt = open_()
    bt.execute("SET LOCAL lock_timeout = '50ms'")
    with pytest.raises(psycopg.errors.LockNotAvailable):
        sqlfence.check(bt, "inventory", 34)
    bt.rollback()
    errs: List[BaseException] = []

    def b() -> None:
        try:
            write(open_(), 34, 7, "B")
        except BaseException as e:  # noqa: BLE001 - reported below
            errs.append(e)

    t = threading.Thread(target=b)
    t.start()
    wait_for(lambda: len(pgserver.waiters(dsn)) == 1, 10, "B to wait on the fence row")
    a.execute("UPDATE stock SET qty = 3, writer = 'A' WHERE sku = 'apple'")
    a.commit()  # A's late write lands: the fence does not bound how late
    t.join(20)
    assert not t.is_alive() and not errs, errs
    assert stock(open_) == (7, "B")
    assert fence_of(open_, "inventory") == 34


def test_postgres_stale_aborts_the_transaction(pgdb: Tuple[str, Opener]) -> None:
    """On PostgreSQL a refused check leaves the transaction aborted: later
    statements fail until it is rolled back, so nothing of it can land."""
    import psycopg

    _, open_ = pgdb
    write(open_(), 34, 7, "B")
    a = open_()
    with pytest.raises(fencekv.StaleToken) as e:
        sqlfence.check(a, "inventory", 33)
    assert isinstance(e.value.__cause__, psycopg.Error)
    assert e.value.__cause__.sqlstate == "FK001"
    with pytest.raises(psycopg.errors.InFailedSqlTransaction):
        a.execute("UPDATE stock SET qty = 3 WHERE sku = 'apple'")
    a.rollback()
    assert stock(open_) == (7, "B")


def test_dialect() -> None:
    assert sqlfence.dialect(sqlite3.connect(":memory:")) == "sqlite"
    with pytest.raises(TypeError):
        sqlfence.dialect("postgres://")
