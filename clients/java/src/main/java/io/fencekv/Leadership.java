package io.fencekv;

import java.util.function.Consumer;

/**
 * A won election: the {@link Lease} of its lock under the candidate's value,
 * renewed in the background (the lease's own machinery) until
 * {@link #close()} resigns it. Pass {@link #lease()} (or token
 * {@link #epoch()} with lock {@link #name()}) with every write the leader
 * makes, and stop leading once {@link #check()} throws or the listener of
 * {@link #onLost} is called:
 *
 * <pre>{@code
 * try (Leadership lead = client.election("nightly-report").campaign(host, Duration.ofSeconds(10))) {
 *     lead.onLost(e -> stopWork());
 *     client.put("reports/latest", "...", lead.lease()); // fenced by the epoch
 *     lead.check();                                     // LeaseLostException once it may be lost
 * }
 * }</pre>
 */
public final class Leadership implements AutoCloseable {
    private final Lease lease;
    private final String value;

    Leadership(Lease lease, String value) {
        this.lease = lease;
        this.value = value;
    }

    /** The election's (and its lock's) name. */
    public String name() {
        return lease.name();
    }

    /** The candidate's value: the lock's holder, what {@link Election#leader()} reports. */
    public String value() {
        return value;
    }

    /** The epoch: the lock's fencing token, above every earlier leader's. */
    public long epoch() {
        return lease.token();
    }

    /** The lease behind the leadership: for held writes ({@code client.put(key, value, lead.lease())}). */
    public Lease lease() {
        return lease;
    }

    /** True once the leadership may be lost (a renew refused, or the local deadline passed). */
    public boolean isLost() {
        return lease.isLost();
    }

    /** Throws LeaseLostException if the leadership may be lost: call it before each step of the leader's work. */
    public void check() {
        lease.check();
    }

    /** Calls listener (on the lease's thread) once the leadership is lost; at once if it already is. */
    public void onLost(Consumer<LeaseLostException> listener) {
        lease.onLost(listener);
    }

    /**
     * Gives the leadership up ({@code release}): the next queued candidate
     * leads at once. Resigning a leadership already lost or resigned does
     * nothing more.
     */
    public void resign() {
        lease.close();
    }

    /** Resigns. */
    @Override
    public void close() {
        resign();
    }

    @Override
    public String toString() {
        return "Leadership[" + name() + ", value " + value + ", epoch " + epoch() + "]";
    }
}
