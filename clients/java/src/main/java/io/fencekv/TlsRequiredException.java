package io.fencekv;

import java.util.Map;

/**
 * {@code tls_required}: the server requires TLS and was sent plain bytes (it says so in its
 * {@code error} notification, then closes). A configuration error: nothing was served, so no
 * outcome is in doubt. Build the client with an {@code SSLContext}.
 */
public class TlsRequiredException extends FencekvException {
    private static final long serialVersionUID = 1L;

    public TlsRequiredException(String message, Map<String, Object> facts) {
        super("tls_required", message, facts);
    }
}
