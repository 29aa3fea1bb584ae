package io.fencekv;

import java.util.Map;

/** {@code compare_failed}: a cas (or a txn compare) found another revision. */
public class CompareFailedException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public CompareFailedException(String message, Map<String, Object> facts) {
        super("compare_failed", message, facts);
    }

    /** The key's current revision, 0 if absent. */
    public long revision() {
        return longFact("revision");
    }

    /** For a txn: the key whose compare failed (null otherwise). */
    public byte[] key() {
        Object k = facts().get("key");
        return k instanceof byte[] ? (byte[]) k : k == null ? null : k.toString().getBytes(java.nio.charset.StandardCharsets.UTF_8);
    }
}
