package io.fencekv;

import java.util.Map;

/** {@code stale_token}: the write's token is below the key's fence (or not above it with strict). Nothing changed. */
public class StaleTokenException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public StaleTokenException(String message, Map<String, Object> facts) {
        super("stale_token", message, facts);
    }

    /** The key's (or resource's) current fence. */
    public long fence() {
        return longFact("fence");
    }
}
