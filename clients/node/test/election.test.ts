// election (wire/PROTOCOL.md §12) against a real fencekv serve.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError, Client, election, LeaseLostError, NotHolderError, StaleTokenError, TooLargeError } from "../src/index.js";
import { CutProxy, Server, waitFor } from "./harness.js";

describe("election", () => {
  let srv: Server;
  const clients: Client[] = [];
  const client = () => {
    const c = new Client({ addrs: srv.addr, timeout: 5000 });
    clients.push(c);
    return c;
  };
  before(async () => {
    srv = await Server.start();
  });
  after(async () => {
    for (const c of clients) await c.close().catch(() => {});
    await srv.stop();
  });
  const queued = (c: Client, name: string, n: number) => waitFor(`${n} queued on ${name}`, async () => (await c.lockInfo(name)).waiters === n);

  test("C16 campaign waits while another leads and wins on resign with a higher epoch", async () => {
    const ca = client();
    const cb = client();
    assert.deepEqual(await election.leader(ca, "e1"), { name: "e1", held: false, value: "", epoch: 0, ttlMs: 0 });
    const a = await election.campaign(ca, "e1", "a", { ttl: "10s" });
    const got = await election.leader(cb, "e1");
    assert.equal(got.held, true);
    assert.equal(got.value, "a");
    assert.equal(got.epoch, a.epoch);
    let bDone = false;
    const bp = election.campaign(cb, "e1", "b", { ttl: "10s" }).then((l) => {
      bDone = true;
      return l;
    });
    await queued(ca, "e1", 1);
    assert.equal(bDone, false);
    await a.resign();
    const b = await bp;
    assert.ok(b.epoch > a.epoch, `${b.epoch} > ${a.epoch}`);
    assert.equal(b.value, "b");
    await a.resign(); // again: nothing
    await assert.rejects(ca.put("e1/out", "a", { token: a.epoch, lock: "e1" }), NotHolderError);
    await cb.put("e1/out", "b", { lease: b.lease });
    await b.resign();
    assert.equal((await election.leader(ca, "e1")).held, false);
  });

  test("C16 a lost leadership aborts its signal; the deposed epoch is refused", async () => {
    const c = client();
    const a = await election.campaign(c, "e2", "a", { ttl: "1s" });
    await c.release("e2", a.epoch); // taken away behind its back
    await waitFor("the loss to be noticed", () => a.lost);
    assert.throws(() => a.check(), LeaseLostError);
    const b = await election.campaign(c, "e2", "b", { ttl: "10s" });
    assert.ok(b.epoch > a.epoch);
    await c.put("e2/k", "b", { token: b.epoch });
    await assert.rejects(c.put("e2/k", "a", { token: a.epoch }), StaleTokenError);
    await a.resign();
    assert.equal((await election.leader(c, "e2")).value, "b");
    await b.resign();
  });

  test("C16 observe starts with the leader and sees each change, epochs rising, the last one seen", async () => {
    const c = client();
    const a = await election.campaign(c, "e3", "a", { ttl: "10s" });
    const ctl = new AbortController();
    const seen: election.Leader[] = [];
    const loop = (async () => {
      for await (const s of election.observe(c, "e3", { signal: ctl.signal })) seen.push(s);
    })();
    await waitFor("the first state", () => seen.length >= 1);
    assert.deepEqual([seen[0].held, seen[0].value, seen[0].epoch], [true, "a", a.epoch]);
    const x = await c.acquire("e3x", { ttl: "10s" }); // shares the prefix: not reported
    await c.release("e3x", x.token);
    await c.put("e3", "key noise");
    const bp = election.campaign(c, "e3", "b", { ttl: "10s" });
    await queued(c, "e3", 1);
    await a.resign();
    const b = await bp;
    await waitFor("b's leadership", () => seen.length >= 2);
    assert.deepEqual([seen[1].held, seen[1].value, seen[1].epoch], [true, "b", b.epoch]);
    await b.resign();
    await waitFor("no leader", () => seen.length >= 3);
    assert.equal(seen[2].held, false);
    let last: election.Leadership | undefined;
    for (let i = 0; i < 15; i++) {
      last = await election.campaign(c, "e3", `c${i}`, { ttl: "10s" });
      if (i < 14) await last.resign();
    }
    await waitFor("the final leader", () => seen[seen.length - 1].epoch === last!.epoch);
    assert.equal(seen[seen.length - 1].value, "c14");
    const held = seen.filter((s) => s.held).map((s) => s.epoch);
    for (let i = 1; i < held.length; i++) assert.ok(held[i] > held[i - 1], `epochs ${held}`);
    ctl.abort();
    await loop;
    await last!.resign();
  });

  test("C16 an aborted campaign leaves no lease behind", async () => {
    const ca = client();
    const cb = client();
    const a = await election.campaign(ca, "e4", "a", { ttl: "10s" });
    const ctl = new AbortController();
    const bp = election.campaign(cb, "e4", "b", { ttl: "10s", signal: ctl.signal });
    await queued(ca, "e4", 1);
    ctl.abort();
    await assert.rejects(bp);
    await a.resign();
    await waitFor("no lease left", async () => {
      const i = await ca.lockInfo("e4");
      return !i.held && i.waiters === 0;
    });
  });

  test("C16 bad input is a typed error and takes nothing", async () => {
    const c = client();
    await assert.rejects(election.campaign(c, "", "v"), BadRequestError);
    await assert.rejects(election.campaign(c, "e5", ""), BadRequestError);
    await assert.rejects(election.campaign(c, "e5", "v".repeat(4097)), TooLargeError);
    await assert.rejects(election.campaign(c, "e5", "v", { ttl: 0 }), BadRequestError);
    await assert.rejects(election.campaign(c, "e5", "v", { ttl: "1s", margin: "1s" }), BadRequestError);
    await assert.rejects(election.campaign(c, "e5", "v", { ttl: 10, margin: 0 }), BadRequestError);
    await assert.rejects(election.leader(c, ""), BadRequestError);
    await assert.rejects(election.observe(c, "").next(), BadRequestError);
    assert.equal((await c.lockInfo("e5")).held, false);
  });
});

describe("election across server trouble", () => {
  const clients: Client[] = [];
  const servers: Server[] = [];
  const proxies: CutProxy[] = [];
  const start = async () => {
    const s = await Server.start();
    servers.push(s);
    return s;
  };
  const client = (addr: string, timeout = 5000) => {
    const c = new Client({ addrs: addr, timeout });
    clients.push(c);
    return c;
  };
  after(async () => {
    for (const c of clients) await c.close().catch(() => {});
    for (const p of proxies) p.close();
    for (const s of servers) {
      if (s.proc.exitCode === null && s.proc.signalCode === null) process.kill(s.pid, "SIGCONT");
      await s.stop();
    }
  });
  const queued = (c: Client, name: string, n: number) => waitFor(`${n} queued on ${name}`, async () => (await c.lockInfo(name)).waiters === n);
  const track = (p: Promise<election.Leadership>) => {
    const st: { done: boolean; p: Promise<election.Leadership> } = { done: false, p };
    p.then(
      () => (st.done = true),
      () => (st.done = true),
    );
    return st;
  };

  test("C16 hand-over is first come, first served, with rising epochs", async () => {
    const s = await start();
    const [ca, cb, cc] = [client(s.addr), client(s.addr), client(s.addr)];
    const a = await election.campaign(ca, "f", "a", { ttl: "10s" });
    const b = track(election.campaign(cb, "f", "b", { ttl: "10s" }));
    await queued(ca, "f", 1);
    const c = track(election.campaign(cc, "f", "c", { ttl: "10s" }));
    await queued(ca, "f", 2);
    assert.equal(b.done || c.done, false, "a candidate led while a leads");
    await a.resign();
    const bl = await b.p;
    assert.equal(bl.value, "b");
    assert.ok(bl.epoch > a.epoch, `${bl.epoch} > ${a.epoch}`);
    assert.equal((await ca.lockInfo("f")).waiters, 1);
    assert.equal(c.done, false, "c led before b resigned");
    const mid = await election.leader(ca, "f");
    assert.deepEqual([mid.held, mid.value, mid.epoch], [true, "b", bl.epoch]);
    await assert.rejects(ca.put("f/out", "a", { token: a.epoch, lock: "f" }), NotHolderError);
    await cb.put("f/out", "b", { lease: bl.lease });
    await bl.resign();
    const cl = await c.p;
    assert.equal(cl.value, "c");
    assert.ok(cl.epoch > bl.epoch, `${cl.epoch} > ${bl.epoch}`);
    const now = await election.leader(ca, "f");
    assert.deepEqual([now.held, now.value, now.epoch], [true, "c", cl.epoch]);
    await cc.put("f/fenced", "c", { token: cl.epoch });
    await assert.rejects(cb.put("f/fenced", "b", { token: bl.epoch }), StaleTokenError);
    assert.equal((await ca.get("f/fenced"))?.value?.toString(), "c");
    await cl.resign();
    assert.equal((await election.leader(ca, "f")).held, false);
  });

  test("C16 an acquire whose answer was lost is looked up, released, and the campaign goes on", async () => {
    const s = await start();
    const p = await CutProxy.start(s.addr);
    proxies.push(p);
    const cb = client(p.addr, 2000);
    const c = client(s.addr);
    await cb.ping();
    let first: Awaited<ReturnType<Client["lockInfo"]>> | undefined;
    p.onCut = async () => (first = await c.lockInfo("g"));
    p.cutNext = true; // the acquire's answer: held back, then the connection cut
    const t0 = performance.now();
    const bl = await election.campaign(cb, "g", "b", { ttl: "30s", wait: "1s" });
    const took = performance.now() - t0;
    assert.equal(p.cuts, 1, "no answer was cut");
    assert.ok(first && first.held && first.holder === "b", `the lost grant: ${JSON.stringify(first)}`);
    assert.ok(bl.epoch > first.token, `led with ${bl.epoch}, the lost grant was ${first.token}`);
    assert.ok(took < 15000, `took ${took} ms: the lost grant was waited out`);
    const now = await c.lockInfo("g");
    assert.deepEqual([now.held, now.holder, now.token], [true, "b", bl.epoch]);
    await assert.rejects(c.put("g/out", "x", { token: first.token, lock: "g" }), NotHolderError);
    await c.put("g/out", "b", { token: bl.epoch, lock: "g" });
    await bl.resign();
    assert.equal((await c.lockInfo("g")).held, false);
  });

  test("C16 a leader whose renewals stop (server stopped past the TTL) is lost on its own clock; the next leads higher", async () => {
    const s = await start();
    const ca = client(s.addr, 300);
    const cb = client(s.addr);
    const a = await election.campaign(ca, "h", "a", { ttl: "1s" });
    let lostAt = 0;
    a.signal.addEventListener("abort", () => (lostAt = performance.now()));
    const b = track(election.campaign(cb, "h", "b", { ttl: "10s" }));
    await queued(ca, "h", 1);
    process.kill(s.pid, "SIGSTOP");
    const stopped = performance.now();
    try {
      await waitFor("a to take its leadership as lost", () => a.lost);
      assert.ok(performance.now() - stopped < 1000, `lost ${performance.now() - stopped} ms after the stop: not within the TTL`);
      await waitFor("the TTL to pass", () => performance.now() - stopped > 1300);
      assert.equal(b.done, false, "b led while the server was stopped");
    } finally {
      process.kill(s.pid, "SIGCONT");
    }
    const bl = await b.p;
    const ledAt = performance.now();
    assert.ok(lostAt > 0 && lostAt < ledAt, "a's loss signal did not fire before b led");
    assert.ok(bl.epoch > a.epoch, `${bl.epoch} > ${a.epoch}`);
    assert.throws(() => a.check(), LeaseLostError);
    await cb.put("h/out", "b", { lease: bl.lease });
    await assert.rejects(cb.put("h/out", "a", { token: a.epoch, lock: "h" }), NotHolderError);
    await assert.rejects(cb.put("h/out", "a", { token: a.epoch }), StaleTokenError);
    await a.resign(); // lost: its release is refused, b keeps leading
    assert.equal((await election.leader(cb, "h")).value, "b");
    await bl.resign();
  });

  test("C16 the server killed with -9 and restarted during a campaign: the leader keeps its lease, the campaign queues again", async () => {
    const s = await start();
    const ca = client(s.addr, 2000);
    const cb = client(s.addr, 2000);
    const a = await election.campaign(ca, "k", "a", { ttl: "5s" });
    const b = track(election.campaign(cb, "k", "b", { ttl: "5s" }));
    await queued(ca, "k", 1);
    await s.restart();
    await queued(ca, "k", 1);
    assert.equal(b.done, false, "b led while a leads");
    assert.equal(a.lost, false, "a's lease was lost across the restart");
    const got = await election.leader(ca, "k");
    assert.deepEqual([got.held, got.value, got.epoch], [true, "a", a.epoch]);
    await a.resign();
    const bl = await b.p;
    assert.ok(bl.epoch > a.epoch, `${bl.epoch} > ${a.epoch}`);
    assert.equal((await election.leader(ca, "k")).value, "b");
    await bl.resign();
    assert.equal((await election.leader(ca, "k")).held, false);
  });

  test("C16 observe goes on across a kill -9 and restart of the server", async () => {
    const s = await start();
    const c = client(s.addr, 2000);
    const ob = client(s.addr, 2000);
    const ctl = new AbortController();
    const seen: election.Leader[] = [];
    const loop = (async () => {
      for await (const st of election.observe(ob, "o", { signal: ctl.signal })) seen.push(st);
    })();
    await waitFor("the first state", () => seen.length >= 1);
    assert.equal(seen[0].held, false);
    const a = await election.campaign(c, "o", "a", { ttl: "10s" });
    await waitFor("a's leadership", () => seen.length >= 2);
    await a.resign();
    await waitFor("no leader", () => seen.length >= 3);
    assert.deepEqual(
      seen.slice(0, 3).map((x) => [x.held, x.value]),
      [[false, ""], [true, "a"], [false, ""]],
    );
    assert.equal(seen[1].epoch, a.epoch);
    await s.restart();
    const r = await election.campaign(c, "o", "r", { ttl: "10s" });
    await waitFor("r's leadership after the restart", () => seen[seen.length - 1].held && seen[seen.length - 1].epoch === r.epoch, 20_000);
    assert.equal(seen[seen.length - 1].value, "r");
    await r.resign();
    await waitFor("no leader after r", () => !seen[seen.length - 1].held);
    let top = 0;
    for (let i = 0; i < seen.length; i++) {
      const x = seen[i];
      if (i > 0) {
        const y = seen[i - 1];
        assert.ok(!(x.held === y.held && x.value === y.value && x.epoch === y.epoch), `a repeat at ${i}: ${JSON.stringify(seen)}`);
      }
      if (x.held) {
        assert.ok(x.epoch > top, `epochs ${JSON.stringify(seen)}`);
        top = x.epoch;
      }
    }
    ctl.abort();
    await loop;
  });
});
