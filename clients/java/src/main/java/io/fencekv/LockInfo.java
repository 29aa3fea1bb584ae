package io.fencekv;

import java.time.Duration;
import java.util.List;
import java.util.OptionalLong;

/**
 * A lock as {@code lock_info} and {@code locks} describe it. {@code limit} is
 * its number of permits: 1 for a plain lock, 2..256 for a semaphore
 * (PROTOCOL.md §5.2). {@code holders} lists the live permits in token order: a
 * semaphore's every one, a plain lock's one holder while held, else none; a
 * semaphore's {@code holder}/{@code token}/{@code ttl} are its newest permit's.
 */
public record LockInfo(String lock, boolean held, String holder, long token, Duration ttl, long waiters, Duration lockDelay,
        int limit, List<Holder> holders) {

    public LockInfo {
        holders = List.copyOf(holders);
    }

    /** A plain lock's: limit 1, its one holder while held. */
    public LockInfo(String lock, boolean held, String holder, long token, Duration ttl, long waiters, Duration lockDelay) {
        this(lock, held, holder, token, ttl, waiters, lockDelay, 1,
                held ? List.of(new Holder(holder, token, ttl)) : List.of());
    }

    /** A live permit of a semaphore (or a plain lock's live lease). */
    public record Holder(String holder, long token, Duration ttl) {}

    /**
     * The token of the live permit (or plain lease) held under holder: how the
     * lock helper finds a grant whose answer was lost, among a semaphore's
     * permits too.
     */
    public OptionalLong tokenOf(String holder) {
        for (Holder h : holders) {
            if (h.holder().equals(holder) && h.token() != 0) return OptionalLong.of(h.token());
        }
        return OptionalLong.empty();
    }
}
