// sqlfence: fencekv's fence for data kept in PostgreSQL, checked through
// node-postgres (`pg`, an optional peer dependency: this module never
// imports it) in the transaction that writes the data, with the statement
// of the Go package sqlfence (sqlfence/postgres.sql, docs/databases.md).
//
//   await conn.query("BEGIN");
//   await sqlfence.check(conn, "inventory", lease.token); // StaleTokenError
//   ... the writes ...
//   await conn.query("COMMIT");

import type { Client, Token } from "./client.js";
import { BadRequestError, FencekvError, StaleTokenError } from "./errors.js";
import type { Lease, LockOptions } from "./lock.js";
import type { Bytes } from "./values.js";

/** The longest resource name, in bytes of UTF-8 (the table's CHECK says the same). */
export const MAX_RESOURCE = 1024;
/** The largest token the fence holds: the SQL bigint's largest value. */
export const MAX_TOKEN = 2n ** 63n - 1n;
/** The fence table the schema creates and check uses. */
export const TABLE = "fencekv_fences";

/** What check needs of a connection: a pg.Client or a pool's client (one
 * connection, so that the check and the writes share its transaction). */
export interface PgConnection {
  query(text: string, values?: unknown[]): Promise<{ rows: unknown[] }>;
  /** pg's "I" (idle), "T" (in a transaction), "E" (in a failed one). */
  getTransactionStatus?(): string | null;
}

const RAISE = `INSERT INTO fencekv_fences AS f (resource, token) VALUES ($1, $2)
ON CONFLICT (resource) DO UPDATE SET token = excluded.token WHERE f.token <= excluded.token
RETURNING f.token`;
const READ = "SELECT token FROM fencekv_fences WHERE resource = $1";

/** The schema: a copy of sqlfence/postgres.sql (a test checks it is the
 * same), the table and the function fencekv_fence. Applying it again
 * changes nothing. */
export const schema = `-- fencekv's fence for data kept in PostgreSQL (12 or later).
--
-- One row per protected resource holds the highest fencing token a
-- transaction of that resource presented. A writer checks its token and
-- raises the fence in one statement, inside the same transaction as its
-- write; a token below the fence is refused and that transaction must not
-- commit. Apply this file with psql or any migration tool; it can be
-- applied again (every statement is idempotent).

CREATE TABLE IF NOT EXISTS fencekv_fences (
    -- The resource's name: usually the fencekv lock's name.
    resource text PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 1024),
    -- The highest token accepted (a fencekv token, 1 to 2^63-1).
    token bigint NOT NULL CHECK (token > 0)
);

-- fencekv_fence(resource, token) checks token against the resource's fence
-- and raises the fence to it, in the caller's transaction. It returns the
-- token when it is not below the fence (an equal token is the same holder
-- again). A stale token raises SQLSTATE FK001 (class FK, "fencekv"), with
-- the message 'stale_token: RESOURCE is fenced at FENCE; token TOKEN
-- refused' and DETAIL 'fence=FENCE token=TOKEN': any driver sees the error,
-- and PostgreSQL will not commit a transaction that raised it. A token of
-- 0 or below, or a NULL, raises SQLSTATE 22023 (invalid_parameter_value).
--
-- The upsert takes the resource's row lock, also when the token is stale:
-- a newer holder's check waits until this transaction ends, so the rule
-- holds under READ COMMITTED as under REPEATABLE READ and SERIALIZABLE.
CREATE OR REPLACE FUNCTION fencekv_fence(p_resource text, p_token bigint)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    current bigint;
BEGIN
    IF p_token IS NULL OR p_token <= 0 THEN
        RAISE EXCEPTION USING
            ERRCODE = '22023',
            MESSAGE = format('bad_request: fencing token %s: want 1 to 9223372036854775807', coalesce(p_token::text, 'NULL'));
    END IF;
    INSERT INTO fencekv_fences AS f (resource, token)
    VALUES (p_resource, p_token)
    ON CONFLICT (resource) DO UPDATE SET token = excluded.token
        WHERE f.token <= excluded.token
    RETURNING f.token INTO current;
    IF NOT FOUND THEN
        SELECT f.token INTO current FROM fencekv_fences AS f WHERE f.resource = p_resource;
        RAISE EXCEPTION USING
            ERRCODE = 'FK001',
            MESSAGE = format('stale_token: %s is fenced at %s; token %s refused', p_resource, current, p_token),
            DETAIL = format('fence=%s token=%s', current, p_token);
    END IF;
    RETURN current;
END
$$;
`;

/** install applies the schema on conn (in one implicit transaction). */
export async function install(conn: PgConnection): Promise<void> {
  await conn.query(schema);
}

function badRequest(message: string): BadRequestError {
  return new BadRequestError("bad_request", `sqlfence: ${message}`, { code: "bad_request", message });
}

function checkResource(resource: unknown): string {
  if (typeof resource !== "string") throw badRequest(`resource name ${String(resource)}: want a string`);
  const n = Buffer.byteLength(resource, "utf8");
  if (n < 1 || n > MAX_RESOURCE) throw badRequest(`resource name of ${n} bytes: want 1 to ${MAX_RESOURCE}`);
  return resource;
}

function checkToken(token: unknown): bigint {
  let t: bigint;
  if (typeof token === "bigint") t = token;
  else if (typeof token === "number" && Number.isSafeInteger(token)) t = BigInt(token);
  else throw badRequest(`fencing token ${String(token)}: want an integer, 1 to ${MAX_TOKEN} (SQL bigint)`);
  if (t < 1n || t > MAX_TOKEN) throw badRequest(`fencing token ${t}: want 1 to ${MAX_TOKEN} (SQL bigint)`);
  return t;
}

function status(conn: PgConnection): string | null | undefined {
  return typeof conn.getTransactionStatus === "function" ? conn.getTransactionStatus() : undefined;
}

function asToken(v: unknown): number | bigint {
  const b = BigInt(v as string | number | bigint);
  return b <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(b) : b;
}

/**
 * check checks token against resource's fence and raises the fence to it,
 * in conn's transaction, in one statement. It resolves if token is not
 * below the fence (an equal token is the same holder again): make the
 * writes it protects, and commit as usual. A token below it rejects with
 * StaleTokenError (`fence`; `key` is the resource), and the transaction is
 * left aborted: only a rollback ends it (a COMMIT rolls it back), so
 * nothing of it lands.
 *
 * The statement takes the resource's row lock until the transaction ends,
 * also when it refuses: a newer holder's check waits, so the order of the
 * tokens is the order of the commits, under every isolation level. Call it
 * before the writes it protects.
 *
 * An empty resource, one over MAX_RESOURCE bytes, a token below 1 or above
 * MAX_TOKEN, or a connection outside a transaction (each statement would
 * commit alone: BEGIN first) reject with BadRequestError, and nothing is
 * sent.
 */
export async function check(conn: PgConnection, resource: string, token: Token): Promise<void> {
  checkResource(resource);
  const t = checkToken(token);
  if (conn === null || typeof conn !== "object" || typeof conn.query !== "function") {
    throw new TypeError("sqlfence: want a pg.Client or a pool's client");
  }
  if ("totalCount" in conn && "idleCount" in conn) {
    throw badRequest("a pool runs each query on any of its connections: check on one client (await pool.connect()), in its transaction");
  }
  if (status(conn) === "I") {
    throw badRequest("the connection is not in a transaction: the check would commit alone, protecting nothing; BEGIN, check, write and COMMIT on one client");
  }
  const r = await conn.query(RAISE, [resource, t.toString()]);
  if (r.rows.length > 0) return;
  const f = await conn.query(READ, [resource]);
  const row = f.rows[0] as { token?: unknown } | undefined;
  if (row?.token === undefined || row.token === null) {
    throw new FencekvError("internal", `sqlfence: the fence of ${resource} vanished after a refusal`);
  }
  const fence = asToken(row.token);
  const message = `${resource} is fenced at ${fence}; token ${t} refused`;
  // Abort the transaction, so that a careless COMMIT cannot land what it
  // wrote: fencekv_fence raises FK001 for the stale token (and without the
  // function, its absence raises 42883: aborted all the same).
  let cause: unknown;
  try {
    await conn.query("SELECT fencekv_fence($1, $2)", [resource, t.toString()]);
  } catch (e) {
    cause = e;
  }
  throw new StaleTokenError("stale_token", message, { code: "stale_token", message, fence, key: Buffer.from(resource, "utf8") }, { cause });
}

/** Options of withLock: the lock's, and the fence's resource. */
export interface SqlLockOptions extends LockOptions {
  /** The fence's resource; default the lock's name. */
  resource?: string;
  /** The transaction's isolation level; default the database's. */
  isolation?: "read committed" | "repeatable read" | "serializable";
}

const ISOLATION = new Set(["read committed", "repeatable read", "serializable"]);

/**
 * withLock runs fn in a transaction of conn under the fencekv lock name: it
 * acquires the lock (client.withLock: renewed while fn runs), sends BEGIN,
 * checks the lease's token against the resource's fence, calls fn(lease,
 * signal), and sends COMMIT, then releases the lock. fn's writes land only
 * if the token was not stale. conn must not be in a transaction.
 *
 * It never commits once the lease may be lost: right before COMMIT it calls
 * lease.check(), and the LeaseLostError rolls the transaction back (and
 * withLock rejects with it). signal aborts when the lease may be lost: pass
 * it on, or check it, to stop early; a statement already running is not
 * interrupted (bound it with statement_timeout). A COMMIT sent just before
 * the loss may reach the database after it; a newer holder's check then
 * waits on the fence row's lock until that commit ends, so the commits
 * still come in token order.
 *
 * fn's error rolls the transaction back and is thrown; a stale token is a
 * StaleTokenError, and fn is not called.
 */
export async function withLock<T>(client: Client, conn: PgConnection, name: Bytes, o: SqlLockOptions,
  fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T): Promise<T> {
  const resource = checkResource(o.resource ?? (typeof name === "string" ? name : Buffer.from(name).toString("utf8")));
  const st = status(conn);
  if (st !== undefined && st !== "I") throw badRequest("withLock begins the transaction: the connection is already in one");
  const { resource: _r, isolation, ...lo } = o;
  void _r;
  if (isolation !== undefined && !ISOLATION.has(isolation)) throw badRequest(`isolation level ${String(isolation)}: want one of ${[...ISOLATION].join(", ")}`);
  return client.withLock(name, lo, async (lease, signal) => {
    await conn.query(isolation ? `BEGIN ISOLATION LEVEL ${isolation.toUpperCase()}` : "BEGIN");
    try {
      await check(conn, resource, lease.token);
      const result = await fn(lease, signal);
      // The last moment to stop: a lease that may be lost does not commit.
      lease.check();
      await conn.query("COMMIT");
      return result;
    } catch (e) {
      await conn.query("ROLLBACK").catch(() => {});
      throw e;
    }
  });
}
