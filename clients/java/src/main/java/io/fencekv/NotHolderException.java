package io.fencekv;

import java.util.Map;

/** {@code not_holder}: the lock is free or held by another token. */
public class NotHolderException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public NotHolderException(String message, Map<String, Object> facts) {
        super("not_holder", message, facts);
    }

    /** The current holder's token, 0 if the lock is free. */
    public long token() {
        return longFact("token");
    }
}
