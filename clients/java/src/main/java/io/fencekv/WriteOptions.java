package io.fencekv;

/**
 * The fencing of a write: the token (G2), {@code strict} (token must be above
 * the fence), and a lock for a held write (G4: accepted only while that lock is
 * held by the token with a live lease). Immutable; {@link #NONE} is a tokenless write.
 */
public final class WriteOptions {
    public static final WriteOptions NONE = new WriteOptions(0, false, null);

    final long token;
    final boolean strict;
    final String lock;

    private WriteOptions(long token, boolean strict, String lock) {
        this.token = token;
        this.strict = strict;
        this.lock = lock;
    }

    /** A write fenced by token. */
    public static WriteOptions token(long token) {
        return new WriteOptions(token, false, null);
    }

    /** A held write: fenced by the lease's token and naming its lock. */
    public static WriteOptions held(Lease lease) {
        return new WriteOptions(lease.token(), false, lease.name());
    }

    /** Requires token > fence. */
    public WriteOptions strict() {
        return new WriteOptions(token, true, lock);
    }

    /** Names the lock the token must hold (a held write). */
    public WriteOptions lock(String lock) {
        return new WriteOptions(token, strict, lock);
    }

    public long getToken() {
        return token;
    }

    public boolean isStrict() {
        return strict;
    }

    public String getLock() {
        return lock;
    }

    void into(java.util.Map<String, Object> p) {
        if (token != 0) p.put("token", token);
        if (strict) p.put("strict", true);
        if (lock != null) p.put("lock", lock);
    }
}
