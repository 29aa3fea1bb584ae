package io.fencekv;

import java.time.Duration;

/** The answer to a raw {@code acquire}: the lock, its fencing token and the lease's TTL. */
public record Grant(String lock, long token, Duration ttl) {}
