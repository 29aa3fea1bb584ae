package io.fencekv;

import java.nio.charset.StandardCharsets;

/**
 * A watch event: {@code put}, {@code delete} (key, value, fence, revision), or
 * with lock events {@code acquired}, {@code released}, {@code expired} (lock, token, revision).
 */
public record Event(String type, byte[] key, byte[] value, long fence, long revision, String lock, long token) {
    public String keyString() {
        return key == null ? null : new String(key, StandardCharsets.UTF_8);
    }

    public String valueString() {
        return value == null ? null : new String(value, StandardCharsets.UTF_8);
    }
}
