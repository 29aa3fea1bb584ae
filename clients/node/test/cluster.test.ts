// C08 against a real three-node cluster started here.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { Client, isUnknownOutcome, LeaseExpiredError, LeaseLostError, NotHolderError, UnavailableError } from "../src/index.js";
import { Cluster, waitFor } from "./harness.js";

let cl: Cluster;
before(async () => {
  cl = await Cluster.start(3);
});
after(async () => {
  await cl.stop();
});

async function leaderIndex(cl: Cluster, except = -1): Promise<number> {
  return waitFor(
    "a leader",
    async () => {
      for (let i = 0; i < cl.nodes.length; i++) {
        if (i === except) continue;
        const c = new Client({ addrs: cl.addrs[i]!, timeout: 1000 });
        try {
          const st = await c.status();
          if (st.role === "leader") return i + 1;
        } catch {
          // not up yet
        } finally {
          await c.close();
        }
      }
      return 0;
    },
    30_000,
    100,
  ).then((i) => i - 1);
}

test("C08 leader kill -9 under held writes: tokens rise, acknowledged writes kept, unknown outcomes reported", async (t) => {
  const leader = await leaderIndex(cl);
  const c = new Client({ addrs: cl.addrs, timeout: 2000 });
  const acked = new Map<string, number>(); // key -> token it was written with
  const unknown: string[] = [];
  const notApplied: string[] = [];
  const tokens: number[] = [];
  let lost = 0;
  let seq = 0;
  let killedAt = -1;
  let ackedAfterKill = 0;
  const until = performance.now() + 45_000;
  try {
    while (performance.now() < until && ackedAfterKill < 30) {
      try {
        await c.withLock("c08/L", { ttl: "3s", wait: "10s" }, async (lease, signal) => {
          tokens.push(lease.token);
          while (!signal.aborted && ackedAfterKill < 30) {
            const key = `c08/${seq++}`;
            try {
              const r = await c.put(key, String(lease.token), { lease });
              assert.equal(r.fence, lease.token);
              acked.set(key, lease.token);
              if (killedAt >= 0) ackedAfterKill++;
            } catch (e) {
              if (isUnknownOutcome(e)) unknown.push(key);
              else if (e instanceof LeaseLostError || e instanceof NotHolderError || e instanceof LeaseExpiredError) break;
              else if (e instanceof UnavailableError) notApplied.push(key);
              else throw e;
            }
            if (killedAt < 0 && acked.size >= 20) {
              killedAt = performance.now();
              await cl.nodes[leader]!.kill("SIGKILL");
            }
          }
        });
      } catch (e) {
        if (e instanceof LeaseLostError || e instanceof UnavailableError) {
          lost++;
          continue;
        }
        throw e;
      }
    }
    assert.ok(killedAt >= 0, "the leader was killed");
    assert.ok(ackedAfterKill >= 30, `held writes went on after the kill (${ackedAfterKill})`);
    for (let i = 1; i < tokens.length; i++) assert.ok(tokens[i]! > tokens[i - 1]!, `tokens rise: ${tokens.join(",")}`);
    const reader = new Client({ addrs: cl.addrs.filter((_, i) => i !== leader), timeout: 5000 });
    try {
      for (const [key, token] of acked) {
        const e = await reader.get(key);
        assert.ok(e.found, `acknowledged write ${key} is readable`);
        assert.equal(e.value?.toString(), String(token));
        assert.equal(e.fence, token);
      }
    } finally {
      await reader.close();
    }
    t.diagnostic(
      `writes acknowledged ${acked.size} (${ackedAfterKill} after the kill), unknown outcome ${unknown.length}, ` +
        `not applied ${notApplied.length}, grants ${tokens.length} (${tokens.join(",")}), leases lost ${lost}`,
    );
  } finally {
    await c.close();
  }
});
