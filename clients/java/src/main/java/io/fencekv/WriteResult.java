package io.fencekv;

/**
 * The answer to a write: the key's fence after it, its new revision, and for
 * {@code delete} whether a live key was removed, for {@code incr} the new value.
 */
public record WriteResult(long fence, long revision, boolean deleted, long value) {}
