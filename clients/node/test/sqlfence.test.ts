// sqlfence against a real PostgreSQL (started here, see pgserver.ts) and a
// real fencekv server: the fence of docs/databases.md, checked through pg in
// the transaction that writes the data. The PostgreSQL part is skipped, in
// one line, without a server or without the pg module.

import { after, afterEach, before, beforeEach, describe, test } from "node:test";
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type pgTypes from "pg";
import { BadRequestError, Client, LeaseLostError, StaleTokenError, sqlfence } from "../src/index.js";
import { Server, waitFor } from "./harness.js";
import { loadPg, missing, type Pg, Postgres } from "./pgserver.js";

function repoRoot(): string {
  for (let d = dirname(fileURLToPath(import.meta.url)); ; d = dirname(d)) {
    if (existsSync(join(d, "sqlfence", "postgres.sql"))) return d;
    if (dirname(d) === d) throw new Error("the repository's sqlfence/postgres.sql was not found");
  }
}

test("the schema is the repository's sqlfence/postgres.sql", () => {
  assert.equal(sqlfence.schema, readFileSync(join(repoRoot(), "sqlfence", "postgres.sql"), "utf8"));
});

function isA<T>(cls: abstract new (...a: never[]) => T, check?: (e: T) => void) {
  return (e: unknown) => {
    assert.ok(e instanceof cls, `want ${cls.name}, got ${(e as Error)?.constructor?.name}: ${(e as Error)?.message}`);
    check?.(e as T);
    return true;
  };
}

/** A pg error with this SQLSTATE. */
function sqlstate(code: string) {
  return (e: unknown) => {
    assert.equal((e as { code?: string }).code, code, `want SQLSTATE ${code}, got ${String(e)}`);
    return true;
  };
}

const why = await missing();

describe("sqlfence on PostgreSQL", { skip: why }, () => {
  let pg: Pg;
  let pgsrv: Postgres;
  let srv: Server;
  let db = "";
  const conns: pgTypes.Client[] = [];
  const clients: Client[] = [];

  const open = async (): Promise<pgTypes.Client> => {
    const c = new pg.Client(pgsrv.config(db));
    await c.connect();
    conns.push(c);
    return c;
  };
  const client = (addr = srv.addr) => {
    const c = new Client({ addrs: addr, timeout: 5000 });
    clients.push(c);
    return c;
  };
  const stock = async (): Promise<[number, string]> => {
    const c = await open();
    const r = await c.query("SELECT qty, writer FROM stock WHERE sku = 'apple'");
    await c.end();
    const row = r.rows[0] as { qty: number; writer: string };
    return [row.qty, row.writer];
  };
  const fenceOf = async (resource: string): Promise<number> => {
    const c = await open();
    const r = await c.query("SELECT token FROM fencekv_fences WHERE resource = $1", [resource]);
    await c.end();
    return r.rows.length ? Number((r.rows[0] as { token: string }).token) : 0;
  };
  /** The fenced write: begin, check, update, commit. */
  const write = async (conn: pgTypes.Client, token: number, qty: number, writer: string) => {
    await conn.query("BEGIN");
    await sqlfence.check(conn, "inventory", token);
    await conn.query("UPDATE stock SET qty = $1, writer = $2 WHERE sku = 'apple'", [qty, writer]);
    await conn.query("COMMIT");
  };
  /** A token whose lease ran out: its holder paused (never renewed). */
  const expiredGrant = async (c: Client, name: string): Promise<number> => {
    const g = await c.acquire(name, { ttl: 200 });
    await waitFor(`${name}'s lease to run out`, async () => !(await c.lockInfo(name)).held);
    return g.token;
  };
  /** The sessions of db waiting for a lock. */
  const waiters = async (): Promise<number> => {
    const c = await open();
    const r = await c.query("SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'");
    await c.end();
    return r.rows.length;
  };

  before(async () => {
    pg = (await loadPg())!;
    pgsrv = await Postgres.start(pg);
    srv = await Server.start();
  });
  after(async () => {
    for (const c of clients) await c.close().catch(() => {});
    for (const c of conns) await c.end().catch(() => {});
    await srv?.stop();
    await pgsrv?.stop();
  });
  afterEach(async () => {
    for (const c of conns.splice(0)) await c.end().catch(() => {});
  });
  beforeEach(async () => {
    db = await pgsrv.newDB();
    const c = await open();
    await sqlfence.install(c);
    await sqlfence.install(c); // applying it again changes nothing
    await c.query("CREATE TABLE stock (sku text PRIMARY KEY, qty int NOT NULL, writer text NOT NULL)");
    await c.query("INSERT INTO stock VALUES ('apple', 10, '')");
  });

  test("seed: A's stale token is refused with the fence and its transaction aborted", async () => {
    const c = client();
    const aToken = await expiredGrant(c, "inventory");
    const bToken = await c.withLock("inventory", { ttl: 10_000 }, async (b) => {
      assert.ok(b.token > aToken);
      await write(await open(), b.token, 7, "B");
      return b.token;
    });
    const a = await open();
    await a.query("BEGIN");
    await a.query("UPDATE stock SET qty = 3, writer = 'A' WHERE sku = 'apple'");
    await assert.rejects(sqlfence.check(a, "inventory", aToken), isA(StaleTokenError, (e) => {
      assert.equal(e.code, "stale_token");
      assert.equal(e.fence, bToken);
      assert.equal(Buffer.from(e.key as Uint8Array).toString(), "inventory");
      assert.equal((e.cause as { code?: string }).code, "FK001");
    }));
    await assert.rejects(a.query("UPDATE stock SET qty = 4 WHERE sku = 'apple'"), sqlstate("25P02"));
    assert.equal(a.getTransactionStatus(), "E"); // (pg's status lags a refused query's answer by one message)
    await a.query("COMMIT"); // careless: PostgreSQL rolls an aborted transaction back
    assert.deepEqual(await stock(), [7, "B"]);
    assert.equal(await fenceOf("inventory"), bToken);
    // The same holder checks again: an equal token holds.
    await write(await open(), bToken, 6, "B");
    assert.deepEqual(await stock(), [6, "B"]);
  });

  test("the fence survives a fencekv kill -9", async () => {
    const own = await Server.start();
    try {
      let c = client(own.addr);
      const old = await expiredGrant(c, "inventory");
      const g = await c.acquire("inventory", { ttl: 1000 });
      await write(await open(), g.token, 7, "B");
      await c.close();
      await own.restart();
      const conn = await open();
      await conn.query("BEGIN");
      await assert.rejects(sqlfence.check(conn, "inventory", old), isA(StaleTokenError, (e) => assert.equal(e.fence, g.token)));
      await conn.query("ROLLBACK");
      c = client(own.addr);
      await waitFor("the lease to run out", async () => !(await c.lockInfo("inventory")).held, 15_000);
      const token = await c.withLock("inventory", { ttl: 10_000 }, async (lease) => {
        assert.ok(lease.token > g.token);
        await write(conn, lease.token, 5, "C");
        return lease.token;
      });
      assert.deepEqual(await stock(), [5, "C"]);
      assert.equal(await fenceOf("inventory"), token);
    } finally {
      await own.stop();
    }
  });

  test("overlap under READ COMMITTED: the stale one began first and commits last, refused", async () => {
    await write(await open(), 32, 9, "earlier"); // the fence row exists
    const a = await open();
    await a.query("BEGIN ISOLATION LEVEL READ COMMITTED");
    assert.equal((await a.query("SELECT qty FROM stock WHERE sku = 'apple'")).rows[0].qty, 9);
    await write(await open(), 34, 7, "B");
    await assert.rejects(sqlfence.check(a, "inventory", 33), isA(StaleTokenError, (e) => assert.equal(e.fence, 34)));
    await a.query("ROLLBACK");
    assert.deepEqual(await stock(), [7, "B"]);
  });

  test("concurrent checks commit in token order", async () => {
    const a = await open();
    await a.query("BEGIN");
    await sqlfence.check(a, "inventory", 33);
    const b = write(await open(), 34, 7, "B"); // waits on the fence row
    await waitFor("B to wait on the fence row", async () => (await waiters()) === 1);
    await a.query("UPDATE stock SET qty = 3, writer = 'A' WHERE sku = 'apple'");
    await a.query("COMMIT");
    await b;
    assert.deepEqual(await stock(), [7, "B"]);
    const c = await open();
    await c.query("BEGIN");
    await assert.rejects(sqlfence.check(c, "inventory", 33), isA(StaleTokenError));
  });

  test("what it does not promise: checked, then paused, A's write still lands first", async () => {
    const a = await open();
    await a.query("BEGIN");
    await sqlfence.check(a, "inventory", 33);
    // A holds the fence row's lock: B's check waits (bounded: 55P03).
    const bt = await open();
    await bt.query("BEGIN");
    await bt.query("SET LOCAL lock_timeout = '50ms'");
    await assert.rejects(sqlfence.check(bt, "inventory", 34), sqlstate("55P03"));
    await bt.query("ROLLBACK");
    const b = write(await open(), 34, 7, "B");
    await waitFor("B to wait on the fence row", async () => (await waiters()) === 1);
    await a.query("UPDATE stock SET qty = 3, writer = 'A' WHERE sku = 'apple'");
    await a.query("COMMIT"); // A's late write lands: the fence does not bound how late
    await b;
    assert.deepEqual(await stock(), [7, "B"]); // and B's commit comes after it
    assert.equal(await fenceOf("inventory"), 34);
  });

  test("withLock commits under a held lease, never once it may be lost", async () => {
    const c = client();
    const other = client();
    const conn = await open();
    const token = await sqlfence.withLock(c, conn, "inventory", { ttl: 1000 }, async (lease) => {
      await conn.query("UPDATE stock SET qty = 8, writer = 'withLock' WHERE sku = 'apple'");
      return lease.token;
    });
    assert.deepEqual(await stock(), [8, "withLock"]);
    assert.equal(await fenceOf("inventory"), token);
    assert.equal(conn.getTransactionStatus(), "I");

    // Released behind its back: the next renew is refused, the signal aborts,
    // and fn returning normally does not commit.
    await assert.rejects(sqlfence.withLock(c, conn, "inventory", { ttl: 1000 }, async (lease, signal) => {
      await conn.query("UPDATE stock SET qty = 1, writer = 'lost' WHERE sku = 'apple'");
      await other.release("inventory", lease.token);
      await waitFor("the refused renew to lose the lease", () => signal.aborted);
    }), isA(LeaseLostError));
    assert.deepEqual(await stock(), [8, "withLock"]);
    assert.equal(conn.getTransactionStatus(), "I");

    // fn throws: rolled back, thrown again, the lock released.
    const boom = new Error("boom");
    await assert.rejects(sqlfence.withLock(c, conn, "inventory", { ttl: 5000 }, async () => {
      await conn.query("UPDATE stock SET qty = 2, writer = 'threw' WHERE sku = 'apple'");
      throw boom;
    }), (e) => e === boom);
    assert.deepEqual(await stock(), [8, "withLock"]);
    assert.equal((await c.lockInfo("inventory")).held, false);

    // A stale lease (the fence is ahead of the lock's tokens): fn is not called.
    await write(await open(), 2 ** 53 - 1, 9, "ahead");
    let called = false;
    await assert.rejects(sqlfence.withLock(c, conn, "inventory", { ttl: 5000 }, () => { called = true; }), isA(StaleTokenError));
    assert.equal(called, false);
    assert.deepEqual(await stock(), [9, "ahead"]);

    // Already in a transaction: refused before the lock is taken.
    await conn.query("BEGIN");
    await assert.rejects(sqlfence.withLock(c, conn, "inventory2", { ttl: 5000 }, () => {}), isA(BadRequestError));
    await assert.rejects(sqlfence.withLock(c, conn, "inventory2", { ttl: 5000, isolation: "chaos" as "serializable" }, () => {}), isA(BadRequestError));
    assert.equal((await c.lockInfo("inventory2")).held, false);
    await conn.query("ROLLBACK");
  });

  test("bad input is a BadRequestError and sends nothing", async () => {
    const conn = await open();
    await conn.query("BEGIN");
    let sent = 0;
    const counted: sqlfence.PgConnection = {
      query: (text, values) => { sent++; return conn.query(text, values); },
      getTransactionStatus: () => conn.getTransactionStatus(),
    };
    const bad: [unknown, unknown][] = [
      ["inventory", 0], ["inventory", -1], ["inventory", 0n], ["inventory", 2n ** 63n], ["inventory", 2 ** 63],
      ["inventory", 1.5], ["inventory", Number.NaN], ["inventory", "5"], ["inventory", true], ["inventory", null],
      ["", 5], ["x".repeat(1025), 5], ["é".repeat(513), 5], [Buffer.from("inventory"), 5], [undefined, 5],
    ];
    for (const [resource, token] of bad) {
      await assert.rejects(sqlfence.check(counted, resource as string, token as number), isA(BadRequestError, (e) => assert.equal(e.code, "bad_request")),
        `check(${String(resource).slice(0, 20)}, ${String(token)})`);
    }
    assert.equal(sent, 0);
    // The limits themselves hold.
    await sqlfence.check(counted, "x".repeat(1024), sqlfence.MAX_TOKEN);
    await sqlfence.check(counted, "é".repeat(512), 1);
    assert.ok(sent > 0);
    await conn.query("ROLLBACK");

    // No transaction: the check would commit alone.
    const idle = await open();
    await assert.rejects(sqlfence.check(idle, "inventory", 5), isA(BadRequestError));
    // A pool: each query may run on another connection.
    const pool = new pg.Pool(pgsrv.config(db));
    await assert.rejects(sqlfence.check(pool as unknown as sqlfence.PgConnection, "inventory", 5), isA(BadRequestError));
    assert.equal(pool.totalCount, 0);
    await pool.end();
    await assert.rejects(sqlfence.check({} as sqlfence.PgConnection, "inventory", 5), TypeError);
    assert.equal(await fenceOf("inventory"), 0);
    assert.equal(await fenceOf("x".repeat(1024)), 0);
  });
});
