#!/usr/bin/env node
// Benchmark: get and fenced put through this client, 1 and 16 concurrent
// callers on one Client, against a fencekv serve started here; beside the
// npm `redis` client against redis-server (if installed) on the same
// machine: GET, SET, and SET behind a fence check in Lua (the same rule as
// fencekv's put with a token, without its durability), and SET on a redis
// with appendfsync always (durable, as fencekv's writes are).
//
//   npm ci && npx tsc && node bench.mjs [seconds per case, default 1] [rounds, default 3]
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
const secs = Number(process.argv[2] ?? 1);
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

const value = Buffer.alloc(100, 120);
const rounds = Number(process.argv[3] ?? 3);

// ---- servers
let bin = process.env.FENCEKV_BIN;
if (!bin) {
  bin = join(tmp, "fencekv");
  execFileSync("go", ["build", "-o", bin, "./cmd/fencekv"], { cwd: join(here, "../.."), stdio: "inherit" });
}
const fport = await freePort();
await startAndWait(bin, ["serve", "--data", join(tmp, "data"), "--listen", `127.0.0.1:${fport}`, "--http", ""], /fencekv serving/);
const c = new Client({ addrs: `127.0.0.1:${fport}` });
await c.put("bench/get", value);
const { token } = await c.acquire("bench/L", { ttl: "1h" });

// case name -> n -> op
const cases = [
  ["fencekv get", () => c.get("bench/get")],
  ["fencekv put (token)", (i) => c.put(`bench/k${i % 1000}`, value, { token })],
];
const redisBin = process.env.REDIS_SERVER ?? "redis-server";
let redisOk = true;
try {
  execFileSync(redisBin, ["--version"], { stdio: "ignore" });
} catch {
  redisOk = false;
  console.log("redis-server missing: no comparison (install with apt-get install redis-server)");
}
const redisClients = [];
if (redisOk) {
  const { createClient } = await import("redis");
  const start = async (extra) => {
    const port = await freePort();
    await startAndWait(redisBin, ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--dir", tmp, ...extra], /Ready to accept connections/);
    const r = createClient({ url: `redis://127.0.0.1:${port}` });
    r.on("error", () => {});
    await r.connect();
    redisClients.push(r);
    return r;
  };
  const r = await start(["--appendonly", "no"]);
  // Durable writes, as fencekv's are (fdatasync before the answer).
  const ra = await start(["--appendonly", "yes", "--appendfsync", "always", "--appendfilename", "bench.aof"]);
  await r.set("bench/get", value);
  // The fence rule of fencekv's put with a token, as a script.
  const fence = `local f = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < f then return redis.error_reply('stale_token') end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2]) return f`;
  const sha = await r.scriptLoad(fence);
  cases.push(
    ["redis GET", () => r.get("bench/get")],
    ["redis SET", (i) => r.set(`bench/k${i % 1000}`, value)],
    ["redis EVALSHA fence+HSET", (i) => r.evalSha(sha, { keys: [`bench/f${i % 1000}`], arguments: [String(token), value.toString()] })],
    ["redis SET (appendfsync always)", (i) => ra.set(`bench/k${i % 1000}`, value)],
  );
}

// Rounds: every case once per round, so that the ratios compare runs made
// at nearly the same time on a machine whose load varies.
const results = new Map(); // `${name}/${n}` -> [{rate, us}] per round
for (let round = 0; round < rounds; round++) {
  for (const n of [1, 16]) {
    for (const [name, op] of cases) {
      const r = await run(n, op);
      const k = `${name}/${n}`;
      if (!results.has(k)) results.set(k, []);
      results.get(k).push(r);
    }
  }
}
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
};
console.log(`${rounds} rounds of ${secs} s per case; medians (Node ${process.version}):`);
for (const n of [1, 16]) {
  for (const [name] of cases) {
    const rs = results.get(`${name}/${n}`);
    console.log(`${name.padEnd(34)} ${String(n).padStart(2)} callers  ${Math.round(median(rs.map((r) => r.rate))).toString().padStart(7)} calls/s  ${median(rs.map((r) => r.us)).toFixed(1).padStart(7)} µs/call`);
  }
}
if (redisOk) {
  const ratio = (a, b, n) => {
    const ra = results.get(`${a}/${n}`);
    const rb = results.get(`${b}/${n}`);
    return median(ra.map((x, i) => x.us / rb[i].us)).toFixed(2);
  };
  console.log("\nper-call cost, fencekv / redis (median of the rounds' ratios; below 1: fencekv cheaper):");
  for (const n of [1, 16]) {
    console.log(
      `  ${String(n).padStart(2)} callers: get ${ratio("fencekv get", "redis GET", n)}x   put vs durable SET ${ratio("fencekv put (token)", "redis SET (appendfsync always)", n)}x` +
        `   put vs SET ${ratio("fencekv put (token)", "redis SET", n)}x   put vs fence script ${ratio("fencekv put (token)", "redis EVALSHA fence+HSET", n)}x`,
    );
  }
}
await c.close();
for (const r of redisClients) await r.quit();
for (const p of children) await stop(p);
