// Pieces that need no server: durations, the framer, error classes, and a
// fake server whose malformed answers must fail calls, not hang them.

import { test } from "node:test";
import assert from "node:assert/strict";
import * as net from "node:net";
import { encode } from "@msgpack/msgpack";
import {
  Client,
  ConnectionError,
  FencekvError,
  fromWire,
  LimitExceededError,
  LockHeldError,
  StaleTokenError,
  toMs,
  UnavailableError,
} from "../src/index.js";
import { messageEnd } from "../src/framing.js";

test("durations: ms numbers and Go-style strings", () => {
  assert.equal(toMs(250), 250);
  assert.equal(toMs("10s"), 10_000);
  assert.equal(toMs("500ms"), 500);
  assert.equal(toMs("1m30s"), 90_000);
  assert.equal(toMs("1.5h"), 5_400_000);
  assert.equal(toMs("0.5ms"), 1);
  assert.throws(() => toMs("ten seconds"), FencekvError);
  assert.throws(() => toMs(-1), FencekvError);
});

test("framer: every MessagePack type, cut at every byte", () => {
  const msg = [1, 300, null, { s: "x".repeat(40), b: new Uint8Array(300), n: -5, big: 2 ** 40, f: 1.5, arr: [1, [2, { a: true }]], m: new Map([["k", "v"]]) }];
  const bytes = encode(msg);
  for (let cut = 0; cut < bytes.length; cut++) assert.equal(messageEnd(bytes.subarray(0, cut), 0), -1, `cut at ${cut}`);
  assert.equal(messageEnd(bytes, 0), bytes.length);
  const two = new Uint8Array([...bytes, ...bytes]);
  assert.equal(messageEnd(two, bytes.length), two.length);
  assert.throws(() => messageEnd(new Uint8Array([0xc1]), 0), FencekvError);
});

test("error maps become their classes with their facts", () => {
  const e = fromWire({ code: "stale_token", message: "token 33 is below fence 34", fence: 34 });
  assert.ok(e instanceof StaleTokenError);
  assert.equal((e as StaleTokenError).fence, 34);
  const h = fromWire({ code: "lock_held", message: "held", holder: "h", token: 7, retry_ms: 120 }) as LockHeldError;
  assert.ok(h instanceof LockHeldError);
  assert.deepEqual([h.holder, h.token, h.retryAfterMs], ["h", 7, 120]);
  const u = fromWire({ code: "unavailable", message: "no leader", outcome: "unknown" });
  assert.ok(u instanceof UnavailableError && u.outcomeUnknown);
  const x = fromWire({ code: "some_future_code", message: "new" });
  assert.equal(x.constructor, FencekvError);
  assert.equal(x.code, "some_future_code");
});

/** A fake server answering each request with answer(msgid). */
async function fake(answer: (id: number, sock: net.Socket) => void): Promise<{ addr: string; close: () => void }> {
  const socks: net.Socket[] = [];
  const srv = net.createServer((s) => {
    socks.push(s);
    s.on("error", () => {});
    s.on("data", (d) => {
      // The client's requests here are small: one per chunk is enough to
      // read the msgid of the first.
      const id = d[2]!;
      answer(id, s);
    });
  });
  await new Promise<void>((r) => srv.listen(0, "127.0.0.1", () => r()));
  return {
    addr: `127.0.0.1:${(srv.address() as net.AddressInfo).port}`,
    close: () => {
      for (const s of socks) s.destroy();
      srv.close();
    },
  };
}

test("a malformed answer is an error, not a hang", async () => {
  for (const bad of [
    (id: number) => encode([1, id]), // a response of 2 elements
    () => new Uint8Array([0xc1]), // not MessagePack
    (id: number) => encode([1, id, null, "not a map"]),
    () => encode("hello"), // not an array
  ]) {
    const f = await fake((id, s) => s.write(bad(id)));
    const c = new Client({ addrs: f.addr, timeout: 2000 });
    try {
      const t0 = performance.now();
      await assert.rejects(c.put("k", "v"), (e: unknown) => e instanceof FencekvError && !(e.constructor === Object));
      assert.ok(performance.now() - t0 < 1500, `failed at once (${bad.toString()})`);
    } finally {
      await c.close();
      f.close();
    }
  }
});

test("the server's error notification fails the calls with its refusal", async () => {
  const f = await fake((_id, s) => {
    s.write(encode([2, "error", [{ code: "limit_exceeded", message: "too many connections (limit 1)" }]]));
    s.end();
  });
  const c = new Client({ addrs: f.addr, timeout: 2000 });
  try {
    await assert.rejects(c.get("k"), LimitExceededError);
  } finally {
    await c.close();
    f.close();
  }
});

test("a call that is never answered times out; a write's outcome is then unknown", async () => {
  const f = await fake(() => {});
  const c = new Client({ addrs: f.addr, timeout: 200 });
  try {
    await assert.rejects(c.put("k", "v"), (e: unknown) => e instanceof ConnectionError && e.outcomeUnknown && e.sent);
    await assert.rejects(c.get("k"), (e: unknown) => e instanceof ConnectionError && !e.outcomeUnknown);
  } finally {
    await c.close();
    f.close();
  }
});

test("a short timeout after a long one still fires on time (one sweep timer per connection)", async () => {
  const f = await fake(() => {});
  const c = new Client({ addrs: f.addr, timeout: 5000 });
  try {
    const long = c.get("k").catch((e: unknown) => e);
    const t0 = performance.now();
    await assert.rejects(c.get("k", { timeout: 100 }), (e: unknown) => e instanceof ConnectionError);
    const took = performance.now() - t0;
    assert.ok(took >= 99 && took < 600, `timed out after ${took} ms`);
    await c.close();
    assert.ok((await long) instanceof FencekvError);
  } finally {
    await c.close();
    f.close();
  }
});
