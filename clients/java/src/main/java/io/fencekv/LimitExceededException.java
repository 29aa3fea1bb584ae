package io.fencekv;

import java.util.Map;

/** {@code limit_exceeded}: a server limit was reached (in-flight requests, waiters, connections, watches). */
public class LimitExceededException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public LimitExceededException(String message, Map<String, Object> facts) {
        super("limit_exceeded", message, facts);
    }
}
