package io.fencekv;

/** A fenced write the server refused, as {@code refusals} lists it. */
public record Refusal(long seq, long timeMs, String code, String op, byte[] key, String lock, long token,
        long fence, long holderToken, String grantedLock, String grantedHolder, String client, boolean known) {}
