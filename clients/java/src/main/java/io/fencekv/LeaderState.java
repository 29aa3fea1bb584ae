package io.fencekv;

import java.time.Duration;

/**
 * An election's state (PROTOCOL.md §12): who leads ({@code value}) with which
 * {@code epoch}, or nobody ({@code held} false; {@code epoch} is then the last
 * one, if the server still knows it, and {@code value} is ""). {@code ttl} is
 * the lease time left: zero when held but run out and not yet expired by the
 * server, which still counts as leading.
 */
public record LeaderState(String name, boolean held, String value, long epoch, Duration ttl) {
    static LeaderState of(String name, LockInfo in) {
        return new LeaderState(name, in.held(), in.held() ? in.holder() : "", in.token(), in.ttl());
    }

    /** Same leader (or the same "no leader"): held, value and epoch equal; ttl aside. */
    boolean sameAs(LeaderState o) {
        return o != null && held == o.held && epoch == o.epoch && value.equals(o.value);
    }
}
