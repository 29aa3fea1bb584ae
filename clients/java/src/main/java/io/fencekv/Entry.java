package io.fencekv;

import java.nio.charset.StandardCharsets;

/**
 * A key as {@code get} and {@code scan} report it. A missing key is not an
 * error: {@link #found()} is false, {@link #value()} null, and {@link #fence()}
 * is still its fence (a fence outlives a delete).
 */
public record Entry(byte[] key, boolean found, byte[] value, long fence, long revision) {
    /** The value as UTF-8 text, or null when not found. */
    public String valueString() {
        return value == null ? null : new String(value, StandardCharsets.UTF_8);
    }

    /** The key as UTF-8 text. */
    public String keyString() {
        return new String(key, StandardCharsets.UTF_8);
    }
}
