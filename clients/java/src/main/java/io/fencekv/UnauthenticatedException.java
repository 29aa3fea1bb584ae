package io.fencekv;

import java.util.Map;

/** {@code unauthenticated}: the connection has not authenticated, or the name or secret is wrong. */
public class UnauthenticatedException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public UnauthenticatedException(String message, Map<String, Object> facts) {
        super("unauthenticated", message, facts);
    }
}
