package io.fencekv;

import java.time.Duration;

/**
 * Options of a raw {@code acquire}: the holder's display name, how long to queue, the lock-delay after an expiry,
 * and a semaphore's limit ({@link #withLimit}).
 */
public final class AcquireOptions {
    public static final AcquireOptions NONE = new AcquireOptions(null, Duration.ZERO, Duration.ZERO, null);

    final String holder;
    final Duration wait;
    final Duration lockDelay;
    final Integer limit; // null: not sent (a plain lock)

    private AcquireOptions(String holder, Duration wait, Duration lockDelay, Integer limit) {
        this.holder = holder;
        this.wait = wait;
        this.lockDelay = lockDelay;
        this.limit = limit;
    }

    public static AcquireOptions holder(String holder) {
        return NONE.withHolder(holder);
    }

    public static AcquireOptions waitFor(Duration wait) {
        return NONE.withWait(wait);
    }

    public AcquireOptions withHolder(String holder) {
        return new AcquireOptions(holder, wait, lockDelay, limit);
    }

    /** Queue (first come, first served) for up to wait if the lock is held. */
    public AcquireOptions withWait(Duration wait) {
        return new AcquireOptions(holder, wait, lockDelay, limit);
    }

    public AcquireOptions withLockDelay(Duration lockDelay) {
        return new AcquireOptions(holder, wait, lockDelay, limit);
    }

    /**
     * Permits: 2..256 makes the lock a semaphore and the grant one of its
     * permits, with a token of its own (PROTOCOL.md §5.2); 1 is a plain lock.
     * Sent as given: while any permit is live every acquire must give the
     * lock's limit, else {@link LimitMismatchException}; out of range (0,
     * negative, over 256) is {@link BadRequestException}.
     */
    public AcquireOptions withLimit(int limit) {
        return new AcquireOptions(holder, wait, lockDelay, limit);
    }

    public static AcquireOptions limit(int limit) {
        return NONE.withLimit(limit);
    }

    /** The limit given, or 0 if none (a plain lock). */
    public int limit() {
        return limit == null ? 0 : limit;
    }

    public String holder() {
        return holder;
    }

    public Duration waitTime() {
        return wait;
    }

    public Duration lockDelay() {
        return lockDelay;
    }
}
