package io.fencekv;

import java.util.Map;

/** {@code permission_denied}: the principal has no right to this method, key or lock name. */
public class PermissionDeniedException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public PermissionDeniedException(String message, Map<String, Object> facts) {
        super("permission_denied", message, facts);
    }
}
