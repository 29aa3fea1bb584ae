package io.fencekv;

import java.util.Map;

/** {@code lease_expired}: the lock's latest grant is the caller's, but its lease has run out. */
public class LeaseExpiredException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public LeaseExpiredException(String message, Map<String, Object> facts) {
        super("lease_expired", message, facts);
    }

    /** The caller's token (the lock's latest grant). */
    public long token() {
        return longFact("token");
    }
}
