package io.fencekv;

import java.util.Map;

/** {@code lock_held}: the lock cannot be granted now (held, in lock-delay, or the wait ended). */
public class LockHeldException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public LockHeldException(String message, Map<String, Object> facts) {
        super("lock_held", message, facts);
    }

    /** The current holder's name ("" if none was given, or during a lock-delay). */
    public String holder() {
        return stringFact("holder");
    }

    /** The current holder's token (0 during a lock-delay). */
    public long token() {
        return longFact("token");
    }

    /** The earliest time the lock may become free (a hint). */
    public java.time.Duration retryAfter() {
        return java.time.Duration.ofMillis(longFact("retry_ms"));
    }
}
