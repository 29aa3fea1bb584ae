// Test harness: real fencekv servers (and clusters) on free loopback ports
// with temporary data dirs, stopped by their PIDs; a proxy that can cut an
// answer; a listener that never answers.

import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));

function repoRoot(): string {
  let d = here;
  for (;;) {
    const gomod = join(d, "go.mod");
    if (existsSync(gomod) && readFileSync(gomod, "utf8").startsWith("module github.com/fencekv/fencekv")) return d;
    const up = dirname(d);
    if (up === d) throw new Error("tests: the fencekv repository root (go.mod) was not found above " + here);
    d = up;
  }
}

let bin: string | undefined;

/** fencekvBin is $FENCEKV_BIN, or a binary built from this tree once per
 * test process. */
export function fencekvBin(): string {
  if (bin) return bin;
  if (process.env.FENCEKV_BIN) return (bin = resolve(process.env.FENCEKV_BIN));
  const dir = mkdtempSync(join(tmpdir(), "fencekv-node-bin-"));
  const out = join(dir, "fencekv");
  execFileSync("go", ["build", "-o", out, "./cmd/fencekv"], { cwd: repoRoot(), stdio: "inherit" });
  process.on("exit", () => rmSync(dir, { recursive: true, force: true }));
  return (bin = out);
}

const dirs: string[] = [];
const procs = new Set<ChildProcess>();
process.on("exit", () => {
  for (const p of procs) if (p.exitCode === null && p.pid) try { process.kill(p.pid, "SIGKILL"); } catch { /* gone */ }
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

export function tempDir(prefix = "fencekv-node-"): string {
  const d = mkdtempSync(join(tmpdir(), prefix));
  dirs.push(d);
  return d;
}

/** freePort binds port 0 and returns the port the kernel chose. */
export function freePort(): Promise<number> {
  return new Promise((res, rej) => {
    const s = net.createServer();
    s.on("error", rej);
    s.listen(0, "127.0.0.1", () => {
      const p = (s.address() as net.AddressInfo).port;
      s.close(() => res(p));
    });
  });
}

/** waitFor polls cond until it returns a truthy value, or throws after
 * deadlineMs. */
export async function waitFor<T>(what: string, cond: () => Promise<T> | T, deadlineMs = 10_000, everyMs = 20): Promise<T> {
  const until = performance.now() + deadlineMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await cond();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    if (performance.now() > until) throw new Error(`timed out waiting for ${what}${last ? ` (last error: ${(last as Error).message})` : ""}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export interface ServerOptions {
  args?: string[];
  dataDir?: string;
  port?: number;
}

/** A fencekv serve process. */
export class Server {
  proc!: ChildProcess;
  addr = "";
  port = 0;
  dataDir: string;
  args: string[];
  log = "";

  private constructor(o: ServerOptions) {
    this.dataDir = o.dataDir ?? tempDir();
    this.args = o.args ?? [];
    this.port = o.port ?? 0;
  }

  static async start(o: ServerOptions = {}): Promise<Server> {
    const s = new Server(o);
    await s.spawn();
    return s;
  }

  get pid(): number {
    return this.proc.pid!;
  }

  private spawn(): Promise<void> {
    const args = ["serve", "--data", this.dataDir, "--listen", `127.0.0.1:${this.port}`, "--http", "", ...this.args];
    const p = spawn(fencekvBin(), args, { stdio: ["ignore", "ignore", "pipe"] });
    this.proc = p;
    procs.add(p);
    p.on("exit", () => procs.delete(p));
    return new Promise((res, rej) => {
      let buf = "";
      const timer = setTimeout(() => rej(new Error(`fencekv serve did not start within 20s:\n${this.log}`)), 20_000);
      const onExit = (code: number | null) => {
        clearTimeout(timer);
        rej(new Error(`fencekv serve exited (${code}) before serving:\n${this.log}`));
      };
      p.once("exit", onExit);
      p.stderr!.setEncoding("utf8");
      p.stderr!.on("data", (d: string) => {
        this.log += d;
        if (this.addr && this.port) return;
        buf += d;
        const m = /msg="fencekv serving".* addr=(\S+)/.exec(buf);
        if (m) {
          this.addr = m[1]!;
          this.port = Number(this.addr.slice(this.addr.lastIndexOf(":") + 1));
          clearTimeout(timer);
          p.removeListener("exit", onExit);
          res();
        }
      });
    });
  }

  /** kill sends sig to the server's PID and waits for it to exit. */
  async kill(sig: NodeJS.Signals = "SIGKILL"): Promise<void> {
    const p = this.proc;
    if (p.exitCode !== null || p.signalCode !== null) return;
    const exited = new Promise<void>((r) => p.once("exit", () => r()));
    process.kill(p.pid!, sig);
    await exited;
  }

  /** restart kills the server with -9 and starts it again on the same port
   * and data dir. */
  async restart(): Promise<void> {
    await this.kill("SIGKILL");
    this.addr = "";
    await this.spawnRetry();
  }

  /** start again after kill (same port, same data). */
  async startAgain(): Promise<void> {
    this.addr = "";
    await this.spawnRetry();
  }

  private async spawnRetry(): Promise<void> {
    // The port may take a moment to come free.
    for (let i = 0; ; i++) {
      try {
        await this.spawn();
        return;
      } catch (e) {
        if (i >= 20 || !/address already in use/.test(String(e))) throw e;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
  }

  async stop(): Promise<void> {
    await this.kill("SIGTERM");
  }
}

/** A three-node cluster on loopback. */
export class Cluster {
  nodes: Server[] = [];
  addrs: string[] = [];

  static async start(n = 3): Promise<Cluster> {
    const c = new Cluster();
    const ports = await Promise.all(Array.from({ length: 3 * n }, () => freePort()));
    const gossip = ports.slice(2 * n, 3 * n).map((p) => `127.0.0.1:${p}`);
    c.nodes = await Promise.all(
      Array.from({ length: n }, (_, i) =>
        Server.start({
          port: ports[i]!,
          args: ["--node", `n${i}`, "--raft", `127.0.0.1:${ports[n + i]}`, "--gossip", gossip[i]!, "--bootstrap-expect", String(n), "--join", gossip.join(",")],
        }),
      ),
    );
    c.addrs = c.nodes.map((s) => s.addr);
    return c;
  }

  async stop(): Promise<void> {
    await Promise.all(this.nodes.map((s) => s.kill("SIGKILL")));
  }
}

/** A listener that accepts connections and never answers (a hung node). */
export async function silentListener(): Promise<{ addr: string; close: () => void }> {
  const socks: net.Socket[] = [];
  const s = net.createServer((c) => {
    socks.push(c);
    c.on("error", () => {});
  });
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
  const port = (s.address() as net.AddressInfo).port;
  return {
    addr: `127.0.0.1:${port}`,
    close: () => {
      for (const c of socks) c.destroy();
      s.close();
    },
  };
}

/** A TCP proxy to target. With cutNext set, the next bytes the server sends
 * are not passed on: both sides of that connection are closed instead (the
 * answer is lost after the request was served). */
export class CutProxy {
  addr = "";
  cutNext = false;
  cuts = 0;
  /** Called at the next cut, before the connection is closed. */
  onCut: (() => Promise<unknown>) | undefined;
  private server!: net.Server;
  private socks: net.Socket[] = [];

  static async start(target: string): Promise<CutProxy> {
    const p = new CutProxy();
    const i = target.lastIndexOf(":");
    const host = target.slice(0, i);
    const port = Number(target.slice(i + 1));
    p.server = net.createServer((client) => {
      const up = net.connect({ host, port });
      p.socks.push(client, up);
      client.on("error", () => up.destroy());
      up.on("error", () => client.destroy());
      client.on("close", () => up.destroy());
      up.on("close", () => client.destroy());
      client.on("data", (d) => up.write(d));
      up.on("data", (d) => {
        if (p.cutNext) {
          p.cutNext = false;
          p.cuts++;
          // onCut runs before the connection is cut (its answer held back).
          const hook = p.onCut;
          p.onCut = undefined;
          up.pause();
          void (hook ? hook() : Promise.resolve()).finally(() => {
            up.destroy();
            client.destroy();
          });
          return;
        }
        client.write(d);
      });
    });
    await new Promise<void>((r) => p.server.listen(0, "127.0.0.1", () => r()));
    p.addr = `127.0.0.1:${(p.server.address() as net.AddressInfo).port}`;
    return p;
  }

  close(): void {
    for (const s of this.socks) s.destroy();
    this.server.close();
  }
}
