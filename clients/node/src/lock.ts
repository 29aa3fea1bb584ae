// Leases kept alive: renewed in the background with a margin, lost before
// the server may expire them, found again when an acquire's answer was
// lost, released at the end.

import { hostname } from "node:os";
import { randomBytes } from "node:crypto";
import type { Client, Grant } from "./client.js";
import { lockName, retryable, tokenOf } from "./client.js";
import {
  ClientClosedError,
  FencekvError,
  isUnknownOutcome,
  LeaseExpiredError,
  LeaseLostError,
  NotHolderError,
  TimeoutError,
} from "./errors.js";
import { type Duration, now, optMs, pause, toMs } from "./time.js";
import type { Bytes } from "./values.js";

export interface LockOptions {
  /** Lease length, 100ms..1h. */
  ttl: Duration;
  /** Queue (FIFO) for up to this long if the lock is held; default 0. */
  wait?: Duration;
  /** Holder name; default host:pid:random, a name only this call uses, by
   * which a grant whose answer was lost is found again. With a name of
   * your own (others may use it too), an unknown outcome is thrown as is. */
  holder?: string;
  /** Lock-delay after an expiry (see acquire). */
  lockDelay?: Duration;
  /** Permits of a semaphore (2..256): the lease is one of them, with a
   * token of its own (see AcquireOptions.limit). */
  limit?: number;
  /** How long before the lease may run out its signal aborts: time to stop
   * what you do before the server may expire the lease and grant the lock
   * to another. Default a tenth of the TTL, at most 2s. */
  margin?: Duration;
  /** Renew period; default a third of (TTL - margin). A renew that fails
   * without a refusal is tried again every quarter period. */
  renewEvery?: Duration;
  /** Bound on the final release (and on finding a lost grant); default 5s. */
  releaseTimeout?: Duration;
  /** Give up on acquiring when it aborts. */
  signal?: AbortSignal;
  /** Timeout of the acquire call, on top of wait (default the client's). */
  timeout?: Duration;
}

/** uniqueHolder: host:pid and a random suffix. */
export function uniqueHolder(): string {
  return `${hostname()}:${process.pid}:${randomBytes(6).toString("hex")}`;
}

/**
 * A lease kept alive in the background. Pass `token` with every write to a
 * resource the lock protects (client.put(k, v, {lease}) sends token and
 * lock). `signal` aborts with a LeaseLostError once the lease may be lost;
 * then stop. release() when done (withLock does it for you).
 */
export class Lease {
  readonly name: string;
  readonly lockKey: Bytes;
  readonly token: number;
  readonly ttlMs: number;
  readonly holder: string;
  readonly marginMs: number;
  readonly renewEveryMs: number;
  /** Successful renews so far. */
  renewals = 0;
  private readonly client: Client;
  private readonly ctl = new AbortController();
  private sent: number; // send time of the request that last gave the full TTL
  private deadlineTimer: NodeJS.Timeout | undefined;
  private tick: NodeJS.Timeout | undefined;
  private retryTimer: NodeJS.Timeout | undefined;
  private inflight = false;
  private kept = true;
  private refused = false;
  private lastErr: unknown;
  private released: Promise<void> | undefined;
  private readonly releaseTimeoutMs: number;
  private readonly renewCtl = new AbortController();

  /** @internal */
  constructor(client: Client, name: Bytes, g: Grant, holder: string, sent: number, marginMs: number, everyMs: number, releaseTimeoutMs: number) {
    this.client = client;
    this.lockKey = name;
    this.name = lockName(name);
    this.token = g.token;
    this.ttlMs = g.ttlMs;
    this.holder = holder;
    this.sent = sent;
    this.marginMs = marginMs;
    this.renewEveryMs = everyMs;
    this.releaseTimeoutMs = releaseTimeoutMs;
    client.track(this, true);
    this.armDeadline();
    this.tick = setInterval(() => this.renewNow(), everyMs);
    if (client.closed) this.lose(new LeaseLostError(`fencekv: lease ${this.name} (token ${this.token}): the client is closed`, this.name, this.token, new ClientClosedError()));
  }

  /** Aborted with a LeaseLostError once the lease may be lost. */
  get signal(): AbortSignal {
    return this.ctl.signal;
  }

  /** True once the lease may be lost. */
  get lost(): boolean {
    return this.ctl.signal.aborted;
  }

  /** The local deadline (performance.now() ms): when the lease is taken as
   * lost without a successful renew. */
  get deadline(): number {
    return this.sent + this.ttlMs - this.marginMs;
  }

  /** check throws the LeaseLostError once the lease may be lost. */
  check(): void {
    if (this.ctl.signal.aborted) throw this.ctl.signal.reason;
  }

  private armDeadline(): void {
    if (this.deadlineTimer) clearTimeout(this.deadlineTimer);
    const ms = Math.max(this.deadline - now(), 0);
    this.deadlineTimer = setTimeout(() => {
      const within = this.marginMs > 0 ? `${this.ttlMs - this.marginMs} ms of its TTL of ${this.ttlMs} ms (a margin of ${this.marginMs} ms)` : `its TTL of ${this.ttlMs} ms`;
      const last = this.lastErr instanceof Error ? ` (last: ${this.lastErr.message})` : "";
      this.lose(new LeaseLostError(`fencekv: lease lost: no renew of ${this.name} (token ${this.token}) succeeded within ${within}${last}`, this.name, this.token, this.lastErr));
    }, ms);
  }

  private lose(err: LeaseLostError): void {
    if (!this.ctl.signal.aborted) this.ctl.abort(err);
    this.stopKeeping();
  }

  /** @internal stop the renewing (release, lost, client closed). */
  stopKeeping(): void {
    if (!this.kept) return;
    this.kept = false;
    clearTimeout(this.deadlineTimer);
    clearInterval(this.tick);
    clearTimeout(this.retryTimer);
    this.renewCtl.abort();
    this.client.track(this, false);
    if (this.client.closed && !this.ctl.signal.aborted) {
      this.ctl.abort(new LeaseLostError(`fencekv: lease ${this.name} (token ${this.token}): the client is closed; no renew can be sent`, this.name, this.token, new ClientClosedError()));
    }
  }

  /** @internal one renew, unless one is in flight. */
  renewNow(): void {
    if (!this.kept || this.inflight) return;
    this.inflight = true;
    const at = now();
    const link = this.client.current;
    // A renew gets one period: a node that does not answer within it is left
    // for the next address, so the renews after it reach a live leader
    // within the TTL.
    const timeout = Math.max(Math.min(this.ttlMs, this.renewEveryMs), 1);
    this.client
      .renew(this.lockKey, this.token, { timeout, signal: this.renewCtl.signal })
      .then(
        () => {
          this.inflight = false;
          if (!this.kept) return;
          this.lastErr = undefined;
          this.renewals++;
          if (at > this.sent) {
            this.sent = at;
            this.armDeadline();
          }
        },
        (err: unknown) => {
          this.inflight = false;
          if (!this.kept) return;
          if (err instanceof NotHolderError || err instanceof LeaseExpiredError) {
            this.refused = true;
            this.lose(new LeaseLostError(`fencekv: lease lost: renew of ${this.name} (token ${this.token}) refused: ${err.message}`, this.name, this.token, err));
            return;
          }
          if (err instanceof ClientClosedError) {
            this.stopKeeping();
            return;
          }
          // Connection trouble, no leader, a renew that timed out: the
          // deadline decides; until then, try again sooner.
          this.lastErr = err;
          if (err instanceof TimeoutError || retryable(err)) this.client.leave(link, err);
          clearTimeout(this.retryTimer);
          this.retryTimer = setTimeout(() => this.renewNow(), Math.max(this.renewEveryMs / 4, 1));
        },
      );
  }

  /**
   * release stops the renewing and releases the lock (within the release
   * timeout, trying again while the server is unreachable). A lock that is
   * no longer ours (not_holder, lease_expired) counts as released. After a
   * lost lease it releases too: the server may still hold it for us. It is
   * idempotent.
   */
  release(): Promise<void> {
    if (!this.released) this.released = this.doRelease();
    return this.released;
  }

  private async doRelease(): Promise<void> {
    this.stopKeeping();
    if (this.refused || this.client.closed) return;
    try {
      await retryCall(this.client, this.releaseTimeoutMs, (timeout) => this.client.release(this.lockKey, this.token, { timeout }));
    } catch (e) {
      if (e instanceof NotHolderError || e instanceof LeaseExpiredError || e instanceof ClientClosedError) return;
      if (this.lost) return; // it was lost: the release was a courtesy
      throw e;
    }
  }

  async [Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")](): Promise<void> {
    await this.release();
  }
}

/** retryCall calls fn until it succeeds or fails for good, within
 * timeoutMs: each try gets a third of it; a node that does not answer in
 * time or is unavailable is left for the next address. */
export async function retryCall<T>(client: Client, timeoutMs: number, fn: (timeout: number) => Promise<T>): Promise<T> {
  const until = now() + timeoutMs;
  let pauseMs = 20;
  for (;;) {
    const link = client.current;
    const left = until - now();
    try {
      return await fn(Math.max(Math.ceil(Math.min(timeoutMs / 3, left)), 1));
    } catch (e) {
      if (!retryable(e) || client.closed || now() >= until) throw e;
      client.leave(link, e);
      if (e instanceof TimeoutError) continue;
      await pause(Math.min(pauseMs, Math.max(until - now(), 0)), client.closingSignal);
      pauseMs = Math.min(2 * pauseMs, 500);
      if (now() >= until) throw e;
    }
  }
}

/** lockLease is Client.lock. */
export async function lockLease(client: Client, name: Bytes, o: LockOptions): Promise<Lease> {
  const ttlMs = toMs(o.ttl, "ttl");
  const waitMs = optMs(o.wait, "wait") ?? 0;
  const marginMs = optMs(o.margin, "margin") ?? Math.min(Math.floor(ttlMs / 10), 2000);
  if (marginMs < 0 || marginMs >= ttlMs) {
    throw new FencekvError("bad_request", `fencekv: lock margin ${marginMs} ms: want 0 or more, and shorter than the TTL of ${ttlMs} ms`);
  }
  const everyMs = optMs(o.renewEvery, "renewEvery") || Math.max(Math.floor((ttlMs - marginMs) / 3), 1);
  const releaseTimeoutMs = optMs(o.releaseTimeout, "releaseTimeout") || 5000;
  const ours = o.holder === undefined || o.holder === "";
  const holder = ours ? uniqueHolder() : o.holder!;
  let sent = now();
  let grant: Grant;
  let found = false;
  try {
    grant = await client.acquire(name, {
      ttl: ttlMs,
      wait: waitMs || undefined,
      holder,
      lockDelay: o.lockDelay,
      limit: o.limit,
      signal: o.signal,
      timeout: o.timeout,
    });
  } catch (err) {
    if (!ours || !isUnknownOutcome(err)) throw err;
    // The answer was lost: the acquire may have been granted. Held under our
    // name, the grant is ours.
    const g = await findGrant(client, name, ttlMs, holder, releaseTimeoutMs);
    if (g === undefined) throw err;
    if (o.signal?.aborted) {
      await retryCall(client, releaseTimeoutMs, (t) => client.release(name, g.token, { timeout: t })).catch(() => {});
      throw o.signal.reason;
    }
    grant = g;
    found = true;
  }
  if (waitMs > 0 || found) {
    // A queued grant's lease began when it was granted, some time after the
    // acquire was sent (and a found one's, at an unknown time): renew at once
    // and measure the lease from that renew's send time.
    sent = now();
    try {
      await client.renew(name, grant.token, { timeout: Math.max(Math.min(grant.ttlMs, everyMs), 1) });
    } catch (e) {
      await retryCall(client, releaseTimeoutMs, (t) => client.release(name, grant.token, { timeout: t })).catch(() => {});
      throw e;
    }
  }
  if (client.closed) throw new ClientClosedError();
  return new Lease(client, name, grant, holder, sent, marginMs, everyMs, releaseTimeoutMs);
}

/** findGrant looks the lock up after an acquire of unknown outcome made
 * under holder (a name only this call uses): held under it, the grant is
 * ours. */
async function findGrant(client: Client, name: Bytes, ttlMs: number, holder: string, timeoutMs: number): Promise<Grant | undefined> {
  try {
    const info = await retryCall(client, timeoutMs, (t) => client.lockInfo(name, { timeout: t }));
    const token = tokenOf(info, holder); // a semaphore's permits too
    if (token !== undefined) return { lock: lockName(name), token, ttlMs };
  } catch {
    // Cannot look it up: the outcome stays unknown.
  }
  return undefined;
}
