package io.fencekv;

import java.util.Map;

/**
 * {@code limit_mismatch}: an acquire's limit (1 when not given) is not the
 * lock's while any of its permits is live: a plain acquire of a semaphore, a
 * semaphore acquire of a held plain lock, or another limit (PROTOCOL.md §5.2).
 * Nothing changed and the acquire was not queued. The code has no facts:
 * {@link FencekvClient#lockInfo} tells the lock's limit.
 */
public class LimitMismatchException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public LimitMismatchException(String message, Map<String, Object> facts) {
        super("limit_mismatch", message, facts);
    }
}
