package io.fencekv;

import java.util.Map;

/** {@code too_large}: a key, lock name or holder over 4 KiB, a value over 1 MiB, or a message over 4 MiB. */
public class TooLargeException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public TooLargeException(String message, Map<String, Object> facts) {
        super("too_large", message, facts);
    }
}
