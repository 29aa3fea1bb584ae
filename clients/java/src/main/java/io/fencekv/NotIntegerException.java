package io.fencekv;

import java.util.Map;

/** {@code not_integer}: incr found a value that is not a signed 64-bit decimal, or the sum overflows. */
public class NotIntegerException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public NotIntegerException(String message, Map<String, Object> facts) {
        super("not_integer", message, facts);
    }
}
