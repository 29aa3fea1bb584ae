// fencekv: the Node client of the fencekv server (wire/PROTOCOL.md).

export { Client } from "./client.js";
export type {
  AcquireOptions,
  BackupInfo,
  CallOptions,
  ClientOptions,
  Consistency,
  Entry,
  Grant,
  LockInfo,
  Member,
  ReadOptions,
  Refusal,
  ScanOptions,
  Status,
  Token,
  TxnOp,
  TxnOptions,
  TxnResult,
  WriteOptions,
  WriteResult,
} from "./client.js";
export { Lease, uniqueHolder } from "./lock.js";
export type { LockOptions } from "./lock.js";
export { Watch } from "./watch.js";
export type { WatchEvent, WatchOptions } from "./watch.js";
export * from "./errors.js";
export { toMs } from "./time.js";
export type { Holder } from "./client.js"; // semaphores
export type { Duration } from "./time.js";
export type { Bytes } from "./values.js";
export * as sqlfence from "./sqlfence.js";
export * as election from "./election.js";
