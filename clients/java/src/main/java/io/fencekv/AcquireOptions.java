package io.fencekv;

import java.time.Duration;

/** Options of a raw {@code acquire}: the holder's display name, how long to queue, the lock-delay after an expiry. */
public final class AcquireOptions {
    public static final AcquireOptions NONE = new AcquireOptions(null, Duration.ZERO, Duration.ZERO);

    final String holder;
    final Duration wait;
    final Duration lockDelay;

    private AcquireOptions(String holder, Duration wait, Duration lockDelay) {
        this.holder = holder;
        this.wait = wait;
        this.lockDelay = lockDelay;
    }

    public static AcquireOptions holder(String holder) {
        return NONE.withHolder(holder);
    }

    public static AcquireOptions waitFor(Duration wait) {
        return NONE.withWait(wait);
    }

    public AcquireOptions withHolder(String holder) {
        return new AcquireOptions(holder, wait, lockDelay);
    }

    /** Queue (first come, first served) for up to wait if the lock is held. */
    public AcquireOptions withWait(Duration wait) {
        return new AcquireOptions(holder, wait, lockDelay);
    }

    public AcquireOptions withLockDelay(Duration lockDelay) {
        return new AcquireOptions(holder, wait, lockDelay);
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
