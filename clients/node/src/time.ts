// Durations: what callers pass (ms or a Go-style string), and the
// monotonic clock and pauses the client times itself with.

import { BadRequestError } from "./errors.js";

/** A duration: milliseconds as a number, or a Go-style string such as
 * "10s", "500ms", "1m30s", "1.5h". */
export type Duration = number | string;

const units: Record<string, number> = { ns: 1e-6, us: 1e-3, "µs": 1e-3, ms: 1, s: 1000, m: 60000, h: 3600000 };

/** toMs converts a Duration to whole milliseconds (rounded up, so that a
 * positive duration is never 0). */
export function toMs(d: Duration, what = "duration"): number {
  if (typeof d === "number") {
    if (!Number.isFinite(d) || d < 0) throw new BadRequestError("bad_request", `${what} ${d}: want a finite number of ms, 0 or more`);
    return Math.ceil(d);
  }
  if (typeof d !== "string") throw new BadRequestError("bad_request", `${what}: want ms or a string like "10s"`);
  const s = d.trim();
  if (/^\d+(\.\d+)?$/.test(s)) return Math.ceil(Number(s));
  const re = /(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)/y;
  let total = 0;
  let pos = 0;
  while (pos < s.length) {
    re.lastIndex = pos;
    const m = re.exec(s);
    if (!m) throw new BadRequestError("bad_request", `${what} ${JSON.stringify(d)}: want e.g. "10s", "500ms", "1m30s"`);
    total += Number(m[1]) * units[m[2]!]!;
    pos = re.lastIndex;
  }
  if (pos === 0) throw new BadRequestError("bad_request", `${what} "": want e.g. "10s"`);
  return Math.ceil(total);
}

export function optMs(d: Duration | undefined, what: string): number | undefined {
  return d === undefined ? undefined : toMs(d, what);
}

/** sleep for ms, or until signal aborts (then it resolves early). */
export function pause(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(done, ms);
    function done() {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    }
    signal?.addEventListener("abort", done, { once: true });
  });
}

/** now is the monotonic clock in ms. */
export const now = (): number => performance.now();
