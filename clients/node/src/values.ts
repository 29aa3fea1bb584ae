// The values the client sends and the server returns: keys, values and
// names as strings or bytes, and the conversions of what the decoder gives.

/** A key, value, prefix or lock name: a string (sent as UTF-8) or bytes. */
export type Bytes = string | Uint8Array;

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
