// A watch on a connection of its own, resumed after a reconnect from the
// last revision it delivered, skipping that revision's events already
// delivered: every change once, in order, with no gap.

import type { Client } from "./client.js";
import { ClientClosedError, CompactedError, ConnectionError, FencekvError, LimitExceededError, UnavailableError } from "./errors.js";
import type { Link } from "./link.js";
import { pause } from "./time.js";
import { asBuffer, asNum, asText, type Bytes } from "./values.js";

export interface WatchOptions {
  /** Replay the kept events from this revision on (inclusive); default:
   * from now. */
  startRevision?: number;
  /** Also lock events (acquired, released, expired) for lock names under
   * the prefix. */
  locks?: boolean;
  /** Stop the watch when it aborts (the loop ends). */
  signal?: AbortSignal;
  /** Called each time the watch has started again after a reconnect (a
   * restarted server, say: changes in the gap may have no event). */
  onResume?: () => void;
}

export type WatchEvent =
  | { type: "put"; key: Buffer; value: Buffer; fence: number; revision: number }
  | { type: "delete"; key: Buffer; fence: number; revision: number }
  | { type: "acquired" | "released" | "expired"; lock: string; token: number; revision: number };

function toEvent(e: Record<string, unknown>): WatchEvent {
  const type = asText(e.type);
  const revision = asNum(e.revision);
  switch (type) {
    case "put":
      return { type, key: asBuffer(e.key), value: asBuffer(e.value ?? new Uint8Array()), fence: asNum(e.fence), revision };
    case "delete":
      return { type, key: asBuffer(e.key), fence: asNum(e.fence), revision };
    default:
      return { type: type as "acquired", lock: asText(e.lock), token: asNum(e.token), revision };
  }
}

const HIGH_WATER = 10_000;

/** An async iterator of watch events; see Client.watch. */
export class Watch implements AsyncIterableIterator<WatchEvent> {
  private readonly client: Client;
  private readonly prefix: Bytes;
  private readonly o: WatchOptions;
  private link: Link | undefined;
  private queue: WatchEvent[] = [];
  private head = 0;
  private waiter: { resolve: (r: IteratorResult<WatchEvent>) => void; reject: (e: unknown) => void } | undefined;
  private error: unknown;
  private ended = false;
  private started: Promise<number> | undefined;
  private next_ = 0; // the address to try first on a reconnect
  private lastRev = 0; // revision of the last event delivered (start - 1 before any)
  private seen = 0; // events of lastRev delivered
  private skipRev = 0; // on the current connection: events of skipRev to skip
  private skip = 0;
  private paused = false;
  private readonly stop = new AbortController();
  /** The server's revision when the watch first started. */
  revision = 0;

  /** @internal */
  constructor(client: Client, prefix: Bytes, o: WatchOptions) {
    this.client = client;
    this.prefix = prefix;
    this.o = o;
    if (o.startRevision && o.startRevision > 0) this.lastRev = o.startRevision - 1;
    client.track(this, true);
    o.signal?.addEventListener("abort", () => this.close(), { once: true });
  }

  /** ready resolves with the server's revision once the watch has started
   * (the first next() starts it otherwise); it rejects with the refusal
   * (e.g. CompactedError). */
  ready(): Promise<number> {
    if (!this.started) {
      this.started = this.connect(this.o.startRevision ?? 0, true).then(() => this.revision);
      this.started.catch(() => {});
    }
    return this.started;
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<WatchEvent>> {
    if (this.head < this.queue.length) return { value: this.take(), done: false };
    if (this.error !== undefined) {
      const e = this.error;
      this.error = undefined;
      this.ended = true;
      throw e;
    }
    if (this.ended) return { value: undefined, done: true };
    try {
      await this.ready();
    } catch (e) {
      this.finish();
      throw e;
    }
    if (this.head < this.queue.length) return { value: this.take(), done: false };
    if (this.ended) return { value: undefined, done: true };
    return new Promise((resolve, reject) => {
      this.waiter = { resolve, reject };
    });
  }

  async return(): Promise<IteratorResult<WatchEvent>> {
    this.close();
    return { value: undefined, done: true };
  }

  /** close stops the watch; a pending next() ends the loop. */
  close(): void {
    if (this.ended) return;
    this.finish();
    const w = this.waiter;
    this.waiter = undefined;
    w?.resolve({ value: undefined, done: true });
  }

  private finish(): void {
    this.ended = true;
    this.stop.abort();
    this.link?.fail(new Error("fencekv: watch closed"));
    this.client.track(this, false);
  }

  private take(): WatchEvent {
    const e = this.queue[this.head++]!;
    if (this.head === this.queue.length) {
      this.queue = [];
      this.head = 0;
    }
    if (this.paused && this.queue.length - this.head < HIGH_WATER / 10) {
      this.paused = false;
      this.link?.socket.resume();
    }
    return e;
  }

  private deliver(batch: WatchEvent[]): void {
    for (const e of batch) {
      if (e.revision !== this.lastRev) {
        this.lastRev = e.revision;
        this.seen = 0;
      }
      this.seen++;
    }
    const w = this.waiter;
    if (w) {
      this.waiter = undefined;
      this.queue.push(...batch.slice(1));
      w.resolve({ value: batch[0]!, done: false });
    } else {
      this.queue.push(...batch);
    }
    if (!this.paused && this.queue.length - this.head > HIGH_WATER) {
      // The caller is slow: stop reading (the server cancels the watch if
      // it falls too far behind; then it is resumed).
      this.paused = true;
      this.link?.socket.pause();
    }
  }

  private fail(err: unknown): void {
    if (this.ended) return;
    this.finish();
    const w = this.waiter;
    this.waiter = undefined;
    if (w) w.reject(err);
    else this.error = err;
  }

  private onNotification(l: Link, method: string, params: Record<string, unknown> | undefined): void {
    if (l !== this.link || this.ended) return;
    if (method === "watch_cancelled") {
      l.fail(new Error(`fencekv: watch cancelled by the server: ${asText(params?.reason)}`));
      return;
    }
    if (method !== "watch" || !params || !Array.isArray(params.events)) return;
    const batch: WatchEvent[] = [];
    for (const raw of params.events as Record<string, unknown>[]) {
      const e = toEvent(raw);
      if (e.revision < this.skipRev || (e.revision === this.skipRev && this.skip > 0)) {
        if (e.revision === this.skipRev) this.skip--;
        continue; // delivered before the reconnect
      }
      batch.push(e);
    }
    if (batch.length > 0) this.deliver(batch);
  }

  /** connect starts the watch from start (0: now) on the next address that
   * answers; the first time, a refusal is thrown; later, connection
   * failures are retried with backoff until it works or the server refuses
   * (compacted). */
  private async connect(start: number, first: boolean): Promise<void> {
    let backoff = 50;
    for (;;) {
      if (this.ended || this.client.closed) throw new ClientClosedError("fencekv: watch closed");
      let l: Link | undefined;
      try {
        l = await this.client.dialRound(this.next_);
        this.next_ = this.client.addrs.indexOf(l.addr) + 1;
        const ln = l;
        l.onNotification = (m, p) => this.onNotification(ln, m, p);
        this.link = l;
        this.skipRev = this.lastRev;
        this.skip = start > 0 ? this.seen : 0; // a watch from now replays nothing
        const r = await l.call(
          "watch",
          { prefix: this.prefix, locks: this.o.locks === true ? true : undefined, start_revision: start > 0 ? start : undefined },
          Math.max(this.client.timeoutMs, 1000),
        );
        if (this.ended) {
          l.fail(new Error("fencekv: watch closed"));
          return;
        }
        const rev = asNum(r.revision);
        if (first) this.revision = rev;
        if (start === 0 && this.lastRev === 0 && this.seen === 0) this.lastRev = rev; // resume after the start
        l.onDead = () => {
          if (this.link === ln && !this.ended) this.resume();
        };
        if (l.dead) this.resume();
        else if (!first) this.o.onResume?.();
        return;
      } catch (e) {
        if (l !== undefined) l.fail(e as Error);
        this.link = undefined;
        if (e instanceof CompactedError && this.seen > 0 && start === this.lastRev && e.revision === this.lastRev + 1) {
          // The server (restarted) keeps history from lastRev + 1: every key
          // event of lastRev was delivered (a later one would be at a later
          // revision), so resume right after it.
          start = this.lastRev + 1;
          this.seen = 0;
          continue;
        }
        const nodeOwn = e instanceof LimitExceededError || (e instanceof UnavailableError && !(e instanceof ConnectionError));
        if (e instanceof FencekvError && !(e instanceof ConnectionError) && !nodeOwn) throw e; // every node would say the same
        if (e instanceof ClientClosedError) throw e;
        if (first && !(nodeOwn && this.client.addrs.length > 1)) throw e;
        this.next_++;
        await pause(backoff * (0.8 + 0.4 * Math.random()), this.stop.signal);
        backoff = Math.min(2 * backoff, 2000);
      }
    }
  }

  private resume(): void {
    this.link = undefined;
    const from = this.seen === 0 ? this.lastRev + 1 : this.lastRev;
    this.connect(from, false).catch((e) => this.fail(e));
  }
}
