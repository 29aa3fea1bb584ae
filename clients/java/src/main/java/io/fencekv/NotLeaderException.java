package io.fencekv;

import java.util.Map;

/** {@code not_leader}: a cluster node that does not lead was sent a forwarded request (clients do not normally see it). */
public class NotLeaderException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public NotLeaderException(String message, Map<String, Object> facts) {
        super("not_leader", message, facts);
    }

    /** The leader's client address, "" if unknown. */
    public String leader() {
        return stringFact("leader");
    }
}
