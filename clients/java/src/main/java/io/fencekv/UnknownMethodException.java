package io.fencekv;

import java.util.Map;

/** {@code unknown_method}: the server does not know the method. */
public class UnknownMethodException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public UnknownMethodException(String message, Map<String, Object> facts) {
        super("unknown_method", message, facts);
    }
}
