package io.fencekv;

import java.util.Map;

/**
 * The lease may be lost: a renew was refused ({@code not_holder},
 * {@code lease_expired}, the cause), or no renew succeeded before the local
 * deadline (the send time of the request that last gave the lease its full
 * TTL, plus the TTL, less the margin), or the client was closed. Stop
 * working on the protected resource. Its code is {@code "lease_lost"}.
 */
public class LeaseLostException extends FencekvException {
    private static final long serialVersionUID = 1L;

    private final String lock;
    private final long token;

    LeaseLostException(String lock, long token, String message, Throwable cause) {
        super("lease_lost", "lock " + lock + " (token " + token + "): " + message,
                Map.of("code", "lease_lost", "message", message), cause);
        this.lock = lock;
        this.token = token;
    }

    public String lock() {
        return lock;
    }

    public long token() {
        return token;
    }

    /** True if the server refused a renew: the lock is certainly not this lease's any more. */
    public boolean refused() {
        return getCause() instanceof NotHolderException || getCause() instanceof LeaseExpiredException;
    }
}
