// C15 Semaphores (clients/CONFORMANCE.md): acquire with a limit, permits
// with tokens of their own, FIFO waiters, held writes by a permit's token,
// lockInfo's limit and holders, limit_mismatch and bad limits changing
// nothing, the lock helper holding a permit, a lost permit found by its
// holder name among the holders.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import {
  BadRequestError,
  Client,
  FencekvError,
  LeaseExpiredError,
  LimitMismatchError,
  LockHeldError,
  NotHolderError,
  type Grant,
} from "../src/index.js";
import { CutProxy, Server, waitFor } from "./harness.js";

function isA<T>(cls: abstract new (...a: never[]) => T, check?: (e: T) => void) {
  return (e: unknown) => {
    assert.ok(e instanceof cls, `want ${cls.name}, got ${(e as Error)?.constructor?.name}: ${(e as Error)?.message}`);
    check?.(e as T);
    return true;
  };
}

const permits = (hs: { holder: string; token: number }[]) => hs.map((h) => [h.holder, h.token]);

describe("C15 semaphores", () => {
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

  test("C15 limit 3: three permits with rising tokens, a fourth waits for the first released", async () => {
    const c = client();
    const d = client();
    const gs: Grant[] = [];
    for (let i = 0; i < 3; i++) gs.push(await c.acquire("c15/L", { ttl: 10_000, holder: `h${i}`, limit: 3 }));
    const t = gs.map((g) => g.token);
    assert.ok(t[0]! < t[1]! && t[1]! < t[2]!, `tokens ${t}`);
    let info = await c.lockInfo("c15/L");
    assert.equal(info.held, true);
    assert.equal(info.limit, 3);
    assert.deepEqual(permits(info.holders), [["h0", t[0]], ["h1", t[1]], ["h2", t[2]]]);
    assert.ok(info.holders.every((h) => h.ttlMs > 0 && h.ttlMs <= 10_000));
    assert.equal(info.holder, "h2");
    assert.equal(info.token, t[2]);
    await assert.rejects(
      d.acquire("c15/L", { ttl: 10_000, holder: "h3", limit: 3 }),
      isA(LockHeldError, (e) => {
        assert.equal(e.token, t[0]); // the permit that runs out first
        assert.equal(e.holder, "h0");
      }),
    );
    let fourthDone = false;
    const fourth = d.acquire("c15/L", { ttl: 10_000, wait: 10_000, holder: "h3", limit: 3 }).finally(() => {
      fourthDone = true;
    });
    await waitFor("the fourth queued", async () => (await c.lockInfo("c15/L")).waiters === 1);
    assert.equal(fourthDone, false);
    await c.release("c15/L", t[0]!);
    const g4 = await fourth;
    assert.ok(g4.token > t[2]!);
    info = await c.lockInfo("c15/L");
    assert.equal(info.waiters, 0);
    assert.deepEqual(permits(info.holders), [["h1", t[1]], ["h2", t[2]], ["h3", g4.token]]);
    const listed = (await c.locks({ prefix: "c15/L" })).locks.filter((l) => l.lock === "c15/L");
    assert.equal(listed.length, 1);
    assert.equal(listed[0]!.limit, 3);
    assert.deepEqual(
      listed[0]!.holders.map((h) => h.token),
      [t[1], t[2], g4.token],
    );
    for (const tok of [t[1]!, t[2]!, g4.token]) await c.release("c15/L", tok);
    info = await c.lockInfo("c15/L");
    assert.equal(info.held, false);
    assert.deepEqual(info.holders, []);
  });

  test("C15 a held write with a permit's token: accepted while held, not_holder after its release", async () => {
    const c = client();
    const a = await c.acquire("c15/w", { ttl: 10_000, limit: 2 });
    const b = await c.acquire("c15/w", { ttl: 10_000, limit: 2 });
    await c.put("c15/w/k", "a", { token: a.token, lock: "c15/w" });
    await c.put("c15/w/k", "b", { token: b.token, lock: "c15/w" });
    await c.release("c15/w", b.token);
    await assert.rejects(
      c.put("c15/w/k", "late", { token: b.token, lock: "c15/w" }),
      isA(NotHolderError, (e) => assert.equal(e.token, 0)),
    );
    const e = await c.get("c15/w/k");
    assert.equal(e.value?.toString(), "b");
    assert.equal(e.fence, b.token);
    await assert.rejects(c.renew("c15/w", b.token), (err) => err instanceof NotHolderError || err instanceof LeaseExpiredError);
    assert.equal(await c.renew("c15/w", a.token), 10_000);
    await c.release("c15/w", a.token);
  });

  test("C15 limit_mismatch and limits out of range: typed errors, nothing changed", async () => {
    const c = client();
    const g = await c.acquire("c15/m", { ttl: 10_000, holder: "a", limit: 3 });
    const last = (await c.status()).lastToken;
    const unchanged = async () => {
      const info = await c.lockInfo("c15/m");
      assert.equal(info.limit, 3);
      assert.equal(info.waiters, 0);
      assert.deepEqual(permits(info.holders), [["a", g.token]]);
      assert.equal((await c.status()).lastToken, last);
    };
    for (const limit of [2, 4, 256, undefined]) {
      await assert.rejects(
        c.acquire("c15/m", { ttl: 10_000, wait: 1000, holder: "b", limit }),
        isA(LimitMismatchError, (e) => {
          assert.equal(e.code, "limit_mismatch");
          assert.ok(e instanceof FencekvError);
        }),
      );
      await unchanged();
    }
    for (const limit of [0, -1, 257, 2 ** 40]) {
      await assert.rejects(c.acquire("c15/m", { ttl: 10_000, holder: "b", limit }), isA(BadRequestError));
      await unchanged();
    }
    await assert.rejects(c.acquire("c15/m", { ttl: 10_000, limit: 3, lockDelay: 1000 }), isA(BadRequestError));
    await assert.rejects(c.acquire("c15/m", { ttl: 10_000, limit: 2.5 }), isA(BadRequestError));
    await unchanged();
    await c.release("c15/m", g.token);
    // A held plain lock refuses a semaphore acquire; once free, any limit.
    const p = await c.acquire("c15/m", { ttl: 10_000 });
    await assert.rejects(c.acquire("c15/m", { ttl: 10_000, limit: 3 }), isA(LimitMismatchError));
    const info = await c.lockInfo("c15/m");
    assert.equal(info.limit, 1);
    assert.deepEqual(
      info.holders.map((h) => h.token),
      [p.token],
    );
    await c.release("c15/m", p.token);
    assert.ok((await c.acquire("c15/m", { ttl: 10_000, limit: 5 })).token > p.token);
    assert.equal((await c.lockInfo("c15/m")).limit, 5);
  });

  test("C15 the lock helper holds a permit, renews it, and a fourth waits", async () => {
    const c = client();
    const d = client();
    const ttl = 1000;
    const leases = [];
    for (let i = 0; i < 3; i++) leases.push(await c.lock("c15/l", { ttl, limit: 3 }));
    const start = performance.now();
    let fourthDone = false;
    const fourth = d.lock("c15/l", { ttl, wait: 10_000, limit: 3 }).finally(() => {
      fourthDone = true;
    });
    await waitFor("the fourth queued", async () => (await c.lockInfo("c15/l")).waiters === 1);
    // Past two TTLs the permits are still theirs: they were renewed.
    await waitFor("two TTLs", () => performance.now() > start + 2 * ttl);
    const info = await c.lockInfo("c15/l");
    assert.deepEqual(
      info.holders.map((h) => h.token),
      leases.map((l) => l.token),
    );
    assert.deepEqual(new Set(info.holders.map((h) => h.holder)), new Set(leases.map((l) => l.holder)));
    for (const l of leases) {
      assert.equal(l.lost, false);
      await c.put(`c15/l/${l.token}`, "v", { lease: l });
    }
    assert.equal(fourthDone, false);
    await leases[0]!.release();
    const f = await fourth;
    assert.ok(f.token > leases[2]!.token);
    await d.put("c15/l/f", "v", { lease: f });
    for (const l of [...leases.slice(1), f]) {
      assert.equal(l.lost, false);
      await l.release();
    }
    assert.equal((await c.lockInfo("c15/l")).held, false);
  });

  test("C15 a permit whose acquire answer was lost is found among the holders", async () => {
    const proxy = await CutProxy.start(srv.addr);
    try {
      const direct = client();
      const c = client({ addrs: proxy.addr });
      await c.ping();
      const first = await direct.acquire("c15/f", { ttl: 10_000, holder: "other-1", limit: 3 });
      let later: Grant | undefined;
      // Before the lost answer's connection is cut, another holder takes a
      // newer permit: ours is not the newest one.
      proxy.onCut = async () => {
        later = await direct.acquire("c15/f", { ttl: 10_000, holder: "other-2", limit: 3 });
      };
      proxy.cutNext = true;
      const lease = await c.lock("c15/f", { ttl: 5000, limit: 3 });
      assert.equal(proxy.cuts, 1, "the acquire's answer was not cut");
      assert.ok(later);
      const info = await direct.lockInfo("c15/f");
      assert.equal(info.holder, "other-2");
      assert.deepEqual(permits(info.holders), [
        ["other-1", first.token],
        [lease.holder, lease.token],
        ["other-2", later.token],
      ]);
      assert.equal((await direct.status()).lastToken, later.token);
      assert.equal(later.token, lease.token + 1, "no second permit for us");
      await c.put("c15/f/k", "v", { lease });
      await lease.release();
      assert.deepEqual(
        (await direct.lockInfo("c15/f")).holders.map((h) => h.token),
        [first.token, later.token],
      );
    } finally {
      proxy.close();
    }
  });
});
