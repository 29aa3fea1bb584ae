package io.fencekv;

import java.time.Duration;

/**
 * Options of {@link FencekvClient#lock}: how long to queue for the lock, the
 * holder name (default: a name of its own, host:pid:random, so that a grant
 * whose answer was lost can be found), the lock-delay, the margin (how long
 * before the lease may run out it is taken as lost; default a tenth of the
 * TTL), the renew period (default a third of TTL − margin), the time the
 * final release may take (default 5 s), and a semaphore's limit
 * ({@link #withLimit}: the lease is then one of its permits).
 */
public final class LockOptions {
    public static final LockOptions DEFAULT = new LockOptions(Duration.ZERO, null, Duration.ZERO, null, null, Duration.ofSeconds(5), null);

    final Duration wait;
    final String holder;
    final Duration lockDelay;
    final Duration margin;
    final Duration renewEvery;
    final Duration releaseTimeout;
    final Integer limit; // null: a plain lock

    private LockOptions(Duration wait, String holder, Duration lockDelay, Duration margin, Duration renewEvery, Duration releaseTimeout,
            Integer limit) {
        this.limit = limit;
        this.wait = wait;
        this.holder = holder;
        this.lockDelay = lockDelay;
        this.margin = margin;
        this.renewEvery = renewEvery;
        this.releaseTimeout = releaseTimeout;
    }

    public static LockOptions waitFor(Duration wait) {
        return DEFAULT.withWait(wait);
    }

    /** Queue for the lock up to wait (0: fail at once with LockHeldException). */
    public LockOptions withWait(Duration wait) {
        return new LockOptions(wait, holder, lockDelay, margin, renewEvery, releaseTimeout, limit);
    }

    /** A holder name of the caller's: then a lost grant cannot be told apart from another's, and is not looked up. */
    public LockOptions withHolder(String holder) {
        return new LockOptions(wait, holder, lockDelay, margin, renewEvery, releaseTimeout, limit);
    }

    public LockOptions withLockDelay(Duration d) {
        return new LockOptions(wait, holder, d, margin, renewEvery, releaseTimeout, limit);
    }

    public LockOptions withMargin(Duration d) {
        return new LockOptions(wait, holder, lockDelay, d, renewEvery, releaseTimeout, limit);
    }

    public LockOptions withRenewEvery(Duration d) {
        return new LockOptions(wait, holder, lockDelay, margin, d, releaseTimeout, limit);
    }

    public LockOptions withReleaseTimeout(Duration d) {
        return new LockOptions(wait, holder, lockDelay, margin, renewEvery, d, limit);
    }

    /**
     * One of limit permits of a semaphore (2..256; see
     * {@link AcquireOptions#withLimit}): renewed, lost and released as a lock's
     * lease, with the permit's own token.
     */
    public LockOptions withLimit(int limit) {
        return new LockOptions(wait, holder, lockDelay, margin, renewEvery, releaseTimeout, limit);
    }

    public static LockOptions limit(int limit) {
        return DEFAULT.withLimit(limit);
    }
}
