package io.fencekv;

/**
 * Options of a watch: whether lock events come too, and the revision to start
 * from (0: from when the watch is established).
 */
public final class WatchOptions {
    public static final WatchOptions NONE = new WatchOptions(false, 0);

    final boolean locks;
    final long startRevision;

    private WatchOptions(boolean locks, long startRevision) {
        this.locks = locks;
        this.startRevision = startRevision;
    }

    /** From startRevision: every event at or after it, if the server still keeps it ({@link CompactedException} if not). */
    public static WatchOptions from(long startRevision) {
        return NONE.withStartRevision(startRevision);
    }

    /** With lock events ({@code acquired}, {@code released}, {@code expired}) of the lock names under the prefix. */
    public WatchOptions withLocks(boolean locks) {
        return new WatchOptions(locks, startRevision);
    }

    public WatchOptions withStartRevision(long startRevision) {
        if (startRevision < 0) throw new IllegalArgumentException("fencekv: start revision " + startRevision + " is negative");
        return new WatchOptions(locks, startRevision);
    }

    public boolean locks() {
        return locks;
    }

    public long startRevision() {
        return startRevision;
    }
}
