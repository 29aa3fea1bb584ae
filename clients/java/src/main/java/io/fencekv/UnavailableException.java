package io.fencekv;

import java.util.Map;

/**
 * {@code unavailable}: the server could not serve the request (closed, shutting
 * down, no leader within its hold timeout, a failed commit). When
 * {@link #outcomeUnknown()} is true the write may or may not have been applied,
 * and may yet be applied later: read before retrying a write that is not
 * idempotent, or fence it (a token, or cas). {@link ConnectionException}, the
 * failure of the connection itself, is one too.
 */
public class UnavailableException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public UnavailableException(String message, Map<String, Object> facts) {
        super("unavailable", message, facts);
    }

    UnavailableException(String code, String message, Map<String, Object> facts, Throwable cause) {
        super(code, message, facts, cause);
    }

    /** True if the request was sent and may have been applied (PROTOCOL.md §8, "Unknown outcome"). */
    public boolean outcomeUnknown() {
        return "unknown".equals(stringFact("outcome"));
    }
}
