// The conformance scenarios of clients/CONFORMANCE.md (all but C08, which
// is in cluster.test.ts), each against a real fencekv serve started here.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { writeFileSync, readFileSync } from "node:fs";
import { join } from "node:path";
import {
  BadRequestError,
  Client,
  CompactedError,
  CompareFailedError,
  ConnectionError,
  FencekvError,
  LeaseExpiredError,
  LeaseLostError,
  LockHeldError,
  NotHolderError,
  NotIntegerError,
  PermissionDeniedError,
  TLSRequiredError,
  StaleTokenError,
  TooLargeError,
  UnauthenticatedError,
  UnknownMethodError,
  type WatchEvent,
} from "../src/index.js";
import { CutProxy, fencekvBin, Server, silentListener, tempDir, waitFor } from "./harness.js";

function isA<T>(cls: abstract new (...a: never[]) => T, check?: (e: T) => void) {
  return (e: unknown) => {
    assert.ok(e instanceof cls, `want ${cls.name}, got ${(e as Error)?.constructor?.name}: ${(e as Error)?.message}`);
    check?.(e as T);
    return true;
  };
}

/** next event within ms, or fail. */
async function nextWithin(it: AsyncIterator<WatchEvent>, ms = 10_000): Promise<WatchEvent> {
  let t: NodeJS.Timeout | undefined;
  const r = await Promise.race([
    it.next(),
    new Promise<never>((_, rej) => {
      t = setTimeout(() => rej(new Error(`no watch event within ${ms} ms`)), ms);
    }),
  ]);
  clearTimeout(t);
  assert.ok(!r.done, "the watch ended");
  return r.value;
}

describe("one server", () => {
  let srv: Server;
  const clients: Client[] = [];
  const client = (o: Partial<ConstructorParameters<typeof Client>[0]> = {}) => {
    const c = new Client({ addrs: srv.addr, timeout: 5000, ...o });
    clients.push(c);
    return c;
  };
  before(async () => {
    srv = await Server.start();
  });
  after(async () => {
    for (const c of clients) await c.close();
    await srv.stop();
  });

  test("C01 seed: A's lease expires while A is paused; B's token fences A's late write", async () => {
    const a = client();
    const b = client();
    const ga = await a.acquire("c01/L", { ttl: 300, holder: "A" });
    // B queues; A is "paused" (does not renew) and its lease runs out.
    const gb = await b.acquire("c01/L", { ttl: 10_000, wait: "5s", holder: "B" });
    assert.ok(gb.token > ga.token, `t'=${gb.token} > t=${ga.token}`);
    await b.put("c01/k", "B's value", { token: gb.token });
    await assert.rejects(a.put("c01/k", "A's value", { token: ga.token }), isA(StaleTokenError, (e) => assert.equal(e.fence, gb.token)));
    const e = await b.get("c01/k");
    assert.equal(e.value?.toString(), "B's value");
    assert.equal(e.fence, gb.token);
    await b.release("c01/L", gb.token);
  });

  test("C02 held write after expiry: refused lease_expired, the key unchanged", async () => {
    const c = client();
    const g = await c.acquire("c02/L", { ttl: 150 });
    await c.put("c02/k", "before", { token: g.token, lock: "c02/L" });
    await waitFor("the lease to run out", async () => {
      const i = await c.lockInfo("c02/L");
      return !i.held || i.ttlMs === 0;
    });
    await assert.rejects(
      c.put("c02/k", "after", { token: g.token, lock: "c02/L" }),
      (e) => e instanceof LeaseExpiredError || e instanceof NotHolderError,
    );
    const e = await c.get("c02/k");
    assert.equal(e.value?.toString(), "before");
    // The same through a Lease: once lost, the write is not even sent.
    const lease = await c.lock("c02/L2", { ttl: 1000 });
    await lease.release();
    await c.put("c02/k2", "held", { lease }).then(
      () => assert.fail("a held write after release was accepted"),
      (err) => assert.ok(err instanceof NotHolderError || err instanceof LeaseExpiredError, String(err)),
    );
    assert.equal((await c.get("c02/k2")).found, false);
  });

  test("C03 fence survives delete", async () => {
    const c = client();
    await c.put("c03/k", "v", { token: 5 });
    const d = await c.delete("c03/k", { token: 5 });
    assert.equal(d.deleted, true);
    await assert.rejects(c.put("c03/k", "old", { token: 4 }), isA(StaleTokenError, (e) => assert.equal(e.fence, 5)));
    const e = await c.get("c03/k");
    assert.equal(e.found, false);
    assert.equal(e.value, null);
    assert.equal(e.fence, 5);
  });

  test("C04 FIFO queued acquires", async () => {
    const a = client();
    const b = client();
    const cc = client();
    const ga = await a.acquire("c04/L", { ttl: 10_000, holder: "A" });
    const order: string[] = [];
    const pb = b.acquire("c04/L", { ttl: 10_000, wait: 10_000, holder: "B" }).then((g) => (order.push("B"), g));
    await waitFor("B queued", async () => (await a.lockInfo("c04/L")).waiters === 1);
    const pc = cc.acquire("c04/L", { ttl: 10_000, wait: 10_000, holder: "C" }).then((g) => (order.push("C"), g));
    await waitFor("C queued", async () => (await a.lockInfo("c04/L")).waiters === 2);
    await a.release("c04/L", ga.token);
    const gb = await pb;
    const info = await a.lockInfo("c04/L");
    assert.equal(info.holder, "B");
    assert.equal(info.token, gb.token);
    assert.equal(info.waiters, 1);
    assert.deepEqual(order, ["B"]);
    await b.release("c04/L", gb.token);
    const gc = await pc;
    assert.deepEqual(order, ["B", "C"]);
    assert.ok(gc.token > gb.token, `C's ${gc.token} > B's ${gb.token}`);
    await cc.release("c04/L", gc.token);
  });

  test("C05 lost grant found by its holder name", async () => {
    const proxy = await CutProxy.start(srv.addr);
    try {
      const admin = client();
      const c = client({ addrs: proxy.addr });
      await c.ping();
      // A bare acquire whose answer is lost: its outcome is unknown.
      proxy.cutNext = true;
      await assert.rejects(
        c.acquire("c05/bare", { ttl: 1000 }),
        isA(ConnectionError, (e) => {
          assert.equal(e.sent, true);
          assert.equal(e.outcomeUnknown, true);
        }),
      );
      const before = (await admin.status()).lastToken;
      proxy.cutNext = true;
      const lease = await c.lock("c05/L", { ttl: 5000 });
      assert.equal(proxy.cuts, 2, "the answer to the acquire was cut");
      const info = await admin.lockInfo("c05/L");
      assert.ok(info.held);
      assert.equal(info.holder, lease.holder);
      assert.match(lease.holder, /^[^:]+:\d+:[0-9a-f]{12}$/);
      assert.equal(lease.token, info.token, "the client holds the grant the server made");
      assert.equal((await admin.status()).lastToken, before + 1, "no second grant");
      assert.equal(lease.token, before + 1);
      assert.equal(lease.lost, false);
      await lease.release();
      assert.equal((await admin.lockInfo("c05/L")).held, false);
    } finally {
      proxy.close();
    }
  });

  test("C11 refusal codes arrive as their classes, with their facts", async () => {
    const c = client();
    await c.put("c11/k", "v", { token: 10 });
    await assert.rejects(c.put("c11/k", "v", { token: 9 }), isA(StaleTokenError, (e) => {
      assert.equal(e.code, "stale_token");
      assert.equal(e.fence, 10);
    }));
    await assert.rejects(c.renew("c11/never", 1), isA(NotHolderError, (e) => assert.equal(e.token, 0)));
    const held = await c.acquire("c11/L", { ttl: 10_000, holder: "h1" });
    await assert.rejects(c.renew("c11/L", held.token + 1000), isA(NotHolderError, (e) => assert.equal(e.token, held.token)));
    await assert.rejects(c.acquire("c11/L", { ttl: 1000 }), isA(LockHeldError, (e) => {
      assert.equal(e.code, "lock_held");
      assert.equal(e.holder, "h1");
      assert.equal(e.token, held.token);
      assert.ok(e.retryAfterMs > 0 && e.retryAfterMs <= 10_000, `retryAfterMs ${e.retryAfterMs}`);
    }));
    const short = await c.acquire("c11/short", { ttl: 100 });
    await waitFor("the lease to run out", async () => {
      const i = await c.lockInfo("c11/short");
      return !i.held || i.ttlMs === 0;
    });
    await assert.rejects(c.renew("c11/short", short.token), isA(LeaseExpiredError, (e) => assert.equal(e.token, short.token)));
    const w = await c.put("c11/cas", "1");
    await assert.rejects(c.cas("c11/cas", w.revision + 100, "2"), isA(CompareFailedError, (e) => assert.equal(e.revision, w.revision)));
    await c.put("c11/n", "abc");
    await assert.rejects(c.incr("c11/n", 1), isA(NotIntegerError, (e) => assert.equal(e.code, "not_integer")));
    await assert.rejects(c.put("c11/big", Buffer.alloc(1024 * 1024 + 1)), isA(TooLargeError));
    await assert.rejects(c.acquire("c11/bad", { ttl: 10 }), isA(BadRequestError));
    await assert.rejects(c.call("no_such_method"), isA(UnknownMethodError, (e) => assert.equal(e.code, "unknown_method")));
    for (const E of [StaleTokenError, NotHolderError, LockHeldError, UnknownMethodError]) assert.ok(E.prototype instanceof FencekvError);
    await c.release("c11/L", held.token);
  });

  test("C12 bad input refused with the server's code, nothing changed", async () => {
    const c = client();
    const st0 = await c.status();
    await assert.rejects(c.put("", "v"), isA(BadRequestError));
    await assert.rejects(c.get(""), isA(BadRequestError));
    await assert.rejects(c.put("k".repeat(4097), "v"), isA(TooLargeError));
    await assert.rejects(c.put("c12/k", "v", { strict: true }), isA(BadRequestError));
    await assert.rejects(c.acquire("c12/L", { ttl: 50 }), isA(BadRequestError));
    await assert.rejects(c.acquire("c12/L", { ttl: "2h" }), isA(BadRequestError));
    await assert.rejects(c.acquire("", { ttl: "1s" }), isA(BadRequestError));
    await assert.rejects(c.put("c12/k", "v", { lock: "c12/L" }), isA(BadRequestError));
    const st1 = await c.status();
    assert.equal(st1.revision, st0.revision, "no write applied");
    assert.equal(st1.lastToken, st0.lastToken, "no grant made");
    assert.equal((await c.get("c12/k")).found, false);
    assert.equal((await c.lockInfo("c12/L")).held, false);
  });

  test("C14 a silent node passed over within the timeout", async () => {
    const silent = await silentListener();
    try {
      const c = client({ addrs: [silent.addr, srv.addr], timeout: 1500 });
      const t0 = performance.now();
      await c.put("c14/k", "v");
      const took = performance.now() - t0;
      assert.ok(took < 1500, `took ${took} ms`);
      assert.equal(c.addr, srv.addr);
      assert.equal((await c.get("c14/k")).value?.toString(), "v");
    } finally {
      silent.close();
    }
  });

  test("pipelining: many calls in flight on one connection, matched by msgid", async () => {
    const c = client();
    const n = 500;
    const rs = await Promise.all(Array.from({ length: n }, (_, i) => c.put(`pipe/${i}`, String(i))));
    assert.equal(new Set(rs.map((r) => r.revision)).size, n);
    const gs = await Promise.all(Array.from({ length: n }, (_, i) => c.get(`pipe/${i}`)));
    gs.forEach((g, i) => assert.equal(g.value?.toString(), String(i)));
    let count = 0;
    for await (const e of c.scanAll({ prefix: "pipe/", limit: 64 })) {
      assert.ok(e.key.toString().startsWith("pipe/"));
      count++;
    }
    assert.equal(count, n);
    const t = await c.txn({ ops: [{ op: "put", key: "txn/a", value: "1" }, { op: "incr", key: "txn/n", delta: 5 }] });
    assert.equal(t.results.length, 2);
    assert.equal(t.results[1]!.value, 5);
  });
});

describe("restarts and stops", () => {
  test("C06 lease kept through a kill -9 and restart within the TTL", async () => {
    const s = await Server.start();
    const c = new Client({ addrs: s.addr, timeout: 1000 });
    try {
      const token = await c.withLock("c06/L", { ttl: 3000 }, async (lease, signal) => {
        await s.restart();
        const restarted = performance.now();
        const n = lease.renewals;
        await waitFor("a renew on the new process", () => lease.renewals > n, 3000);
        // Held past a whole TTL after the kill, renewed on the new process.
        await waitFor("a TTL after the restart", () => performance.now() - restarted > 3000 && lease.renewals > n + 1, 8000);
        assert.equal(signal.aborted, false, "the lease was not lost");
        const info = await c.lockInfo("c06/L");
        assert.ok(info.held);
        assert.equal(info.token, lease.token, "the token is unchanged");
        return lease.token;
      });
      assert.equal((await c.lockInfo("c06/L")).held, false, "released after the callback");
      assert.ok(token > 0);
    } finally {
      await c.close();
      await s.stop();
    }
  });

  test("C07 loss signalled before the server could expire the lease (SIGSTOP)", async () => {
    const s = await Server.start();
    const c = new Client({ addrs: s.addr, timeout: 1000 });
    try {
      const ttl = 1000;
      const t0 = performance.now(); // the grant is made after this
      const lease = await c.lock("c07/L", { ttl });
      let lostAt = 0;
      lease.signal.addEventListener("abort", () => (lostAt = performance.now()));
      process.kill(s.pid, "SIGSTOP");
      try {
        await waitFor("the loss signal", () => lease.lost, 5000, 5);
        assert.ok(lostAt < t0 + ttl, `lost at +${(lostAt - t0).toFixed(1)} ms, the server could expire it at +${ttl} ms at the earliest`);
        assert.ok(lease.signal.reason instanceof LeaseLostError);
        await assert.rejects(c.put("c07/k", "late", { lease }), isA(LeaseLostError)); // not even sent
      } finally {
        process.kill(s.pid, "SIGCONT");
      }
      await lease.release(); // the server, back, says it is not ours any more
      assert.equal((await c.get("c07/k")).found, false);
    } finally {
      await c.close();
      await s.stop();
    }
  });

  test("C09 watch resumed across a restart with no gap and no repeat; compacted when it cannot", async () => {
    const s = await Server.start();
    const c = new Client({ addrs: s.addr, timeout: 2000 });
    try {
      for (let i = 1; i <= 3; i++) await c.put(`c09/${i}`, `v${i}`);
      const w = c.watch("c09/", { startRevision: 2, locks: true });
      const it = w[Symbol.asyncIterator]();
      const got: WatchEvent[] = [];
      for (let i = 0; i < 2; i++) got.push(await nextWithin(it));
      await s.restart();
      for (let i = 4; i <= 6; i++) await c.put(`c09/${i}`, `v${i}`);
      for (let i = 0; i < 3; i++) got.push(await nextWithin(it));
      assert.deepEqual(
        got.map((e) => e.revision),
        [2, 3, 4, 5, 6],
      );
      assert.deepEqual(
        got.map((e) => (e.type === "put" ? `${e.key}=${e.value}` : e.type)),
        ["c09/2=v2", "c09/3=v3", "c09/4=v4", "c09/5=v5", "c09/6=v6"],
      );
      w.close();
      assert.deepEqual(await it.next(), { value: undefined, done: true });
      // The history is durable: the restarted server replays from the
      // first revision on.
      const w2 = c.watch("c09/", { startRevision: 1 });
      const it2 = w2[Symbol.asyncIterator]();
      const first = await nextWithin(it2);
      assert.equal(first.revision, 1);
      assert.ok(first.type === "put" && first.key.toString() === "c09/1");
      w2.close();
    } finally {
      await c.close();
      await s.stop();
    }
  });

  test("C13 no reuse of a closed connection", async () => {
    const s = await Server.start();
    const c = new Client({ addrs: s.addr, timeout: 2000 });
    try {
      await c.put("c13/k", "1");
      const old = c.current;
      await s.restart();
      const e = await c.get("c13/k");
      assert.equal(e.value?.toString(), "1");
      assert.notEqual(c.current, old, "a new connection");
      await c.put("c13/k2", "2"); // never sent on the dead connection: no unknown outcome
      assert.equal((await c.get("c13/k2")).value?.toString(), "2");
      await s.kill("SIGKILL");
      await assert.rejects(
        c.put("c13/k3", "3"),
        isA(ConnectionError, (err) => {
          assert.equal(err.sent, false);
          assert.equal(err.outcomeUnknown, false);
        }),
      );
    } finally {
      await c.close();
      await s.kill();
    }
  });
});

describe("TLS and auth", () => {
  test("C10 TLS with the server's CA and a principal's secret; wrong secret; rights; plain client", async (t) => {
    const dir = tempDir();
    try {
      execFileSync("openssl", ["version"], { stdio: "ignore" });
    } catch {
      t.skip("openssl missing: cannot make certificates");
      return;
    }
    const run = (...a: string[]) => execFileSync("openssl", a, { cwd: dir, stdio: "pipe" });
    run("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "1", "-subj", "/CN=fencekv-test-ca");
    run("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=127.0.0.1");
    writeFileSync(join(dir, "ext.cnf"), "subjectAltName=IP:127.0.0.1\n");
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-out", "srv.pem", "-days", "1", "-extfile", "ext.cnf");
    const hash = execFileSync(fencekvBin(), ["auth", "hash"], { input: "s3cret" }).toString().trim();
    writeFileSync(join(dir, "auth"), `app ${hash} write:app/ lock:app/\n`);
    const s = await Server.start({
      args: ["--tls-cert", join(dir, "srv.pem"), "--tls-key", join(dir, "srv.key"), "--auth-file", join(dir, "auth")],
    });
    const ca = readFileSync(join(dir, "ca.pem"));
    const good = new Client({ addrs: s.addr, tls: { ca }, user: "app", secret: "s3cret", timeout: 5000 });
    const bad = new Client({ addrs: s.addr, tls: { ca }, user: "app", secret: "wrong", timeout: 5000 });
    const plain = new Client({ addrs: s.addr, timeout: 3000 });
    try {
      await good.put("app/x", "1");
      assert.equal((await good.get("app/x")).value?.toString(), "1");
      await good.withLock("app/L", { ttl: "2s" }, async (lease) => {
        await good.put("app/y", "2", { lease });
      });
      await assert.rejects(good.put("other/x", "1"), isA(PermissionDeniedError));
      await assert.rejects(good.status(), isA(PermissionDeniedError));
      await assert.rejects(bad.get("app/x"), isA(UnauthenticatedError));
      const t0 = performance.now();
      await assert.rejects(plain.get("app/x"), isA(TLSRequiredError, (e) => assert.match(e.message, /requires TLS/)));
      assert.ok(performance.now() - t0 < 3000, "not left hanging");
    } finally {
      await good.close();
      await bad.close();
      await plain.close();
      await s.stop();
    }
  });
});
