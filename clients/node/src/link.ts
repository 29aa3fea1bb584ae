// One connection to a server: requests written back to back, answers
// matched to them by msgid in whatever order they come.

import * as net from "node:net";
import * as tls from "node:tls";
import { Decoder, Encoder } from "@msgpack/msgpack";
import {
  ConnectionError,
  FencekvError,
  fromWire,
  ProtocolError,
  TimeoutError,
} from "./errors.js";
import { messageEnd } from "./framing.js";

/** The methods that change nothing: their outcome is never in doubt. */
const READS = new Set(["ping", "get", "scan", "lock_info", "locks", "status", "members", "term", "refusals", "auth", "watch", "unwatch"]);

export function changesState(method: string): boolean {
  return !READS.has(method);
}

export interface LinkOptions {
  tls?: boolean | tls.ConnectionOptions;
  connectTimeoutMs: number;
}

/** Thrown by Link.call when nothing was written: the connection was already
 * dead. The caller may send the call on another connection. */
export class NotSent extends ConnectionError {
  constructor(why: string, addr = "") {
    super(`fencekv: not sent: ${why}`, { addr, sent: false, method: "", effect: false });
  }
}

type Late = (err: FencekvError | null, result: Record<string, unknown> | null) => void;

export interface CallOpts {
  signal?: AbortSignal | undefined;
  /** Where the answer goes if it comes after the caller gave up. */
  late?: Late | undefined;
  effect?: boolean;
}

class Pending {
  res!: (v: Record<string, unknown>) => void;
  rej!: (e: unknown) => void;
  /** When it times out (performance.now() ms); 0: never. */
  deadline = 0;
  /** Set once the caller gave up (timeout, abort): the answer, if it still
   * comes, goes to late. */
  abandoned = false;
  late: Late | undefined;
  /** Its bytes were handed to the socket. */
  written = false;
  onAbort: (() => void) | undefined;
  constructor(
    readonly method: string,
    readonly params: Record<string, unknown> | undefined,
    readonly timeoutMs: number,
    readonly effect: boolean,
    readonly opts: CallOpts | undefined,
  ) {}
  /** settled: the caller is answered; stop listening. */
  done = false;
  settled(): void {
    this.done = true;
    if (this.onAbort) this.opts!.signal!.removeEventListener("abort", this.onAbort);
  }
  resolve(v: Record<string, unknown>): void {
    this.settled();
    this.res(v);
  }
  reject(e: unknown): void {
    this.settled();
    this.rej(e);
  }
}

const encoder = new Encoder({ useBigInt64: true, ignoreUndefined: true });
const decoder = new Decoder({ useBigInt64: false });

export function encode(v: unknown): Uint8Array {
  return encoder.encode(v);
}

export function splitAddr(addr: string): { host: string; port: number } {
  const i = addr.lastIndexOf(":");
  if (i <= 0) throw new Error(`fencekv: address ${JSON.stringify(addr)}: want host:port`);
  let host = addr.slice(0, i);
  if (host.startsWith("[") && host.endsWith("]")) host = host.slice(1, -1);
  const port = Number(addr.slice(i + 1));
  if (!Number.isInteger(port) || port <= 0 || port > 65535) throw new Error(`fencekv: address ${JSON.stringify(addr)}: bad port`);
  return { host, port };
}

export class Link {
  readonly addr: string;
  readonly socket: net.Socket;
  /** Set once the connection can no longer be used (closed, broken, failed). */
  dead = false;
  cause: Error | undefined;
  private pending = new Map<number, Pending>();
  private nextId = 0;
  private rest: Buffer | null = null;
  private out: Buffer | null = null;
  private outLen = 0;
  private unwritten: Pending[] = [];
  private sweepTimer: NodeJS.Timeout | undefined;
  private sweepAt = 0;
  /** Resends a call that was never written when its connection died (set
   * by the client); without it such a call fails with NotSent. */
  resend: ((method: string, params: Record<string, unknown> | undefined, timeoutMs: number, o: CallOpts | undefined) => Promise<Record<string, unknown>>) | undefined;
  private gotData = false;
  /** Server notifications other than "error" (watch events). */
  onNotification: ((method: string, params: Record<string, unknown> | undefined) => void) | undefined;
  /** Called once when the connection dies. */
  onDead: ((cause: Error) => void) | undefined;

  private constructor(socket: net.Socket, addr: string) {
    this.socket = socket;
    this.addr = addr;
    socket.setNoDelay(true);
    socket.on("data", (chunk: Buffer) => this.receive(chunk));
    socket.on("error", (err) => this.fail(err));
    socket.on("end", () => this.fail(new Error(`fencekv: ${addr} closed the connection`)));
    socket.on("close", () => this.fail(new Error(`fencekv: the connection to ${addr} closed`)));
  }

  /** dial connects to addr within the connect timeout (TCP and TLS
   * handshake). */
  static dial(addr: string, o: LinkOptions): Promise<Link> {
    return new Promise((resolve, reject) => {
      let host: string, port: number;
      try {
        ({ host, port } = splitAddr(addr));
      } catch (e) {
        return reject(e);
      }
      let sock: net.Socket;
      const done = (err?: Error) => {
        clearTimeout(timer);
        sock.removeListener("error", onErr);
        if (err) {
          sock.destroy();
          reject(err);
        } else {
          resolve(new Link(sock, addr));
        }
      };
      const onErr = (err: Error) => done(err);
      if (o.tls) {
        const topts: tls.ConnectionOptions = { ...(o.tls === true ? {} : o.tls), host, port };
        if (!topts.minVersion) topts.minVersion = "TLSv1.2";
        if (topts.servername === undefined && net.isIP(host) === 0) topts.servername = host;
        sock = tls.connect(topts, () => done());
      } else {
        sock = net.connect({ host, port }, () => done());
      }
      sock.on("error", onErr);
      const timer = setTimeout(
        () => done(new Error(`fencekv: connect to ${addr}: no connection within ${o.connectTimeoutMs} ms`)),
        o.connectTimeoutMs,
      );
    });
  }

  get inFlight(): number {
    return this.pending.size;
  }

  /** call sends a request and resolves with its result map, or rejects
   * with the server's refusal, a ConnectionError, or a TimeoutError after
   * timeoutMs (0: none). It throws NotSent, synchronously, if the
   * connection is dead. */
  call(method: string, params: Record<string, unknown> | undefined, timeoutMs: number, o?: CallOpts): Promise<Record<string, unknown>> {
    if (this.dead || this.socket.destroyed || this.socket.readableEnded || !this.socket.writable) {
      this.fail(new Error("fencekv: the connection is closed"));
      throw new NotSent(this.cause?.message ?? "closed", this.addr);
    }
    let id = this.nextId;
    do {
      id = (id + 1) >>> 0;
    } while (this.pending.has(id));
    this.nextId = id;
    const p = new Pending(method, params, timeoutMs, o?.effect ?? changesState(method), o);
    const promise = new Promise<Record<string, unknown>>((res, rej) => {
      p.res = res;
      p.rej = rej;
    });
    this.write(encoder.encodeSharedRef([0, id, method, params === undefined ? [] : [params]]), p);
    this.pending.set(id, p);
    if (timeoutMs > 0) {
      p.deadline = performance.now() + timeoutMs;
      if (this.sweepAt === 0 || p.deadline < this.sweepAt) this.armSweep(p.deadline);
    }
    const signal = o?.signal;
    if (signal) {
      p.onAbort = () => this.giveUp(p, signal.reason);
      if (signal.aborted) queueMicrotask(p.onAbort);
      else signal.addEventListener("abort", p.onAbort, { once: true });
    }
    return promise;
  }

  /** giveUp fails the caller's promise; the entry stays until the answer
   * comes or the connection dies, so that its msgid is not reused while the
   * server may still answer it. */
  private giveUp(p: Pending, err: unknown): void {
    if (p.abandoned || p.done) return;
    p.abandoned = true;
    p.late = p.opts?.late;
    p.reject(err);
  }

  private armSweep(at: number): void {
    if (this.sweepTimer) clearTimeout(this.sweepTimer);
    this.sweepAt = at;
    this.sweepTimer = setTimeout(this.sweep, Math.max(at - performance.now(), 0) + 1);
    this.sweepTimer.unref();
  }

  /** sweep times out the calls whose deadline has passed, and arms itself
   * for the next deadline. One timer per connection, not one per call. */
  private readonly sweep = (): void => {
    this.sweepTimer = undefined;
    this.sweepAt = 0;
    if (this.dead) return;
    const t = performance.now();
    let next = 0;
    for (const p of this.pending.values()) {
      if (p.abandoned || p.deadline === 0) continue;
      if (p.deadline <= t) {
        this.giveUp(
          p,
          new TimeoutError(
            `fencekv: ${p.method} to ${this.addr}: no answer within ${p.timeoutMs} ms` +
              (p.effect ? " (the request was sent: it may or may not have been applied)" : ""),
            { addr: this.addr, sent: true, method: p.method, effect: p.effect },
          ),
        );
      } else if (next === 0 || p.deadline < next) {
        next = p.deadline;
      }
    }
    if (next !== 0) this.armSweep(next);
  };

  /** notify sends a notification (no answer). */
  notify(method: string, params?: Record<string, unknown>): void {
    if (this.dead) throw new NotSent("closed", this.addr);
    this.write(encoder.encodeSharedRef([2, method, params === undefined ? [] : [params]]));
  }

  private write(bytes: Uint8Array, p?: Pending): void {
    // Calls made in one turn of the event loop go out in one write: their
    // bytes are gathered in one buffer, handed to the socket on the next tick.
    const n = bytes.length;
    if (this.outLen === 0) process.nextTick(this.flush);
    if (this.out === null || this.outLen + n > this.out.length) {
      const grown = Buffer.allocUnsafe(Math.max(4096, 2 * (this.outLen + n)));
      if (this.out !== null && this.outLen > 0) this.out.copy(grown, 0, 0, this.outLen);
      this.out = grown;
    }
    this.out.set(bytes, this.outLen);
    this.outLen += n;
    if (p) this.unwritten.push(p);
  }

  private readonly flush = (): void => {
    const out = this.out;
    const n = this.outLen;
    this.out = null; // the socket keeps this one until it is written
    this.outLen = 0;
    if (this.dead || out === null || n === 0) return;
    for (const p of this.unwritten) p.written = true;
    this.unwritten = [];
    this.socket.write(out.subarray(0, n));
  };

  private receive(chunk: Buffer): void {
    if (this.dead) return;
    if (!this.gotData) {
      this.gotData = true;
      if (chunk.length >= 2 && chunk[0]! >= 0x14 && chunk[0]! <= 0x17 && chunk[1] === 0x03) {
        // A TLS record (an alert): a plain client talking to a TLS server.
        this.fail(new ProtocolError(`fencekv: ${this.addr} answered with TLS: it is a TLS server (set the tls option)`));
        return;
      }
    }
    let buf = this.rest === null ? chunk : Buffer.concat([this.rest, chunk]);
    let off = 0;
    try {
      for (;;) {
        const end = messageEnd(buf, off);
        if (end < 0) break;
        const msg = decoder.decode(buf.subarray(off, end));
        off = end;
        this.dispatch(msg);
        if (this.dead) return;
      }
    } catch (e) {
      this.fail(e instanceof FencekvError ? e : new ProtocolError(`fencekv: ${this.addr} sent a malformed message: ${(e as Error).message}`));
      return;
    }
    this.rest = off >= buf.length ? null : buf.subarray(off);
    buf = null as unknown as Buffer;
  }

  private dispatch(msg: unknown): void {
    if (!Array.isArray(msg)) throw new ProtocolError(`fencekv: ${this.addr} sent a message that is not an array`);
    if (msg[0] === 1 && msg.length === 4) {
      const id = msg[1];
      if (typeof id !== "number") throw new ProtocolError(`fencekv: ${this.addr} sent a response with a bad msgid`);
      const p = this.pending.get(id);
      if (!p) return; // not ours (a server bug): ignore
      this.pending.delete(id);
      const err = msg[2];
      let result = msg[3];
      if (err !== null && err !== undefined) {
        const fe = fromWire(err);
        if (p.abandoned) p.late?.(fe, null);
        else p.reject(fe);
        return;
      }
      if (result === null || result === undefined) result = {};
      if (typeof result !== "object" || Array.isArray(result) || result instanceof Uint8Array) {
        const pe = new ProtocolError(`fencekv: ${this.addr} answered ${p.method} with a result that is not a map`);
        if (p.abandoned) p.late?.(pe, null);
        else p.reject(pe);
        return;
      }
      if (p.abandoned) p.late?.(null, result as Record<string, unknown>);
      else p.resolve(result as Record<string, unknown>);
      return;
    }
    if (msg[0] === 2 && msg.length === 3) {
      const method = msg[1];
      const params = Array.isArray(msg[2]) ? (msg[2][0] as Record<string, unknown> | undefined) : undefined;
      if (method === "error") {
        // The server is closing this connection, and says why (§2.4):
        // it refused it before reading any request.
        const fe = fromWire(params ?? { code: "unavailable", message: "the server closed the connection" });
        this.fail(fe, true);
        return;
      }
      this.onNotification?.(typeof method === "string" ? method : String(method), params);
      return;
    }
    throw new ProtocolError(`fencekv: ${this.addr} sent a message of type ${String(msg[0])} with ${msg.length} elements`);
  }

  /** fail ends the connection: every call in flight fails with a
   * ConnectionError (a write's outcome unknown), or, when refused is set,
   * with the server's own refusal err (nothing was applied). */
  fail(err: Error, refused = false): void {
    if (this.dead) return;
    this.dead = true;
    this.cause = err;
    this.socket.destroy();
    if (this.sweepTimer) clearTimeout(this.sweepTimer);
    const pending = this.pending;
    this.pending = new Map();
    for (const p of pending.values()) {
      if (p.abandoned) {
        p.late?.(null, null);
        continue;
      }
      if (refused) {
        p.reject(err);
        continue;
      }
      if (!p.written) {
        // Never handed to the socket: safe to send on another connection.
        if (this.resend) this.resend(p.method, p.params, p.timeoutMs, p.opts).then((v) => p.resolve(v), (e) => p.reject(e));
        else p.reject(new NotSent(err.message, this.addr));
        continue;
      }
      p.reject(
        new ConnectionError(
          `fencekv: ${p.method} to ${this.addr}: the connection failed before the answer came: ${err.message}` +
            (p.effect ? " (the request was sent: it may or may not have been applied)" : ""),
          { addr: this.addr, sent: true, method: p.method, effect: p.effect, cause: err },
        ),
      );
    }
    this.onDead?.(err);
  }
}
