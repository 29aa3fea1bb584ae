// Leader election, a composition of the lock calls (wire/PROTOCOL.md §12):
// an election is the lock of the same name, the leader's value is the
// lock's holder, and the epoch is the lock's token.
//
//   const lead = await campaign(client, "nightly-report", hostname(), { ttl: "10s" });
//   await client.put("reports/latest", "...", { lease: lead.lease }); // fenced by the epoch
//   lead.signal.addEventListener("abort", stop);                       // lost: stop at once
//   await lead.resign();
//
//   for await (const s of observe(client, "nightly-report")) console.log(s.value, s.epoch);

import type { Client } from "./client.js";
import { retryable } from "./client.js";
import { BadRequestError, ClientClosedError, isUnknownOutcome, LockHeldError, TimeoutError, TooLargeError } from "./errors.js";
import type { Lease } from "./lock.js";
import { type Duration, optMs, pause, toMs } from "./time.js";
import type { Watch } from "./watch.js";

/** The longest leader value: the lock holder's limit. */
export const MAX_VALUE = 4096;

/** An election's state: who leads (value) with which epoch, or nobody. */
export interface Leader {
  name: string;
  /** Someone leads; false: no leader (epoch is then the last one, if known). */
  held: boolean;
  value: string;
  epoch: number;
  /** Lease time left; 0 when held but expiring (still the leader). */
  ttlMs: number;
}

export interface CampaignOptions {
  /** Leadership lease length, 100ms..1h; default 10s. */
  ttl?: Duration;
  /** How long before the lease may run out the leadership is taken as lost
   * (time to stop); default min(ttl/3, 3s). Shorter than ttl. */
  margin?: Duration;
  /** wait of each acquire (sent again when it runs out); default 60s. */
  wait?: Duration;
  /** Give up campaigning when it aborts (nothing is left held). */
  signal?: AbortSignal;
}

/** A won election: the lease of its lock, kept alive until resign(). */
export class Leadership {
  readonly name: string;
  readonly value: string;
  readonly epoch: number;
  readonly lease: Lease;
  /** @internal */
  constructor(lease: Lease, value: string) {
    this.lease = lease;
    this.name = lease.name;
    this.value = value;
    this.epoch = lease.token;
  }
  /** Aborts (with a LeaseLostError) once the leadership may be lost. */
  get signal(): AbortSignal {
    return this.lease.signal;
  }
  get lost(): boolean {
    return this.lease.lost;
  }
  /** check throws once the leadership may be lost. */
  check(): void {
    this.lease.check();
  }
  /** resign gives the leadership up: the next candidate leads at once.
   * Resigning a leadership already lost (or resigned) does nothing. */
  resign(): Promise<void> {
    return this.lease.release();
  }
  async [Symbol.asyncDispose ?? Symbol.for("Symbol.asyncDispose")](): Promise<void> {
    await this.resign();
  }
}

function checkName(name: string): void {
  if (name === "") throw new BadRequestError("bad_request", "fencekv: election name: empty");
}

/**
 * campaign resolves once this caller leads the election name with value
 * (queueing first come, first served). An acquire whose answer was lost is
 * looked up: a lock held under value is released and the campaign goes on,
 * so give each candidate its own value. o.signal aborts the campaign.
 */
export async function campaign(client: Client, name: string, value: string, o: CampaignOptions = {}): Promise<Leadership> {
  checkName(name);
  if (value === "") {
    throw new BadRequestError("bad_request", "fencekv: election value: empty; each candidate needs a value of its own (its address, say)");
  }
  if (Buffer.byteLength(value) > MAX_VALUE) {
    throw new TooLargeError("too_large", `fencekv: election value: ${Buffer.byteLength(value)} bytes, over ${MAX_VALUE}`);
  }
  const ttlMs = o.ttl === undefined ? 10000 : toMs(o.ttl, "ttl");
  if (!(ttlMs > 0)) throw new BadRequestError("bad_request", `fencekv: election ttl ${ttlMs} ms: want above 0`);
  const marginMs = optMs(o.margin, "margin") ?? Math.min(Math.floor(ttlMs / 3), 3000);
  if (marginMs < 0 || marginMs >= ttlMs) {
    throw new BadRequestError("bad_request", `fencekv: election margin ${marginMs} ms: want 0 or more, and shorter than the TTL of ${ttlMs} ms`);
  }
  const waitMs = optMs(o.wait, "wait") || 60000;
  let pauseMs = 20;
  for (;;) {
    if (o.signal?.aborted) throw o.signal.reason;
    try {
      const lease = await client.lock(name, { ttl: ttlMs, wait: waitMs, holder: value, margin: marginMs, signal: o.signal });
      return new Leadership(lease, value);
    } catch (e) {
      if (o.signal?.aborted) {
        await releaseOurs(client, name, value);
        throw o.signal.reason;
      }
      if (e instanceof LockHeldError) {
        pauseMs = 20;
        continue; // the wait ran out: queue again
      }
      if (e instanceof ClientClosedError) throw e;
      if (isUnknownOutcome(e) || e instanceof TimeoutError) await releaseOurs(client, name, value);
      else if (!retryable(e)) throw e;
    }
    await pause(pauseMs, o.signal);
    pauseMs = Math.min(2 * pauseMs, 1000);
  }
}

/** releaseOurs frees a grant made under value whose answer was lost. */
async function releaseOurs(client: Client, name: string, value: string): Promise<void> {
  try {
    const info = await client.lockInfo(name);
    if (info.held && info.holder === value) await client.release(name, info.token);
  } catch {
    // A grant left behind runs out after its TTL.
  }
}

/** leader reads the election once (lock_info). A lease run out whose
 * expiry is not applied yet counts as leading, with ttlMs 0. */
export async function leader(client: Client, name: string): Promise<Leader> {
  checkName(name);
  const info = await client.lockInfo(name);
  return { name, held: info.held, value: info.held ? info.holder : "", epoch: info.token, ttlMs: info.ttlMs };
}

/**
 * observe yields the election's states: the current one first, then each
 * change (a watch of the lock's events, then a lock_info, and another after
 * each event of the lock). Epochs only rise; leaders that come and go
 * between two reads are coalesced; the latest state is always delivered.
 * It goes on through reconnects until o.signal aborts or the loop breaks.
 */
export async function* observe(client: Client, name: string, o: { signal?: AbortSignal } = {}): AsyncGenerator<Leader, void, undefined> {
  checkName(name);
  let last: Leader | undefined;
  let top = 0;
  const fresh = (s: Leader): boolean => {
    if (last && s.held === last.held && s.value === last.value && s.epoch === last.epoch) return false;
    if (s.held && top > 0 && s.epoch <= top) return false; // a stale answer
    last = s;
    if (s.held) top = s.epoch;
    return true;
  };
  const read = async (): Promise<Leader> => {
    let p = 20;
    for (;;) {
      try {
        return await leader(client, name);
      } catch (e) {
        if (!retryable(e) || o.signal?.aborted || client.closed) throw e;
      }
      await pause(p, o.signal);
      p = Math.min(2 * p, 1000);
    }
  };
  let pauseMs = 20;
  let first = true;
  while (!o.signal?.aborted) {
    let w: Watch | undefined;
    try {
      // The watch may reconnect by itself (a restarted server): changes in
      // the gap may have no event, so read again when it has resumed.
      let resumed!: Promise<null>;
      let onResume!: () => void;
      const arm = () => (resumed = new Promise<null>((r) => (onResume = () => r(null))));
      arm();
      w = client.watch(name, { locks: true, signal: o.signal, onResume: () => onResume() });
      await w.ready();
      const s = await read();
      if (fresh(s)) yield s;
      first = false;
      let next = w.next();
      for (;;) {
        const r = await Promise.race([next, resumed]);
        if (r !== null && r.done) break;
        if (r === null) arm();
        else next = w.next();
        if (r === null || ("lock" in r.value && r.value.lock === name)) {
          const s = await read();
          if (fresh(s)) yield s;
          pauseMs = 20;
        }
      }
    } catch (e) {
      if (first || o.signal?.aborted || client.closed) {
        if (o.signal?.aborted) return;
        throw e;
      }
    } finally {
      w?.close();
    }
    if (o.signal?.aborted || client.closed) return;
    // The watch ended: start again (the new read reflects the gap).
    try {
      await pause(pauseMs, o.signal);
    } catch {
      return;
    }
    pauseMs = Math.min(2 * pauseMs, 1000);
  }
}
