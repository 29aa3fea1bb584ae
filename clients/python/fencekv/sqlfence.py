"""The fence of sqlfence/ for data kept in PostgreSQL or SQLite.

fencekv refuses stale writes to its own keys; this module makes your
database refuse them too. A fence table (``fencekv_fences``) keeps, per
protected resource, the highest token a transaction presented.
:func:`check` compares a token and raises the fence in one statement, in
the caller's transaction, before the writes it protects::

    import sqlite3
    import fencekv
    from fencekv import sqlfence

    conn = psycopg.connect(dsn)                 # or sqlite3.connect(path, isolation_level="IMMEDIATE")
    sqlfence.install(conn)                      # the schema: applying it again changes nothing
    with client.lock("inventory", ttl=10, wait=5) as lease:
        sqlfence.check(conn, "inventory", lease.token)   # StaleToken: a newer holder has written
        conn.execute("UPDATE stock SET qty = qty - 1 WHERE sku = %s", (sku,))
        conn.commit()

:func:`with_lock` does it all in one ``with`` block and does not commit
once the lease may be lost.

Connections of psycopg 3 (``psycopg.Connection``) and of the standard
library's ``sqlite3`` are recognised by their type; psycopg is never
imported unless a psycopg connection is passed.

What the fence promises: transactions that pass the check commit in the
order of their tokens (the check takes the resource's row lock, also when
it refuses, so a newer holder's check waits until an older transaction that
passed it ends), under READ COMMITTED, REPEATABLE READ and SERIALIZABLE.
What it does not: it does not bound how late a holder that passed the check
and then paused commits; bound that with the database's timeouts
(``lock_timeout``, ``idle_in_transaction_session_timeout``) and with
:func:`with_lock`. See docs/databases.md.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

from . import errors
from .types import Bytes, Duration

if TYPE_CHECKING:
    from .client import Client
    from .lock import Lease

__all__ = ["MAX_RESOURCE", "MAX_TOKEN", "TABLE", "check", "install", "schema", "dialect",
           "with_lock"]

#: The longest resource name, in bytes of UTF-8 (the table's CHECK says the same).
MAX_RESOURCE = 1024
#: The largest token the fence holds: the SQL bigint's largest value.
MAX_TOKEN = 2**63 - 1
#: The fence table the schemas create and :func:`check` uses.
TABLE = "fencekv_fences"

_PG_RAISE = """INSERT INTO fencekv_fences AS f (resource, token) VALUES (%s, %s)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE f.token <= excluded.token
RETURNING f.token"""
_PG_READ = "SELECT token FROM fencekv_fences WHERE resource = %s"
# The same for SQLite, 3.24 or later: a changed row means the token holds
# (RETURNING would need 3.35).
_SQLITE_RAISE = """INSERT INTO fencekv_fences (resource, token) VALUES (?, ?)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE fencekv_fences.token <= excluded.token"""
_SQLITE_READ = "SELECT token FROM fencekv_fences WHERE resource = ?"


def dialect(conn: Any) -> str:
    """``"postgres"`` for a psycopg 3 connection, ``"sqlite"`` for a sqlite3
    one; TypeError for anything else."""
    if isinstance(conn, sqlite3.Connection):
        return "sqlite"
    for cls in type(conn).__mro__:
        if cls.__module__.split(".")[0] == "psycopg":
            if cls.__name__.startswith("Async"):
                break
            return "postgres"
    raise TypeError(f"fencekv.sqlfence: {type(conn).__module__}.{type(conn).__qualname__} is "
                    "not a psycopg 3 (synchronous) or sqlite3 connection")


def schema(name: str) -> str:
    """The schema of dialect ``name`` ("postgres" or "sqlite"): a copy of
    sqlfence/postgres.sql or sqlfence/sqlite.sql, shipped in the package."""
    if name not in ("postgres", "sqlite"):
        raise ValueError(f"fencekv.sqlfence: no dialect {name!r}: want postgres or sqlite")
    return resources.files(__package__).joinpath("sql", f"{name}.sql").read_text("utf-8")


def install(conn: Any) -> None:
    """Apply the fence schema on ``conn`` (the table, and for PostgreSQL the
    function ``fencekv_fence``), and commit it. Applying it again changes
    nothing. Inside a transaction of yours on PostgreSQL it is a savepoint
    of it, committed with it."""
    d = dialect(conn)
    if d == "sqlite":
        if conn.in_transaction:
            raise errors.BadRequest("fencekv.sqlfence: install on SQLite commits: end the "
                                    "transaction first")
        conn.executescript(schema(d))
        return
    with conn.transaction():
        conn.execute(schema(d))


def _check_resource(resource: str) -> None:
    if not isinstance(resource, str):
        raise errors.BadRequest(f"fencekv.sqlfence: resource name {resource!r}: want a str")
    n = len(resource.encode("utf-8"))
    if not 1 <= n <= MAX_RESOURCE:
        raise errors.BadRequest(f"fencekv.sqlfence: resource name of {n} bytes: want 1 to "
                                f"{MAX_RESOURCE}")


def _check_token(token: int) -> None:
    if isinstance(token, bool) or not isinstance(token, int) or not 1 <= token <= MAX_TOKEN:
        raise errors.BadRequest(f"fencekv.sqlfence: fencing token {token!r}: want 1 to "
                                f"{MAX_TOKEN} (SQL bigint)")


def _pg_idle(conn: Any) -> bool:
    """A psycopg connection outside any transaction."""
    from psycopg import pq  # the connection is psycopg's: it is installed

    return bool(conn.info.transaction_status == pq.TransactionStatus.IDLE)


def _autocommitting(conn: Any, d: str) -> bool:
    """The next statement on conn would commit alone."""
    if d == "sqlite":
        if conn.in_transaction:
            return False
        if getattr(conn, "autocommit", None) is True:
            return True
        return conn.isolation_level is None
    return bool(conn.autocommit) and _pg_idle(conn)


def _stale(resource: str, fence: int, token: int) -> errors.StaleToken:
    return errors.StaleToken(f"{resource} is fenced at {fence}; token {token} refused",
                             facts={"fence": fence, "key": resource})


def check(conn: Any, resource: str, token: int) -> None:
    """Check ``token`` against ``resource``'s fence and raise the fence to
    it, in ``conn``'s transaction, in one statement.

    Returns if the token is not below the fence (an equal token is the same
    holder again): make the writes it protects, and commit as usual. A
    token below it raises :class:`fencekv.StaleToken` with the fence
    (``.fence``; ``.facts["key"]`` is the resource), and the transaction
    cannot land: on PostgreSQL it is aborted (only a rollback ends it; a
    commit rolls it back), on SQLite it is rolled back.

    The statement takes the resource's row lock until the transaction ends,
    also when it refuses: a newer holder's check waits, so the order of the
    tokens is the order of the commits. Call it before the writes it
    protects. On SQLite, open the connection with
    ``isolation_level="IMMEDIATE"`` so that the transaction takes the write
    lock when it begins.

    An empty resource name, one over :data:`MAX_RESOURCE` bytes, a token
    below 1 or above :data:`MAX_TOKEN`, or a connection that would commit
    the check alone (autocommit, outside a transaction) raise
    :class:`fencekv.BadRequest`, and nothing is sent.
    """
    d = dialect(conn)
    _check_resource(resource)
    _check_token(token)
    if _autocommitting(conn, d):
        raise errors.BadRequest("fencekv.sqlfence: the connection is in autocommit mode outside "
                                "a transaction: the check would commit alone, protecting nothing; "
                                "check, write and commit in one transaction")
    if d == "sqlite":
        _check_sqlite(conn, resource, token)
    else:
        _check_postgres(conn, resource, token)


def _check_sqlite(conn: sqlite3.Connection, resource: str, token: int) -> None:
    cur = conn.execute(_SQLITE_RAISE, (resource, token))
    if cur.rowcount == 1:
        return
    row = conn.execute(_SQLITE_READ, (resource,)).fetchone()
    conn.rollback()
    if row is None:
        raise errors.Error(f"fencekv.sqlfence: the fence of {resource!r} vanished after a refusal")
    raise _stale(resource, int(row[0]), token)


def _check_postgres(conn: Any, resource: str, token: int) -> None:
    import psycopg

    cur = conn.execute(_PG_RAISE, (resource, token))
    if cur.fetchone() is not None:
        return
    row = conn.execute(_PG_READ, (resource,)).fetchone()
    if row is None:
        raise errors.Error(f"fencekv.sqlfence: the fence of {resource!r} vanished after a refusal")
    stale = _stale(resource, int(row[0]), token)
    # Abort the transaction, so that a careless commit cannot land what it
    # wrote: fencekv_fence raises FK001 for the stale token (and without the
    # function, its absence raises 42883: aborted all the same).
    try:
        conn.execute("SELECT fencekv_fence(%s, %s)", (resource, token))
    except psycopg.Error as e:
        raise stale from e
    raise stale


def _interrupter(conn: Any, d: str) -> Callable[[], None]:
    """A function that stops conn's running statement, from another thread."""
    if d == "sqlite":
        f: Callable[[], None] = conn.interrupt
        return f
    f = getattr(conn, "cancel_safe", None) or conn.cancel
    return f


@contextmanager
def with_lock(client: "Client", conn: Any, name: Bytes, ttl: Duration = 10.0, *,
              resource: Optional[str] = None, wait: Duration = 0,
              margin: Optional[Duration] = None) -> Iterator["Lease"]:
    """Run the ``with`` block in a transaction of ``conn`` under the fencekv
    lock ``name``::

        with sqlfence.with_lock(client, conn, "inventory", ttl=10, wait=5) as lease:
            conn.execute("UPDATE stock SET qty = qty - 1 WHERE sku = %s", (sku,))

    It acquires the lock (``client.lock(name, ttl, wait=, margin=)``,
    renewed while the block runs), begins a transaction (SQLite:
    ``BEGIN IMMEDIATE``), checks the lease's token against ``resource``'s
    fence (default: the lock's name), runs the block, and commits, then
    releases the lock. The connection must not be in a transaction when it
    is entered.

    It never commits once the lease may be lost: right before the commit it
    calls ``lease.check()``, and the :class:`fencekv.LeaseLost` it raises
    rolls the transaction back; a statement still running when the lease
    is lost is interrupted (psycopg's cancel, sqlite3's interrupt). A commit
    sent just before the loss may reach the database after it; a newer
    holder's check then waits on the fence row's lock until that commit
    ends, so the commits still come in token order.

    An exception in the block rolls the transaction back and propagates; a
    stale token raises :class:`fencekv.StaleToken` before the block runs.
    """
    d = dialect(conn)
    res = name if resource is None else resource
    if isinstance(res, bytes):
        res = res.decode("utf-8")
    _check_resource(res)
    implicit = d == "sqlite" and getattr(conn, "autocommit", None) is False
    if d == "sqlite" and conn.in_transaction and not implicit:
        raise errors.BadRequest("fencekv.sqlfence: with_lock begins the transaction: the "
                                "connection is already in one")
    if d == "postgres" and not _pg_idle(conn):
        raise errors.BadRequest("fencekv.sqlfence: with_lock begins the transaction: the "
                                "connection is already in one")
    with client.lock(name, ttl, wait=wait, margin=margin) as lease:
        done = threading.Event()
        interrupt = _interrupter(conn, d)

        def watch() -> None:
            # Wake at the lease's loss, or (a tenth of a second at most
            # later) at the block's end.
            while not done.is_set():
                if lease.lost.wait(0.1):
                    if not done.is_set():
                        interrupt()
                    return

        watcher = threading.Thread(target=watch, name=f"fencekv-sqlfence {lease.name}",
                                   daemon=True)
        watcher.start()
        try:
            if d == "sqlite":
                yield from _sqlite_tx(conn, res, lease, implicit, done)
            else:
                yield from _pg_tx(conn, res, lease, done)
        finally:
            done.set()
            watcher.join()


def _sqlite_tx(conn: sqlite3.Connection, resource: str, lease: "Lease", implicit: bool,
               done: threading.Event) -> Iterator["Lease"]:
    if not implicit:
        conn.execute("BEGIN IMMEDIATE")
    try:
        check(conn, resource, lease.token)
        yield lease
        # The last moment to stop: a lease that may be lost does not commit.
        lease.check()
        done.set()
        conn.commit()
    except BaseException:
        done.set()
        conn.rollback()
        raise


def _pg_tx(conn: Any, resource: str, lease: "Lease", done: threading.Event) -> Iterator["Lease"]:
    # conn.transaction(): BEGIN, and COMMIT at its end unless something
    # was raised in it, whatever the connection's autocommit.
    with conn.transaction():
        try:
            check(conn, resource, lease.token)
            yield lease
            # The last moment to stop: a lease that may be lost does not commit.
            lease.check()
        finally:
            done.set()
