package io.fencekv;

import java.util.Map;

/** The answer to {@code status}: the main counters, and every field in {@link #fields()}. */
public record Status(String version, String node, String role, String leader, long term, long lastToken,
        long revision, long keys, long locks, long waiters, Map<String, Object> fields) {}
