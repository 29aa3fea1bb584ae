package io.fencekv;

import java.util.Map;

/** {@code compacted}: a watch asked to start before the history the server keeps. */
public class CompactedException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public CompactedException(String message, Map<String, Object> facts) {
        super("compacted", message, facts);
    }

    /** The oldest revision the server keeps. */
    public long revision() {
        return longFact("revision");
    }
}
