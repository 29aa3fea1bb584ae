// Helpers: durations, keys, and the MessagePack framer that cuts the
// server's stream into whole messages.

import { BadRequestError, ProtocolError } from "./errors.js";

/** A duration: milliseconds as a number, or a Go-style string such as
 * "10s", "500ms", "1m30s", "1.5h". */
export type Duration = number | string;

/** A key, value, prefix or lock name: a string (sent as UTF-8) or bytes. */
export type Bytes = string | Uint8Array;

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

/** asBuffer views bytes the decoder returned as a Buffer (no copy). */
export function asBuffer(v: unknown): Buffer {
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength);
  if (typeof v === "string") return Buffer.from(v, "utf8");
  return Buffer.alloc(0);
}

/** asText decodes a str or bin the server sent as text (invalid UTF-8 is
 * replaced, never an error). */
export function asText(v: unknown): string {
  if (typeof v === "string") return v;
  if (v instanceof Uint8Array) return Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString("utf8");
  return "";
}

export function asNum(v: unknown): number {
  if (typeof v === "number") return v;
  if (typeof v === "bigint") return Number(v);
  return 0;
}

/** messageEnd returns the offset just past the MessagePack object that
 * starts at buf[start], or -1 if buf ends before it does. It reads headers
 * only: the server's answers are cut into messages before they are
 * decoded. */
export function messageEnd(buf: Uint8Array, start: number): number {
  let pos = start;
  let need = 1; // objects still to read
  const len = buf.length;
  while (need > 0) {
    if (pos >= len) return -1;
    const b = buf[pos]!;
    need--;
    if (b <= 0x7f || b >= 0xe0) {
      pos += 1;
    } else if (b <= 0x8f) {
      need += 2 * (b & 0x0f);
      pos += 1;
    } else if (b <= 0x9f) {
      need += b & 0x0f;
      pos += 1;
    } else if (b <= 0xbf) {
      pos += 1 + (b & 0x1f);
    } else {
      switch (b) {
        case 0xc0:
        case 0xc2:
        case 0xc3:
          pos += 1;
          break;
        case 0xc4:
        case 0xd9:
          if (pos + 2 > len) return -1;
          pos += 2 + buf[pos + 1]!;
          break;
        case 0xc5:
        case 0xda:
          if (pos + 3 > len) return -1;
          pos += 3 + ((buf[pos + 1]! << 8) | buf[pos + 2]!);
          break;
        case 0xc6:
        case 0xdb:
          if (pos + 5 > len) return -1;
          pos += 5 + u32(buf, pos + 1);
          break;
        case 0xc7:
          if (pos + 2 > len) return -1;
          pos += 3 + buf[pos + 1]!;
          break;
        case 0xc8:
          if (pos + 3 > len) return -1;
          pos += 4 + ((buf[pos + 1]! << 8) | buf[pos + 2]!);
          break;
        case 0xc9:
          if (pos + 5 > len) return -1;
          pos += 6 + u32(buf, pos + 1);
          break;
        case 0xca:
          pos += 5;
          break;
        case 0xcb:
          pos += 9;
          break;
        case 0xcc:
        case 0xd0:
          pos += 2;
          break;
        case 0xcd:
        case 0xd1:
          pos += 3;
          break;
        case 0xce:
        case 0xd2:
          pos += 5;
          break;
        case 0xcf:
        case 0xd3:
          pos += 9;
          break;
        case 0xd4:
          pos += 3;
          break;
        case 0xd5:
          pos += 4;
          break;
        case 0xd6:
          pos += 6;
          break;
        case 0xd7:
          pos += 10;
          break;
        case 0xd8:
          pos += 18;
          break;
        case 0xdc:
          if (pos + 3 > len) return -1;
          need += (buf[pos + 1]! << 8) | buf[pos + 2]!;
          pos += 3;
          break;
        case 0xdd:
          if (pos + 5 > len) return -1;
          need += u32(buf, pos + 1);
          pos += 5;
          break;
        case 0xde:
          if (pos + 3 > len) return -1;
          need += 2 * ((buf[pos + 1]! << 8) | buf[pos + 2]!);
          pos += 3;
          break;
        case 0xdf:
          if (pos + 5 > len) return -1;
          need += 2 * u32(buf, pos + 1);
          pos += 5;
          break;
        default:
          throw new ProtocolError(`fencekv: the server sent the invalid MessagePack byte 0x${b.toString(16)}`);
      }
    }
    if (need > 1e8) throw new ProtocolError("fencekv: the server sent a message with too many elements");
  }
  return pos > len ? -1 : pos;
}

function u32(buf: Uint8Array, i: number): number {
  return ((buf[i]! << 24) >>> 0) + ((buf[i + 1]! << 16) | (buf[i + 2]! << 8) | buf[i + 3]!);
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
