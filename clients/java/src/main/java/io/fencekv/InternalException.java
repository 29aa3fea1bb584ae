package io.fencekv;

import java.util.Map;

/** {@code internal}: a bug in the server (it recovered from a panic). */
public class InternalException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public InternalException(String message, Map<String, Object> facts) {
        super("internal", message, facts);
    }
}
