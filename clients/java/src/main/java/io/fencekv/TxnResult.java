package io.fencekv;

import java.util.List;

/** The answer to a {@code txn}: the one revision of every op, and one result per op (key, fence, revision, incr's value). */
public record TxnResult(long revision, List<Result> results) {
    public record Result(byte[] key, long fence, long revision, long value) {}
}
