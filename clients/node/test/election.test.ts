// election (wire/PROTOCOL.md §12) against a real fencekv serve.

import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { BadRequestError, Client, election, LeaseLostError, NotHolderError, StaleTokenError, TooLargeError } from "../src/index.js";
import { Server, waitFor } from "./harness.js";

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
