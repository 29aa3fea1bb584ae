// Errors: one class per refusal code of the protocol (wire/PROTOCOL.md §6),
// all extending FencekvError, each carrying the facts of its code. Errors
// the client makes itself (a broken connection, a timeout, a lost lease)
// have classes of their own under the same base.

/** The facts an error map carried, as the server sent them. */
export type Facts = Record<string, unknown>;

/** The base of every error this client throws. `code` is the server's
 * refusal code (switch on it), or one of the client's own: "unavailable"
 * for a connection failure or a timeout (see ConnectionError),
 * "lease_lost", "client_closed", "protocol". */
export class FencekvError extends Error {
  readonly code: string;
  /** Every field of the server's error map (code and message included). */
  readonly facts: Facts;
  constructor(code: string, message: string, facts: Facts = {}, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.facts = facts;
  }
  override get name(): string {
    return this.constructor.name;
  }
}

function num(v: unknown): number {
  if (typeof v === "number") return v;
  if (typeof v === "bigint") return Number(v);
  return 0;
}

function str(v: unknown): string {
  if (typeof v === "string") return v;
  if (v instanceof Uint8Array) return Buffer.from(v).toString("utf8");
  return "";
}

/** stale_token: a write's token is below the key's fence (or not above it
 * with strict); every tokenless write to a fenced key too. */
export class StaleTokenError extends FencekvError {
  /** The key's current fence. */
  get fence(): number {
    return num(this.facts.fence);
  }
  /** For a txn: the key whose fence refused it. */
  get key(): Buffer | undefined {
    const k = this.facts.key;
    return k instanceof Uint8Array ? Buffer.from(k.buffer, k.byteOffset, k.byteLength) : undefined;
  }
}

/** not_holder: the lock is free (token 0) or held by another token. */
export class NotHolderError extends FencekvError {
  /** The current holder's token, 0 if the lock is free. */
  get token(): number {
    return num(this.facts.token);
  }
}

/** lease_expired: the caller's token is the lock's latest grant, but its
 * lease has run out. */
export class LeaseExpiredError extends FencekvError {
  /** The caller's token. */
  get token(): number {
    return num(this.facts.token);
  }
}

/** lock_held: an acquire could not be granted now, or its wait ran out. */
export class LockHeldError extends FencekvError {
  /** The current holder's name ("" if none given, or in lock-delay). */
  get holder(): string {
    return str(this.facts.holder);
  }
  /** The current holder's token (0 in lock-delay). */
  get token(): number {
    return num(this.facts.token);
  }
  /** The earliest time, in ms, the lock may become free (a hint). */
  get retryAfterMs(): number {
    return num(this.facts.retry_ms);
  }
}

/** compare_failed: a cas (or a txn's compare) found another revision. */
export class CompareFailedError extends FencekvError {
  /** The key's current revision, 0 if absent. */
  get revision(): number {
    return num(this.facts.revision);
  }
  get key(): Buffer | undefined {
    const k = this.facts.key;
    return k instanceof Uint8Array ? Buffer.from(k.buffer, k.byteOffset, k.byteLength) : undefined;
  }
}

/** not_integer: incr found a value that is not a signed 64-bit decimal, or
 * the sum overflows. */
export class NotIntegerError extends FencekvError {}
/** too_large: a key, lock name or holder over 4 KiB, a value over 1 MiB, or
 * a message over 4 MiB. */
export class TooLargeError extends FencekvError {}
/** bad_request: malformed params, a missing one, one out of range. */
export class BadRequestError extends FencekvError {}
/** tls_required: a TLS server was sent plain bytes (in the server's error
 * notification). A configuration error: nothing was served, so no outcome
 * is in doubt. Connect with `tls`. */
export class TLSRequiredError extends FencekvError {}
/** unknown_method: the server does not know the method. */
export class UnknownMethodError extends FencekvError {}
/** limit_exceeded: a server limit (in flight, waiters, connections, watches). */
export class LimitExceededError extends FencekvError {}
/** limit_mismatch: an acquire's limit (1 when absent) is not the lock's
 * while any of its permits is live: a plain acquire of a semaphore, a
 * semaphore acquire of a held plain lock, or another limit (PROTOCOL.md
 * §5.2). Nothing changed and the acquire was not queued. No facts:
 * lockInfo tells the lock's limit. */
export class LimitMismatchError extends FencekvError {}
/** internal: a bug in the server (it recovered from a panic). */
export class InternalError extends FencekvError {}
/** unauthenticated: no or wrong credentials. */
export class UnauthenticatedError extends FencekvError {}
/** permission_denied: the principal has no right to this method, key or lock. */
export class PermissionDeniedError extends FencekvError {}

/** not_leader: a cluster node that does not lead (clients rarely see it). */
export class NotLeaderError extends FencekvError {
  /** The leader's client address, "" if unknown. */
  get leader(): string {
    return str(this.facts.leader);
  }
}

/** compacted: a watch asked to start before the history the server keeps. */
export class CompactedError extends FencekvError {
  /** The oldest revision the server keeps. */
  get revision(): number {
    return num(this.facts.revision);
  }
}

/** unavailable: the store cannot serve. When `outcomeUnknown` is true, a
 * write (or lock call) may or may not have been applied, and may yet be:
 * read before you retry it, or fence the retry. */
export class UnavailableError extends FencekvError {
  get outcomeUnknown(): boolean {
    return this.facts.outcome === "unknown";
  }
}

/** The call failed with the connection rather than being answered: the
 * connection broke with the call in flight, the client could not connect,
 * or (TimeoutError) no answer came in time. `sent` says whether any byte of
 * the request was written; `outcomeUnknown` is true when it was, and the
 * method changes state: it may have been applied. A call that was never
 * sent is safe to retry. */
export class ConnectionError extends UnavailableError {
  readonly addr: string;
  readonly sent: boolean;
  readonly method: string;
  readonly #unknown: boolean;
  constructor(message: string, o: { addr: string; sent: boolean; method: string; effect: boolean; cause?: unknown }) {
    super("unavailable", message, {}, { cause: o.cause });
    this.addr = o.addr;
    this.sent = o.sent;
    this.method = o.method;
    this.#unknown = o.sent && o.effect;
  }
  override get outcomeUnknown(): boolean {
    return this.#unknown;
  }
}

/** No answer came within the call's timeout. The call was sent: a write's
 * outcome is unknown. */
export class TimeoutError extends ConnectionError {}

/** The lease may be lost: a renew was refused (not_holder, lease_expired:
 * `cause` says which), or no renew succeeded before the local deadline
 * (TTL after the send time of the request that last gave the lease its
 * full TTL, less the margin). Stop working on what the lock protects. */
export class LeaseLostError extends FencekvError {
  readonly lock: string;
  readonly token: number;
  constructor(message: string, lock: string, token: number, cause?: unknown) {
    super("lease_lost", message, {}, { cause });
    this.lock = lock;
    this.token = token;
  }
}

/** The client was closed. */
export class ClientClosedError extends FencekvError {
  constructor(message = "fencekv: the client is closed") {
    super("client_closed", message);
  }
}

/** The server sent something that is not a valid answer. The connection is
 * closed; calls in flight on it fail with a ConnectionError caused by it. */
export class ProtocolError extends FencekvError {
  constructor(message: string) {
    super("protocol", message);
  }
}

type Ctor = new (code: string, message: string, facts: Facts) => FencekvError;

const classes: Record<string, Ctor> = {
  stale_token: StaleTokenError,
  not_holder: NotHolderError,
  lease_expired: LeaseExpiredError,
  lock_held: LockHeldError,
  compare_failed: CompareFailedError,
  not_integer: NotIntegerError,
  too_large: TooLargeError,
  bad_request: BadRequestError,
  unknown_method: UnknownMethodError,
  unavailable: UnavailableError,
  not_leader: NotLeaderError,
  limit_exceeded: LimitExceededError,
  limit_mismatch: LimitMismatchError,
  internal: InternalError,
  compacted: CompactedError,
  unauthenticated: UnauthenticatedError,
  permission_denied: PermissionDeniedError,
  tls_required: TLSRequiredError,
};

/** fromWire turns the server's error map into its class (a code this client
 * does not know is a plain FencekvError). */
export function fromWire(e: unknown): FencekvError {
  if (e === null || typeof e !== "object" || e instanceof Uint8Array || Array.isArray(e)) {
    return new ProtocolError(`fencekv: the server sent an error that is not a map: ${String(e)}`);
  }
  const facts = e as Facts;
  const code = str(facts.code) || "unknown";
  const message = str(facts.message) || code;
  const C = classes[code] ?? FencekvError;
  return new C(code, message, facts);
}

/** isUnknownOutcome: the error leaves a sent write or lock call's outcome
 * in doubt. */
export function isUnknownOutcome(err: unknown): boolean {
  return err instanceof UnavailableError && err.outcomeUnknown;
}
