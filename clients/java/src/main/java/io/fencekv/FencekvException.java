package io.fencekv;

import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * A call that failed: refused by the server (with its stable {@link #code()} and
 * the facts of that code, PROTOCOL.md §6), or failed with the connection
 * ({@link ConnectionException}). Each refusal code has its own subclass;
 * a code this client does not know arrives as a plain FencekvException.
 */
public class FencekvException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    private final String code;
    private final transient Map<String, Object> facts;

    public FencekvException(String code, String message, Map<String, Object> facts) {
        this(code, message, facts, null);
    }

    public FencekvException(String code, String message, Map<String, Object> facts, Throwable cause) {
        super(code + ": " + message, cause);
        this.code = code;
        this.facts = facts == null ? Map.of() : Collections.unmodifiableMap(new LinkedHashMap<>(facts));
    }

    /** The server's stable error code, e.g. {@code stale_token}. */
    public String code() {
        return code;
    }

    /** The server's message (human-readable; not stable, do not parse it). */
    public String serverMessage() {
        Object m = facts.get("message");
        return m == null ? "" : m.toString();
    }

    /** Every field of the server's error map (code, message and the facts). */
    public Map<String, Object> facts() {
        return facts;
    }

    long longFact(String name) {
        Object v = facts.get(name);
        return v instanceof Number ? ((Number) v).longValue() : 0;
    }

    String stringFact(String name) {
        Object v = facts.get(name);
        if (v instanceof byte[]) return new String((byte[]) v, java.nio.charset.StandardCharsets.UTF_8);
        return v == null ? "" : v.toString();
    }

    /** The exception for a server error map. */
    static FencekvException of(Map<String, Object> err) {
        Object c = err.get("code");
        String code = c instanceof byte[] ? new String((byte[]) c, java.nio.charset.StandardCharsets.UTF_8)
                : c == null ? "unknown" : c.toString();
        Object m = err.get("message");
        String msg = m instanceof byte[] ? new String((byte[]) m, java.nio.charset.StandardCharsets.UTF_8)
                : m == null ? "" : m.toString();
        switch (code) {
            case "stale_token": return new StaleTokenException(msg, err);
            case "not_holder": return new NotHolderException(msg, err);
            case "lease_expired": return new LeaseExpiredException(msg, err);
            case "lock_held": return new LockHeldException(msg, err);
            case "compare_failed": return new CompareFailedException(msg, err);
            case "not_integer": return new NotIntegerException(msg, err);
            case "too_large": return new TooLargeException(msg, err);
            case "bad_request": return new BadRequestException(msg, err);
            case "unknown_method": return new UnknownMethodException(msg, err);
            case "unavailable": return new UnavailableException(msg, err);
            case "not_leader": return new NotLeaderException(msg, err);
            case "limit_exceeded": return new LimitExceededException(msg, err);
            case "limit_mismatch": return new LimitMismatchException(msg, err);
            case "internal": return new InternalException(msg, err);
            case "compacted": return new CompactedException(msg, err);
            case "unauthenticated": return new UnauthenticatedException(msg, err);
            case "permission_denied": return new PermissionDeniedException(msg, err);
            case "tls_required": return new TlsRequiredException(msg, err);
            default: return new FencekvException(code, msg, err);
        }
    }
}
