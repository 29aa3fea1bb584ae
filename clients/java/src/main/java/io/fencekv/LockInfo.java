package io.fencekv;

import java.time.Duration;

/** A lock as {@code lock_info} and {@code locks} describe it. */
public record LockInfo(String lock, boolean held, String holder, long token, Duration ttl, long waiters, Duration lockDelay) {}
