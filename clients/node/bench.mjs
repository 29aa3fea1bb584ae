#!/usr/bin/env node
// Benchmark: get and fenced put through this client, 1 and 16 concurrent
// callers on one Client, against a fencekv serve started here; beside the
// npm `redis` client against redis-server (if installed) on the same
// machine: GET, SET, and SET behind a fence check in Lua (the same rule as
// fencekv's put with a token, without its durability), and SET on a redis
// with appendfsync always (durable, as fencekv's writes are).
//
//   npm ci && npx tsc && node bench.mjs [seconds per case, default 2]
//
// FENCEKV_BIN: the server binary (default: built from this tree).
// REDIS_SERVER: redis-server (default: from PATH; skipped if missing).

import { execFileSync, spawn } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Client } from "./dist/src/index.js";

const here = dirname(fileURLToPath(import.meta.url));
const secs = Number(process.argv[2] ?? 2);
const tmp = mkdtempSync(join(tmpdir(), "fencekv-bench-"));
const children = [];
process.on("exit", () => {
  for (const p of children) if (p.exitCode === null) try { process.kill(p.pid, "SIGKILL"); } catch {}
  rmSync(tmp, { recursive: true, force: true });
});

function freePort() {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const p = s.address().port;
      s.close(() => res(p));
    });
  });
}

function startAndWait(cmd, args, ready) {
  return new Promise((res, rej) => {
    const p = spawn(cmd, args, { stdio: ["ignore", "pipe", "pipe"] });
    children.push(p);
    let log = "";
    const on = (d) => {
      log += d;
      if (ready.test(log)) res(p);
    };
    p.stdout.setEncoding("utf8").on("data", on);
    p.stderr.setEncoding("utf8").on("data", on);
    p.on("exit", (c) => rej(new Error(`${cmd} exited (${c}):\n${log}`)));
  });
}

async function stop(p) {
  if (p.exitCode !== null) return;
  const done = new Promise((r) => p.once("exit", r));
  process.kill(p.pid, "SIGTERM");
  await done;
}

/** run calls op(i) from n concurrent callers for secs seconds; returns
 * calls per second and the mean latency in µs. */
async function run(n, op) {
  for (let i = 0; i < 200; i++) await op(i); // warm up
  const until = performance.now() + secs * 1000;
  let count = 0;
  let lat = 0;
  await Promise.all(
    Array.from({ length: n }, async (_, w) => {
      let i = w * 1e7;
      while (performance.now() < until) {
        const t0 = performance.now();
        await op(i++);
        lat += performance.now() - t0;
        count++;
      }
    }),
  );
  return { rate: count / secs, us: (lat / count) * 1000 };
}

const rows = [];
function report(name, n, r) {
  rows.push({ name, n, ...r });
  console.log(`${name.padEnd(34)} ${String(n).padStart(2)} callers  ${Math.round(r.rate).toString().padStart(7)} calls/s  ${r.us.toFixed(1).padStart(7)} µs/call`);
}

const value = Buffer.alloc(100, 120);

// ---- fencekv
let bin = process.env.FENCEKV_BIN;
if (!bin) {
  bin = join(tmp, "fencekv");
  execFileSync("go", ["build", "-o", bin, "./cmd/fencekv"], { cwd: join(here, "../.."), stdio: "inherit" });
}
const fport = await freePort();
const fk = await startAndWait(bin, ["serve", "--data", join(tmp, "data"), "--listen", `127.0.0.1:${fport}`, "--http", ""], /fencekv serving/);
const c = new Client({ addrs: `127.0.0.1:${fport}` });
await c.put("bench/get", value);
const { token } = await c.acquire("bench/L", { ttl: "1h" });
for (const n of [1, 16]) {
  report("fencekv get", n, await run(n, () => c.get("bench/get")));
  report("fencekv put (token)", n, await run(n, (i) => c.put(`bench/k${i % 1000}`, value, { token })));
}
await c.close();
await stop(fk);

// ---- redis
const redisBin = process.env.REDIS_SERVER ?? "redis-server";
let redisOk = true;
try {
  execFileSync(redisBin, ["--version"], { stdio: "ignore" });
} catch {
  redisOk = false;
  console.log("redis-server missing: no comparison (install with apt-get install redis-server)");
}
if (redisOk) {
  const { createClient } = await import("redis");
  const rport = await freePort();
  const rs = await startAndWait(redisBin, ["--port", String(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp], /Ready to accept connections/);
  const r = createClient({ url: `redis://127.0.0.1:${rport}` });
  r.on("error", () => {});
  await r.connect();
  await r.set("bench/get", value);
  // The fence rule of fencekv's put with a token, as a script.
  const fence = `local f = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < f then return redis.error_reply('stale_token') end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2]) return f`;
  const sha = await r.scriptLoad(fence);
  for (const n of [1, 16]) {
    report("redis GET", n, await run(n, () => r.get("bench/get")));
    report("redis SET", n, await run(n, (i) => r.set(`bench/k${i % 1000}`, value)));
    report("redis EVALSHA fence+HSET", n, await run(n, (i) => r.evalSha(sha, { keys: [`bench/f${i % 1000}`], arguments: [String(token), value.toString()] })));
  }
  await r.quit();
  await stop(rs);
  // Durable writes, as fencekv's are (fdatasync before the answer).
  const aport = await freePort();
  const as = await startAndWait(redisBin, ["--port", String(aport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", tmp], /Ready to accept connections/);
  const ra = createClient({ url: `redis://127.0.0.1:${aport}` });
  ra.on("error", () => {});
  await ra.connect();
  for (const n of [1, 16]) report("redis SET (appendfsync always)", n, await run(n, (i) => ra.set(`bench/k${i % 1000}`, value)));
  await ra.quit();
  await stop(as);
  const get = (name, n) => rows.find((x) => x.name === name && x.n === n);
  console.log("\nper-call cost, fencekv / redis (1.0 = the same; below 1 = fencekv cheaper):");
  for (const n of [1, 16]) {
    const g = get("fencekv get", n).us / get("redis GET", n).us;
    const p = get("fencekv put (token)", n).us / get("redis SET", n).us;
    const pf = get("fencekv put (token)", n).us / get("redis EVALSHA fence+HSET", n).us;
    const pd = get("fencekv put (token)", n).us / get("redis SET (appendfsync always)", n).us;
    console.log(`  ${String(n).padStart(2)} callers: get ${g.toFixed(2)}x   put vs SET ${p.toFixed(2)}x   put vs fence script ${pf.toFixed(2)}x   put vs durable SET ${pd.toFixed(2)}x`);
  }
}
