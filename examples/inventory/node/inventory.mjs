// Move N units between two rows of an inventory table in PostgreSQL under
// the fencekv lock "inventory", fenced: the transaction checks the lease's
// token against the fence (sqlfence) before it writes, so a holder that
// paused past its lease cannot commit over a newer one.
//
//   FENCEKV_ADDR=127.0.0.1:7420 DATABASE_URL=postgres://localhost/shop \
//       node inventory.mjs apple pear 5

import pg from "pg";
import { Client, StaleTokenError, sqlfence } from "fencekv";

const [from, to, count] = process.argv.slice(2);
const n = Number(count);
if (!to || !Number.isSafeInteger(n) || n < 1) {
  console.error("usage: node inventory.mjs FROM TO N (N a positive integer)");
  process.exit(2);
}

const client = new Client({ addrs: process.env.FENCEKV_ADDR ?? "127.0.0.1:7420" });
const conn = new pg.Client({ connectionString: process.env.DATABASE_URL ?? "postgres://localhost/shop" });
await conn.connect();
try {
  // withLock: acquire (queueing up to 30s), BEGIN, check the token against
  // the fence, run fn, COMMIT unless the lease may be lost (then
  // LeaseLostError and a rollback), release.
  await sqlfence.withLock(client, conn, "inventory", { ttl: 10_000, wait: 30_000 }, async (lease) => {
    const took = await conn.query("UPDATE inventory SET qty = qty - $1 WHERE sku = $2 AND qty >= $1 RETURNING qty", [n, from]);
    if (took.rows.length === 0) throw new Error(`take ${n} from ${from}: not that many (or no such sku)`);
    const put = await conn.query("UPDATE inventory SET qty = qty + $1 WHERE sku = $2 RETURNING qty", [n, to]);
    if (put.rows.length === 0) throw new Error(`put ${n} into ${to}: no such sku`);
    console.log(`moved ${n} from ${from} to ${to} under token ${lease.token}: ${from} ${took.rows[0].qty}, ${to} ${put.rows[0].qty}`);
  });
} catch (e) {
  // A stale token: a newer holder wrote first, nothing of ours landed. Any
  // other error rolled the transaction back and released the lock.
  const what = e instanceof StaleTokenError ? `refused, nothing written: ${e.message} (fence ${e.fence})` : e.message;
  console.error(`inventory: ${what}`);
  process.exitCode = 1;
} finally {
  await conn.end();
  await client.close();
}
