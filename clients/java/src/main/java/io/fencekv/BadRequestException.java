package io.fencekv;

import java.util.Map;

/** {@code bad_request}: malformed params, a missing or out-of-range param. */
public class BadRequestException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public BadRequestException(String message, Map<String, Object> facts) {
        super("bad_request", message, facts);
    }
}
