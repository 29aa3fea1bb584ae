package io.fencekv;

import java.util.HashMap;
import java.util.Map;

/**
 * A call that failed with the connection instead of being answered: the
 * connection broke (or was left, not answering) while the call was in flight,
 * or there was no connection and none could be made. Its code is
 * {@code "connection"}. {@link #outcomeUnknown()} is true exactly when the
 * request was written and changes state (a write or lock method): it may or
 * may not have been applied. A read's outcome, or that of a request never
 * written, is never unknown: it is safe to send again.
 */
public class ConnectionException extends UnavailableException {
    private static final long serialVersionUID = 1L;

    private final String address;

    ConnectionException(String address, boolean outcomeUnknown, String message, Throwable cause) {
        super("connection", "connection to " + address + ": " + message
                + (outcomeUnknown ? " (the request was sent: it may or may not have been applied)" : ""),
                facts(message, outcomeUnknown), cause);
        this.address = address;
    }

    private static Map<String, Object> facts(String message, boolean unknown) {
        Map<String, Object> m = new HashMap<>();
        m.put("code", "connection");
        m.put("message", message);
        if (unknown) m.put("outcome", "unknown");
        return m;
    }

    /** The server address (or addresses) the connection was to. */
    public String address() {
        return address;
    }

    ConnectionException withOutcome(boolean unknown) {
        return new ConnectionException(address, unknown, stringFact("message"), getCause());
    }
}
