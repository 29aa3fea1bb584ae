// The client: one connection at a time to one of its addresses, many calls
// in flight on it, reconnecting over the addresses with backoff.

import type * as tls from "node:tls";
import {
  BadRequestError,
  ClientClosedError,
  ConnectionError,
  FencekvError,
  NotLeaderError,
  UnauthenticatedError,
  UnavailableError,
} from "./errors.js";
import { Link, NotSent } from "./link.js";
import { Lease, lockLease, type LockOptions } from "./lock.js";
import { Watch, type WatchOptions } from "./watch.js";
import { type Duration, optMs, toMs } from "./time.js";
import { asBuffer, asNum, asText, type Bytes } from "./values.js";
import { crc32c } from "./crc32c.js";

/** A fencing token. Tokens come back as numbers (exact up to 2^53); a
 * bigint is accepted wherever a token is sent. */
export type Token = number | bigint;

export interface ClientOptions {
  /** "host:port" of a server, or of the nodes of a cluster (any serves every
   * request). */
  addrs: string | string[];
  /** The default timeout of each call (ms or "10s"); 0: none. Default 10s.
   * An acquire that waits gets its wait on top. */
  timeout?: Duration;
  /** Bound on connecting to one address (TCP, TLS) and, with several
   * addresses, on its first answer (a stopped node's kernel still accepts
   * connections). Default: 2s, or a third of the timeout if shorter, so
   * that a call passes over a silent node within its timeout. */
  connectTimeout?: Duration;
  /** TLS: true (system CAs), or node:tls options (ca, cert, key for mutual
   * TLS, servername, ...). TLS 1.2 at least. */
  tls?: boolean | tls.ConnectionOptions;
  /** Authenticate every connection as this principal (method auth). */
  user?: string;
  secret?: string | Uint8Array;
  /** The pause after a round of dials where no address answered (during
   * which calls fail at once, not sent): from minBackoff doubling up to
   * maxBackoff. Defaults 50ms and 1s. */
  minBackoff?: Duration;
  maxBackoff?: Duration;
}

export interface CallOptions {
  /** This call's timeout, instead of the client's. */
  timeout?: Duration;
  /** Give up on the call when it aborts (a sent write's outcome is then
   * unknown). */
  signal?: AbortSignal;
}

export type Consistency = "linearizable" | "stale";

export interface ReadOptions extends CallOptions {
  consistency?: Consistency;
}

export interface WriteOptions extends CallOptions {
  /** The fencing token the write carries. */
  token?: Token;
  /** Require token > fence (at most one write per token per key). */
  strict?: boolean;
  /** Held write: accepted only while this lock is held by `token`. */
  lock?: Bytes;
  /** A held write under this lease: its token and lock name. Refused
   * locally, unsent, with LeaseLostError once the lease may be lost. */
  lease?: Lease;
}

export interface Entry {
  key: Buffer;
  found: boolean;
  /** The value; null when not found. */
  value: Buffer | null;
  fence: number;
  revision: number;
}

export interface WriteResult {
  fence: number;
  revision: number;
}

export interface ScanOptions extends ReadOptions {
  prefix?: Bytes;
  /** First key (inclusive). */
  start?: Bytes;
  /** Items per page, 1..10000 (default 1000). */
  limit?: number;
}

export type TxnOp =
  | { op: "put"; key: Bytes; value: Bytes }
  | { op: "delete"; key: Bytes }
  | { op: "incr"; key: Bytes; delta: number | bigint };

export interface TxnOptions extends WriteOptions {
  ops: TxnOp[];
  compare?: { key: Bytes; revision: number }[];
}

export interface TxnResult {
  revision: number;
  results: { key: Buffer; fence: number; revision: number; value?: number }[];
}

export interface AcquireOptions extends CallOptions {
  /** Lease length, 100ms..1h. */
  ttl: Duration;
  /** Queue (FIFO) for up to this long if the lock is held. */
  wait?: Duration;
  /** Display name shown by lockInfo and in lock_held. */
  holder?: string;
  /** After the lease expires (not after a release), nobody may take the
   * lock for this long. */
  lockDelay?: Duration;
  /** Permits: 2..256 makes the lock a semaphore and the grant one of its
   * permits, with a token of its own (PROTOCOL.md §5.2); 1 or absent is a
   * plain lock. While any permit is live every acquire must give the same
   * limit, else LimitMismatchError; out of range is BadRequestError. */
  limit?: number;
}

export interface Grant {
  lock: string;
  token: number;
  ttlMs: number;
}

export interface LockInfo {
  lock: string;
  held: boolean;
  holder: string;
  token: number;
  ttlMs: number;
  waiters: number;
  lockDelayMs: number;
  /** Permits: 1 for a plain lock, 2..256 for a semaphore. */
  limit: number;
  /** The live permits in token order: a semaphore's every one, a plain
   * lock's one holder while held, else none. holder/token/ttlMs above are
   * a semaphore's newest permit's. */
  holders: Holder[];
}

/** A live permit of a semaphore (or a plain lock's live lease). */
export interface Holder {
  holder: string;
  token: number;
  ttlMs: number;
}

export interface Status {
  version: string;
  node: string;
  role: string;
  leader: string;
  term: number;
  commitIndex: number;
  appliedIndex: number;
  lastToken: number;
  revision: number;
  keys: number;
  locks: number;
  waiters: number;
  commits: number;
  commands: number;
  dataSize: number;
  syncUs: number;
  checkpoints: number;
  checkpointUs: number;
  [field: string]: unknown;
}

export interface Member {
  node: string;
  clientAddr: string;
  raftAddr: string;
  gossipAddr: string;
  state: string;
  voter: boolean;
  raftRole: string;
}

export interface Refusal {
  seq: number;
  timeMs: number;
  code: string;
  op: string;
  key: Buffer;
  lock: string;
  token: number;
  fence: number;
  holderToken: number;
  grantedLock: string;
  grantedHolder: string;
  client: string;
  known: boolean;
}

export interface BackupInfo {
  size: number;
  index: number;
  lastToken: number;
  revision: number;
  chunkSize: number;
}

function toEntry(r: Record<string, unknown>, key?: Bytes): Entry {
  const found = r.found === undefined ? true : r.found === true;
  return {
    key: r.key !== undefined && r.key !== null ? asBuffer(r.key) : asBuffer(key ?? ""),
    found,
    value: found ? asBuffer(r.value ?? new Uint8Array()) : null,
    fence: asNum(r.fence),
    revision: asNum(r.revision),
  };
}

function toLockInfo(r: Record<string, unknown>, name?: string): LockInfo {
  const held = r.held === true;
  const holder = asText(r.holder);
  const token = asNum(r.token);
  const ttlMs = asNum(r.ttl_ms);
  let holders: Holder[];
  if (r.limit !== undefined) {
    // A semaphore: its live permits.
    const hs = Array.isArray(r.holders) ? (r.holders as unknown[]) : [];
    holders = hs
      .filter((h): h is Record<string, unknown> => h !== null && typeof h === "object")
      .map((h) => ({ holder: asText(h.holder), token: asNum(h.token), ttlMs: asNum(h.ttl_ms) }));
  } else {
    holders = held ? [{ holder, token, ttlMs }] : [];
  }
  return {
    lock: r.lock !== undefined ? asText(r.lock) : (name ?? ""),
    held,
    holder,
    token,
    ttlMs,
    waiters: asNum(r.waiters),
    lockDelayMs: asNum(r.lock_delay_ms),
    limit: r.limit !== undefined ? asNum(r.limit) : 1,
    holders,
  };
}

/** tokenOf is the token of the live permit (or plain lease) of info held
 * under holder, if any: how the lock helper finds a grant whose answer was
 * lost, among a semaphore's permits too. */
export function tokenOf(info: LockInfo, holder: string): number | undefined {
  for (const h of info.holders) if (h.holder === holder && h.token) return h.token;
  return undefined;
}

function camel(s: string): string {
  return s.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());
}

/** The text of a lock name given as bytes or a string. */
export function lockName(name: Bytes): string {
  return typeof name === "string" ? name : Buffer.from(name.buffer, name.byteOffset, name.byteLength).toString("utf8");
}

/** retryable: a lock call that failed with err may succeed if sent again
 * (the connection failed, no leader, shutting down). A refusal is final. */
export function retryable(err: unknown): boolean {
  return err instanceof UnavailableError || err instanceof NotLeaderError;
}

/**
 * Client speaks the fencekv protocol to a server or to any node of a
 * cluster. Calls are pipelined on one connection and matched to their
 * answers by msgid. When the connection breaks, the calls in flight fail
 * with a ConnectionError (a write's outcome unknown) and the next call
 * connects again, trying the addresses in turn from the one after the
 * failed one; while none answers, calls fail at once (nothing sent) and
 * connecting is retried with backoff. A connection the server closed is
 * noticed (its "end" event) and never reused: the next call goes over a new
 * one.
 */
export class Client {
  readonly addrs: string[];
  readonly timeoutMs: number;
  readonly connectTimeoutMs: number;
  private readonly tlsOpts: boolean | tls.ConnectionOptions | undefined;
  private user: string | undefined;
  private secret: string | Uint8Array | undefined;
  private readonly minBackoff: number;
  private readonly maxBackoff: number;

  private cur: Link | undefined;
  private lastAddr = -1;
  private dialing: Promise<Link> | undefined;
  private backoff = 0;
  private nextDial = 0;
  private dialErr: Error | undefined;
  private closedFlag = false;
  /** Aborted by close(): the leases' keepers and watches stop. */
  private readonly closing = new AbortController();
  private readonly leases = new Set<Lease>();
  private readonly watches = new Set<Watch>();

  constructor(o: ClientOptions) {
    const addrs = typeof o.addrs === "string" ? o.addrs.split(",").map((s) => s.trim()).filter(Boolean) : [...o.addrs];
    if (addrs.length === 0) throw new Error("fencekv: no server address given");
    this.addrs = addrs;
    this.timeoutMs = o.timeout === undefined ? 10_000 : toMs(o.timeout, "timeout");
    this.connectTimeoutMs =
      o.connectTimeout !== undefined
        ? toMs(o.connectTimeout, "connectTimeout")
        : this.timeoutMs > 0
          ? Math.min(2000, Math.max(Math.floor(this.timeoutMs / 3), 1))
          : 2000;
    this.tlsOpts = o.tls;
    this.user = o.user;
    this.secret = o.secret;
    this.minBackoff = optMs(o.minBackoff, "minBackoff") ?? 50;
    this.maxBackoff = Math.max(optMs(o.maxBackoff, "maxBackoff") ?? 1000, this.minBackoff);
  }

  /** The address of the server the client is (or was last) connected to. */
  get addr(): string | undefined {
    return this.cur?.addr;
  }

  get closed(): boolean {
    return this.closedFlag;
  }

  /** @internal aborted when the client closes. */
  get closingSignal(): AbortSignal {
    return this.closing.signal;
  }

  /** connect makes the first connection now (calls make it otherwise) and
   * fails if no address answers. */
  async connect(): Promise<void> {
    await this.link();
  }

  /** close ends the connection and every watch; calls in flight fail, and
   * so does every later call. Leases held are not released (their renews
   * stop: they run out on the server); release them first. */
  async close(): Promise<void> {
    if (this.closedFlag) return;
    this.closedFlag = true;
    this.closing.abort(new ClientClosedError());
    for (const w of this.watches) w.close();
    this.cur?.fail(new ClientClosedError());
    for (const l of this.leases) l.stopKeeping();
  }

  async [Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")](): Promise<void> {
    await this.close();
  }

  // ---- connections

  private link(): Promise<Link> | Link {
    if (this.closedFlag) throw new ClientClosedError();
    const c = this.cur;
    if (c !== undefined && !c.dead) return c;
    if (this.dialing) return this.dialing;
    const wait = this.nextDial - performance.now();
    if (wait > 0) {
      throw new ConnectionError(
        `fencekv: no server answered (${this.dialErr?.message ?? "?"}); next attempt in ${Math.ceil(wait)} ms`,
        { addr: this.addrs.join(","), sent: false, method: "", effect: false, cause: this.dialErr },
      );
    }
    const first = this.lastAddr + 1;
    this.dialing = this.dialRound(first).then(
      (l) => {
        this.dialing = undefined;
        if (this.closedFlag) {
          l.fail(new ClientClosedError());
          throw new ClientClosedError();
        }
        this.backoff = 0;
        this.nextDial = 0;
        this.dialErr = undefined;
        l.resend = this.send;
        this.cur = l;
        this.lastAddr = this.addrs.indexOf(l.addr);
        return l;
      },
      (err: Error) => {
        this.dialing = undefined;
        if (this.closedFlag) throw new ClientClosedError();
        if (err instanceof UnauthenticatedError) throw err;
        this.backoff = Math.min(Math.max(2 * this.backoff, this.minBackoff), this.maxBackoff);
        // ±20%, so that the clients of a restarted server come back spread.
        this.nextDial = performance.now() + this.backoff * (0.8 + 0.4 * Math.random());
        this.dialErr = err;
        throw err;
      },
    );
    return this.dialing;
  }

  /** @internal dialRound connects to the first of the addresses, from
   * addrs[first] on, that answers (and authenticates it). */
  async dialRound(first: number): Promise<Link> {
    const errs: string[] = [];
    let lastCause: unknown;
    const n = this.addrs.length;
    for (let i = 0; i < n; i++) {
      if (this.closedFlag) throw new ClientClosedError();
      const addr = this.addrs[(((first + i) % n) + n) % n]!;
      let l: Link;
      try {
        l = await Link.dial(addr, { tls: this.tlsOpts, connectTimeoutMs: this.connectTimeoutMs });
      } catch (e) {
        errs.push(`${addr}: ${(e as Error).message}`);
        lastCause = e;
        continue;
      }
      try {
        if (n > 1) {
          // A stopped node's kernel still accepts: one that does not answer
          // soon is left for the next address.
          await l.call("ping", undefined, this.connectTimeoutMs);
        }
        if (this.user !== undefined && this.user !== "") {
          try {
            // Not bounded by the connect timeout: bcrypt checks queue.
            await l.call("auth", { name: this.user, secret: this.secret ?? "" }, Math.max(this.timeoutMs, 10_000));
          } catch (e) {
            if (e instanceof FencekvError && !(e instanceof ConnectionError)) {
              // The server answered: every node would say the same.
              l.fail(e);
              if (e instanceof UnauthenticatedError) {
                throw new UnauthenticatedError(e.code, `fencekv: ${addr}: authenticate as ${JSON.stringify(this.user)}: ${e.message}`, e.facts);
              }
              throw e;
            }
            throw e;
          }
        }
        return l;
      } catch (e) {
        if (e instanceof UnauthenticatedError) throw e;
        l.fail(e as Error);
        errs.push(`${addr}: ${(e as Error).message}`);
        lastCause = e;
      }
    }
    throw new ConnectionError(`fencekv: no server answered: ${errs.join("; ")}`, {
      addr: this.addrs.join(","),
      sent: false,
      method: "",
      effect: false,
      cause: lastCause,
    });
  }

  /** @internal leave makes the next call go to the next address, if there
   * are several and l is still the connection: its node did not answer a
   * lock call in time, or had no leader. Calls still waiting on it fail
   * (their outcome unknown). */
  leave(l: Link | undefined, why: unknown): void {
    if (this.addrs.length < 2 || l === undefined || this.cur !== l) return;
    l.fail(new Error(`fencekv: left ${l.addr} for the next address: ${(why as Error)?.message ?? String(why)}`));
  }

  /** @internal the connection calls go to now (maybe dead). */
  get current(): Link | undefined {
    return this.cur;
  }

  /** @internal */
  track(l: Lease | Watch, on: boolean): void {
    const set = (l instanceof Lease ? this.leases : this.watches) as Set<Lease | Watch>;
    if (on) set.add(l);
    else set.delete(l);
  }

  /** call sends a request for any method (params: the named arguments) and
   * returns its result map as decoded. The typed methods below are built on
   * it. */
  call(
    method: string,
    params?: Record<string, unknown>,
    o?: CallOptions & { late?: (err: FencekvError | null, result: Record<string, unknown> | null) => void; extraMs?: number },
  ): Promise<Record<string, unknown>> {
    const l = this.cur;
    const plain = o === undefined || (o.timeout === undefined && o.signal === undefined && o.late === undefined && !o.extraMs);
    if (plain && l !== undefined && !l.dead && !this.closedFlag) {
      // The common case, without an async frame of its own.
      try {
        return l.call(method, params, this.timeoutMs);
      } catch (e) {
        if (!(e instanceof NotSent)) throw e;
      }
    }
    const timeout = (o?.timeout !== undefined ? toMs(o.timeout, "timeout") : this.timeoutMs) + (o?.extraMs ?? 0);
    return this.send(method, params, timeout, o?.signal || o?.late ? { signal: o.signal, late: o.late } : undefined);
  }

  /** send sends a call on the current connection, or a new one. */
  private readonly send = async (
    method: string,
    params: Record<string, unknown> | undefined,
    timeout: number,
    o: { signal?: AbortSignal | undefined; late?: ((err: FencekvError | null, result: Record<string, unknown> | null) => void) | undefined } | undefined,
  ): Promise<Record<string, unknown>> => {
    const signal = o?.signal;
    if (signal?.aborted) throw signal.reason;
    for (;;) {
      let l = this.link();
      if (l instanceof Promise) l = await l;
      if (signal?.aborted) throw signal.reason;
      try {
        return await l.call(method, params, timeout, o);
      } catch (e) {
        if (e instanceof NotSent) continue; // nothing written: on a new connection
        throw e;
      }
    }
  };

  // ---- keys

  /** ping returns the server's version. */
  async ping(o?: CallOptions): Promise<string> {
    return asText((await this.call("ping", undefined, o)).version);
  }

  /** get reads a key; a missing key is not an error (found: false). */
  async get(key: Bytes, o?: ReadOptions): Promise<Entry> {
    const r = await this.call("get", o?.consistency === undefined ? { key } : { key, consistency: o.consistency }, o);
    return toEntry(r, key);
  }

  private writeParams(key: Bytes | undefined, o: WriteOptions | undefined): Record<string, unknown> {
    const p: Record<string, unknown> = {};
    if (key !== undefined) p.key = key;
    if (o?.lease) {
      o.lease.check();
      p.token = o.lease.token;
      p.lock = o.lease.name;
    }
    if (o?.token !== undefined) p.token = o.token;
    if (o?.lock !== undefined) p.lock = o.lock;
    if (o?.strict) p.strict = true;
    return p;
  }

  /** put writes a value. With {token} it is fenced; with {lock} or {lease}
   * it is a held write. */
  async put(key: Bytes, value: Bytes, o?: WriteOptions): Promise<WriteResult> {
    const p = this.writeParams(key, o);
    p.value = value;
    const r = await this.call("put", p, o);
    return { fence: asNum(r.fence), revision: asNum(r.revision) };
  }

  /** delete removes a key; its fence survives. */
  async delete(key: Bytes, o?: WriteOptions): Promise<WriteResult & { deleted: boolean }> {
    const r = await this.call("delete", this.writeParams(key, o), o);
    return { fence: asNum(r.fence), revision: asNum(r.revision), deleted: r.deleted === true };
  }

  /** cas writes value if the key is at revision (0: absent). */
  async cas(key: Bytes, revision: number, value: Bytes, o?: WriteOptions): Promise<WriteResult> {
    const p = this.writeParams(key, o);
    p.revision = revision;
    p.value = value;
    const r = await this.call("cas", p, o);
    return { fence: asNum(r.fence), revision: asNum(r.revision) };
  }

  /** incr adds delta to the decimal integer at key (missing: 0). */
  async incr(key: Bytes, delta: number | bigint, o?: WriteOptions): Promise<WriteResult & { value: number }> {
    const p = this.writeParams(key, o);
    p.delta = delta;
    const r = await this.call("incr", p, o);
    return { fence: asNum(r.fence), revision: asNum(r.revision), value: asNum(r.value) };
  }

  /** scan returns one page of live keys in byte order. */
  async scan(o?: ScanOptions): Promise<{ items: Entry[]; more: boolean }> {
    const r = await this.call("scan", { prefix: o?.prefix, start: o?.start, limit: o?.limit, consistency: o?.consistency }, o);
    const items = Array.isArray(r.items) ? (r.items as Record<string, unknown>[]).map((i) => toEntry(i)) : [];
    return { items, more: r.more === true };
  }

  /** scanAll iterates over every live key under the prefix, page by page
   * (each page a consistent snapshot; the pages together are not one). */
  async *scanAll(o?: ScanOptions): AsyncGenerator<Entry, void, undefined> {
    let start: Bytes | undefined = o?.start;
    for (;;) {
      const page = await this.scan({ ...o, start });
      for (const e of page.items) yield e;
      if (!page.more || page.items.length === 0) return;
      const last = page.items[page.items.length - 1]!.key;
      start = Buffer.concat([last, Buffer.from([0])]);
    }
  }

  /** txn applies several writes as one revision, all or none, if every
   * compare holds. */
  async txn(o: TxnOptions): Promise<TxnResult> {
    const p = this.writeParams(undefined, o);
    p.ops = o.ops;
    if (o.compare) p.compare = o.compare;
    const r = await this.call("txn", p, o);
    const results = Array.isArray(r.results)
      ? (r.results as Record<string, unknown>[]).map((x) => {
          const o: TxnResult["results"][number] = { key: asBuffer(x.key), fence: asNum(x.fence), revision: asNum(x.revision) };
          if (x.value !== undefined && x.value !== null) o.value = asNum(x.value);
          return o;
        })
      : [];
    return { revision: asNum(r.revision), results };
  }

  // ---- locks

  /** acquire takes a lock, once, without renewing it (see lock and withLock
   * for a lease that is kept alive). With wait, it queues (FIFO) on the
   * server without holding up other calls. If the caller gives up (timeout,
   * signal) and the grant still arrives, it is released. */
  async acquire(name: Bytes, o: AcquireOptions): Promise<Grant> {
    const ttlMs = toMs(o.ttl, "ttl");
    const waitMs = optMs(o.wait, "wait") ?? 0;
    const lockDelayMs = optMs(o.lockDelay, "lockDelay");
    if (o.limit !== undefined && !Number.isSafeInteger(o.limit)) {
      // Integers go to the server as given: its bad_request is the one
      // rule for the range (1..256).
      throw new BadRequestError("bad_request", `fencekv: limit ${String(o.limit)}: want an integer`);
    }
    const until = performance.now() + waitMs;
    let pauseMs = 50;
    for (;;) {
      const left = Math.ceil(until - performance.now());
      const w = waitMs > 0 ? Math.max(left, 1) : undefined;
      try {
        return await this.acquireOnce(name, ttlMs, w, o.holder, lockDelayMs, o);
      } catch (e) {
        // A queued acquire its leader dropped unapplied (it lost the
        // leadership, or shut down) queues again while the wait lasts.
        const requeue =
          waitMs > 0 &&
          !(e instanceof ConnectionError) &&
          (e instanceof NotLeaderError || (e instanceof UnavailableError && !e.outcomeUnknown)) &&
          !this.closedFlag;
        if (!requeue || until - performance.now() - pauseMs <= 0) throw e;
        await new Promise((r) => setTimeout(r, pauseMs));
        pauseMs = Math.min(2 * pauseMs, 1000);
      }
    }
  }

  private async acquireOnce(
    name: Bytes,
    ttlMs: number,
    waitMs: number | undefined,
    holder: string | undefined,
    lockDelayMs: number | undefined,
    o: AcquireOptions,
  ): Promise<Grant> {
    const r = await this.call(
      "acquire",
      {
        lock: name,
        ttl_ms: ttlMs,
        holder: holder || undefined,
        wait_ms: waitMs,
        lock_delay_ms: lockDelayMs || undefined,
        limit: o.limit,
      },
      {
        ...o,
        extraMs: waitMs ?? 0,
        late: (err, res) => {
          // The caller gave up; a grant that came anyway is released.
          if (err === null && res !== null && res.token !== undefined) {
            this.release(name, asNum(res.token)).catch(() => {});
          }
        },
      },
    );
    return { lock: lockName(name), token: asNum(r.token), ttlMs: asNum(r.ttl_ms) };
  }

  /** renew gives a lease its full TTL again; idempotent. Returns the TTL. */
  async renew(name: Bytes, token: Token, o?: CallOptions): Promise<number> {
    return asNum((await this.call("renew", { lock: name, token }, o)).ttl_ms);
  }

  /** release frees a lock (no lock-delay), handing it to the next waiter.
   * not_holder/lease_expired mean the lock is no longer yours. */
  async release(name: Bytes, token: Token, o?: CallOptions): Promise<void> {
    await this.call("release", { lock: name, token }, o);
  }

  /** lockInfo describes a lock (never acquired: held false, token 0). */
  async lockInfo(name: Bytes, o?: ReadOptions): Promise<LockInfo> {
    return toLockInfo(await this.call("lock_info", { lock: name, consistency: o?.consistency }, o), lockName(name));
  }

  /** locks lists held locks, one page. */
  async locks(o?: ScanOptions): Promise<{ locks: LockInfo[]; more: boolean }> {
    const r = await this.call("locks", { prefix: o?.prefix, start: o?.start, limit: o?.limit, consistency: o?.consistency }, o);
    const locks = Array.isArray(r.locks) ? (r.locks as Record<string, unknown>[]).map((i) => toLockInfo(i)) : [];
    return { locks, more: r.more === true };
  }

  /**
   * lock acquires a lock and keeps its lease alive in the background until
   * you call lease.release(). lease.signal aborts (with LeaseLostError) as
   * soon as the lease may be lost: a renew was refused, or no renew
   * succeeded before the local deadline (the send time of the request that
   * last gave the lease its full TTL, plus the TTL, less the margin), so it
   * fires before the server may expire the lease, even if the server is
   * unreachable. An acquire whose answer was lost is found again by its
   * holder name (host:pid:random unless you give one).
   */
  lock(name: Bytes, o: LockOptions): Promise<Lease> {
    return lockLease(this, name, o);
  }

  /**
   * withLock acquires the lock, calls fn(lease, signal) while renewing the
   * lease, and releases it when fn settles. signal aborts before the lease
   * may be lost: stop then. If the lease was lost, withLock rejects with the
   * LeaseLostError even if fn resolved. Pass lease (or lease.token) with
   * every write fn makes: client.put(key, value, {lease}).
   */
  async withLock<T>(name: Bytes, o: LockOptions, fn: (lease: Lease, signal: AbortSignal) => Promise<T> | T): Promise<T> {
    const lease = await this.lock(name, o);
    let result: T;
    try {
      result = await fn(lease, lease.signal);
    } catch (e) {
      await lease.release().catch(() => {});
      throw e;
    }
    const lost = lease.lost;
    await lease.release(); // a release error of a lease not lost is thrown
    if (lost) throw lease.signal.reason;
    return result;
  }

  // ---- watches

  /**
   * watch follows changes under prefix (and lock events with locks: true)
   * on a connection of its own: `for await (const ev of client.watch(p))`.
   * It reconnects and resumes after a broken connection with no gap and no
   * repeat, and throws CompactedError when the server no longer keeps the
   * revision to resume from. Break out of the loop (or call close()) to
   * stop it.
   */
  watch(prefix: Bytes = "", o?: WatchOptions): Watch {
    if (this.closedFlag) throw new ClientClosedError();
    return new Watch(this, prefix, o ?? {});
  }

  // ---- the rest

  async status(o?: CallOptions): Promise<Status> {
    const r = await this.call("status", undefined, o);
    const st: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(r)) st[camel(k)] = typeof v === "string" || typeof v === "boolean" ? v : v instanceof Uint8Array ? asText(v) : asNum(v);
    return st as Status;
  }

  async members(o?: CallOptions): Promise<Member[]> {
    const r = await this.call("members", undefined, o);
    return (Array.isArray(r.members) ? (r.members as Record<string, unknown>[]) : []).map((m) => ({
      node: asText(m.node),
      clientAddr: asText(m.client_addr),
      raftAddr: asText(m.raft_addr),
      gossipAddr: asText(m.gossip_addr),
      state: asText(m.state),
      voter: m.voter === true,
      raftRole: asText(m.raft_role),
    }));
  }

  async term(o?: CallOptions): Promise<number> {
    return asNum((await this.call("term", undefined, o)).term);
  }

  async refusals(o?: CallOptions & { since?: number; limit?: number }): Promise<{ refusals: Refusal[]; last: number }> {
    const r = await this.call("refusals", { since: o?.since, limit: o?.limit }, o);
    const refusals = (Array.isArray(r.refusals) ? (r.refusals as Record<string, unknown>[]) : []).map((x) => ({
      seq: asNum(x.seq),
      timeMs: asNum(x.time_ms),
      code: asText(x.code),
      op: asText(x.op),
      key: asBuffer(x.key),
      lock: asText(x.lock),
      token: asNum(x.token),
      fence: asNum(x.fence),
      holderToken: asNum(x.holder_token),
      grantedLock: asText(x.granted_lock),
      grantedHolder: asText(x.granted_holder),
      client: asText(x.client),
      known: x.known === true,
    }));
    return { refusals, last: asNum(r.last) };
  }

  /** auth authenticates the connection as a principal, and every later
   * connection of this client too. */
  async auth(user: string, secret: string | Uint8Array, o?: CallOptions): Promise<{ principal: string; required: boolean }> {
    const r = await this.call("auth", { name: user, secret }, o);
    this.user = user;
    this.secret = secret;
    return { principal: asText(r.principal), required: r.required === true };
  }

  /** backup takes a consistent copy of the store (a bbolt data file) and
   * reads it, checking its CRC-32C. It runs on a connection of its own. */
  async backup(o?: CallOptions): Promise<{ info: BackupInfo; data: Buffer }> {
    const l = await this.dialRound(this.lastAddr + 1);
    const timeout = o?.timeout !== undefined ? toMs(o.timeout) : this.timeoutMs;
    try {
      const r = await l.call("backup", undefined, timeout, { signal: o?.signal, effect: false });
      const info: BackupInfo = {
        size: asNum(r.size),
        index: asNum(r.index),
        lastToken: asNum(r.last_token),
        revision: asNum(r.revision),
        chunkSize: asNum(r.chunk_size),
      };
      const parts: Buffer[] = [];
      let off = 0;
      for (;;) {
        const c = await l.call("backup_read", { offset: off }, timeout, { signal: o?.signal, effect: false });
        const d = asBuffer(c.data);
        parts.push(Buffer.from(d));
        off += d.length;
        if (c.done === true) {
          const data = Buffer.concat(parts);
          if (data.length !== info.size || crc32c(data) !== asNum(c.crc32c)) {
            throw new FencekvError("protocol", `fencekv: backup: the copy read (${data.length} bytes) does not match its size or checksum`);
          }
          return { info, data };
        }
        if (d.length === 0) throw new FencekvError("protocol", "fencekv: backup: an empty chunk before the end");
      }
    } finally {
      l.fail(new Error("backup done"));
    }
  }
}

