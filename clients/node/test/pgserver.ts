// A PostgreSQL server of the test run's own: initdb into a temporary
// directory, postgres on a free loopback port (as nobody when run as root:
// PostgreSQL refuses to run as root), stopped by its PID. Skipped (see
// missing) without a server or without the pg module.

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { chownSync, existsSync, openSync, readdirSync, readFileSync, closeSync } from "node:fs";
import { join } from "node:path";
import type pgTypes from "pg";
import { freePort, tempDir } from "./harness.js";

export type Pg = typeof pgTypes;

/** The pg module, or undefined when it is not installed. */
export async function loadPg(): Promise<Pg | undefined> {
  try {
    return (await import("pg")).default;
  } catch {
    return undefined;
  }
}

/** $FENCEKV_PG_BIN, or Debian's newest /usr/lib/postgresql/N/bin. */
export function postgresBin(): string | undefined {
  const env = process.env.FENCEKV_PG_BIN;
  if (env) return existsSync(join(env, "postgres")) ? env : undefined;
  const base = "/usr/lib/postgresql";
  if (!existsSync(base)) return undefined;
  const versions = readdirSync(base).filter((v) => /^\d+$/.test(v) && existsSync(join(base, v, "bin", "postgres")));
  versions.sort((a, b) => Number(a) - Number(b));
  return versions.length ? join(base, versions[versions.length - 1]!, "bin") : undefined;
}

/** Why the PostgreSQL tests cannot run, or undefined. */
export async function missing(): Promise<string | undefined> {
  if (!(await loadPg())) return "the pg module is missing; install with npm install (pg is a devDependency)";
  if (!postgresBin()) return "no PostgreSQL server (or none at $FENCEKV_PG_BIN); install with apt-get install postgresql";
  return undefined;
}

export class Postgres {
  proc!: ChildProcess;
  port = 0;
  readonly dir = tempDir("fencekv-node-pg-");
  private dbs = 0;
  private constructor(readonly pg: Pg, readonly bin: string) {}

  static async start(pg: Pg): Promise<Postgres> {
    const p = new Postgres(pg, postgresBin()!);
    const root = process.getuid?.() === 0;
    if (root) chownSync(p.dir, 65534, 65534);
    const as = root ? { uid: 65534, gid: 65534 } : {};
    const data = join(p.dir, "data");
    const env = { ...process.env, LC_ALL: "C" };
    execFileSync(join(p.bin, "initdb"), ["-D", data, "-U", "fencekv", "-A", "trust", "-E", "UTF8", "--no-sync"], { cwd: p.dir, env, stdio: "ignore", ...as });
    for (let attempt = 0; ; attempt++) {
      p.port = await freePort();
      const log = openSync(join(p.dir, "postgres.log"), "a");
      p.proc = spawn(join(p.bin, "postgres"), ["-D", data, "-p", String(p.port), "-k", p.dir, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=40"],
        { cwd: p.dir, env, stdio: ["ignore", log, log], ...as });
      closeSync(log);
      if (await p.ready()) return p;
      if (attempt < 3 && p.proc.exitCode !== null) continue; // the port was taken
      await p.stop();
      throw new Error(`postgres did not start:\n${readFileSync(join(p.dir, "postgres.log"), "utf8").slice(-2000)}`);
    }
  }

  private async ready(): Promise<boolean> {
    const until = performance.now() + 60_000;
    let pause = 5;
    while (performance.now() < until) {
      if (this.proc.exitCode !== null) return false;
      const c = new this.pg.Client(this.config("postgres"));
      try {
        await c.connect();
        await c.end();
        return true;
      } catch {
        await c.end().catch(() => {});
        await new Promise((r) => setTimeout(r, pause));
        pause = Math.min(2 * pause, 50);
      }
    }
    return false;
  }

  config(database: string): pgTypes.ClientConfig {
    return { host: "127.0.0.1", port: this.port, user: "fencekv", database };
  }

  url(database: string): string {
    return `postgres://fencekv@127.0.0.1:${this.port}/${database}`;
  }

  /** newDB creates a database of the caller's own and returns its name. */
  async newDB(): Promise<string> {
    const name = `t${++this.dbs}`;
    const c = new this.pg.Client(this.config("postgres"));
    await c.connect();
    try {
      await c.query(`CREATE DATABASE ${name}`);
    } finally {
      await c.end();
    }
    return name;
  }

  async stop(): Promise<void> {
    if (this.proc.exitCode !== null || this.proc.signalCode !== null) return;
    const exited = new Promise((r) => this.proc.once("exit", r));
    process.kill(this.proc.pid!, "SIGINT"); // fast shutdown
    await exited;
  }
}
