package io.fencekv;

import java.net.InetAddress;
import java.security.SecureRandom;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.OptionalLong;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.Consumer;
import java.util.function.Supplier;

/**
 * A held lock, kept alive in the background until closed:
 *
 * <pre>{@code
 * try (Lease lease = client.lock("inventory", Duration.ofSeconds(10))) {
 *     client.put("inventory/sku-1", "42", lease); // a held write: token and lock
 * }
 * }</pre>
 *
 * <p>A thread of the lease renews it every period (a third of TTL − margin).
 * It keeps a local deadline on this machine's monotonic clock: the send time
 * of the request that last gave the lease its full TTL (the acquire, or the
 * last successful renew), plus the TTL, less the margin. The server measures
 * the same lease from a later moment, so the deadline passes first. Once it
 * passes with no successful renew, or a renew is refused (not_holder,
 * lease_expired), the lease is lost: {@link #isLost()} is true,
 * {@link #check()} throws {@link LeaseLostException}, and the listeners of
 * {@link #onLost} are called. A broken connection alone does not lose it:
 * renews go on over the client's next connection (the same server
 * restarted, or another node), and a node that does not answer a renew
 * within a period is left for the next address.
 *
 * <p>An acquire whose answer was lost (the connection broke after it was
 * sent, unavailable with the outcome unknown, no answer in time) may have
 * been granted: under its own holder name the lease looks the lock up
 * ({@code lock_info}) and, held under that name, takes that grant (renewed
 * at once, having no send time to measure it from).
 *
 * <p>{@link #close()} stops the renewing and releases the lock (also after a
 * lost deadline: the server may still hold it), unless a renew was refused.
 */
public final class Lease implements AutoCloseable {
    private static final SecureRandom RANDOM = new SecureRandom();

    private final FencekvClient client;
    private final String name;
    private final long token;
    private final Duration ttl;
    private final String holder;
    private final long keepNanos; // TTL − margin
    private final long everyNanos;
    private final Duration releaseTimeout;
    private final Thread thread;
    private final List<Consumer<LeaseLostException>> listeners = new ArrayList<>();

    // guarded by this
    private long deadline; // System.nanoTime
    private long lastSent;
    private long nextRenew;
    private boolean inflight;
    private boolean stopped;
    private boolean released;
    private LeaseLostException lost;
    private Throwable lastErr;

    private Lease(FencekvClient client, String name, long token, Duration ttl, String holder, long sent, long keepNanos,
            long everyNanos, Duration releaseTimeout) {
        this.client = client;
        this.name = name;
        this.token = token;
        this.ttl = ttl;
        this.holder = holder;
        this.keepNanos = keepNanos;
        this.everyNanos = everyNanos;
        this.releaseTimeout = releaseTimeout;
        this.lastSent = sent;
        this.deadline = sent + keepNanos;
        this.nextRenew = sent + everyNanos;
        this.thread = new Thread(this::run, "fencekv-lease " + name);
        thread.setDaemon(true);
    }

    /** The holder name this call acquires under when none is given: host:pid:random. */
    static String uniqueHolder() {
        String host;
        try {
            host = InetAddress.getLocalHost().getHostName();
        } catch (Exception e) {
            host = "localhost";
        }
        byte[] b = new byte[6];
        RANDOM.nextBytes(b);
        return host + ":" + ProcessHandle.current().pid() + ":" + HexFormat.of().formatHex(b);
    }

    static Lease acquire(FencekvClient c, String name, Duration ttl, LockOptions o) {
        Duration margin = o.margin != null ? o.margin : ttl.dividedBy(10);
        if (margin.isNegative() || margin.compareTo(ttl) >= 0) {
            throw new IllegalArgumentException("lock margin " + margin + ": want 0 or more, and shorter than the TTL of " + ttl);
        }
        Duration every = o.renewEvery != null ? o.renewEvery : ttl.minus(margin).dividedBy(3);
        boolean ours = o.holder == null;
        String holder = ours ? uniqueHolder() : o.holder;
        AcquireOptions ao = AcquireOptions.holder(holder).withWait(o.wait).withLockDelay(o.lockDelay);
        if (o.limit != null) ao = ao.withLimit(o.limit); // one of a semaphore's permits
        long sent = System.nanoTime();
        long token;
        boolean found = false;
        try {
            token = c.acquire(name, ttl, ao).token();
        } catch (UnavailableException e) {
            if (!ours || !e.outcomeUnknown()) throw e;
            LockInfo in;
            try {
                in = retry(c, o.releaseTimeout, () -> c.lockInfoAsync(name));
            } catch (FencekvException le) {
                e.addSuppressed(le);
                throw e;
            }
            OptionalLong mine = in.tokenOf(holder); // a semaphore's permits too
            if (mine.isEmpty()) throw e;
            token = mine.getAsLong();
            found = true;
        }
        if (o.wait.compareTo(Duration.ZERO) > 0 || found) {
            // The lease began when it was granted, some time after the send:
            // renew at once and measure from that renew's send time.
            sent = System.nanoTime();
            try {
                final long t = token;
                retry(c, ttl.minus(margin), () -> c.renewAsync(name, t));
            } catch (FencekvException re) {
                try {
                    final long t = token;
                    retry(c, o.releaseTimeout, () -> c.releaseAsync(name, t));
                } catch (FencekvException ignored) {
                    re.addSuppressed(ignored);
                }
                throw re;
            }
        }
        Lease l = new Lease(c, name, token, ttl, holder, sent, ttl.minus(margin).toNanos(), every.toNanos(), o.releaseTimeout);
        l.thread.start();
        return l;
    }

    /**
     * Calls call until it succeeds or is refused for good, within timeout. Each
     * try gets a third of the time; a node that does not answer within it, or
     * fails with the connection or as unavailable, is left for the next address.
     */
    static <T> T retry(FencekvClient c, Duration timeout, Supplier<CompletableFuture<T>> call) {
        long end = System.nanoTime() + timeout.toNanos();
        long per = Math.max(timeout.toNanos() / 3, TimeUnit.MILLISECONDS.toNanos(10));
        long pause = 20;
        FencekvException last = null;
        while (true) {
            long left = end - System.nanoTime();
            if (left <= 0) {
                if (last != null) throw last;
                throw new ConnectionException(c.address(), false, "no answer within " + timeout.toMillis() + " ms", null);
            }
            Link l = c.current();
            CompletableFuture<T> f = call.get();
            try {
                return f.get(Math.min(per, left), TimeUnit.NANOSECONDS);
            } catch (TimeoutException e) {
                last = new ConnectionException(l == null ? c.address() : l.addr, false, "no answer in time", null);
                c.leave(l, "no answer in time");
                continue;
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new FencekvException("interrupted", "interrupted", java.util.Map.of(), e);
            } catch (ExecutionException e) {
                RuntimeException r = FencekvClient.rethrow(e.getCause());
                if (!retryable(r) || c.isClosed()) throw r;
                last = (FencekvException) r;
                c.leave(l, r.getMessage());
            }
            try {
                Thread.sleep(Math.min(pause, Math.max(1, (end - System.nanoTime()) / 1_000_000)));
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw last;
            }
            pause = Math.min(2 * pause, 500);
        }
    }

    static boolean retryable(Throwable t) {
        return t instanceof UnavailableException || t instanceof NotLeaderException;
    }

    public String name() {
        return name;
    }

    /** The fencing token of the grant: pass it with every write to the resource the lock protects. */
    public long token() {
        return token;
    }

    public Duration ttl() {
        return ttl;
    }

    /** The holder name the lock was acquired under. */
    public String holder() {
        return holder;
    }

    /** Time left until the local deadline (zero or negative once passed). */
    public synchronized Duration remaining() {
        return Duration.ofNanos(deadline - System.nanoTime());
    }

    /** True once the lease may be lost (see the class comment). */
    public boolean isLost() {
        return lostNow() != null;
    }

    /** Throws LeaseLostException if the lease may be lost; call it before each step of protected work. */
    public void check() {
        LeaseLostException l = lostNow();
        if (l != null) throw l;
    }

    private LeaseLostException lostNow() {
        boolean fire = false;
        LeaseLostException l;
        synchronized (this) {
            if (lost == null && System.nanoTime() - deadline >= 0) {
                lose("no renew succeeded within " + Duration.ofNanos(keepNanos).toMillis() + " ms of the TTL of "
                        + ttl.toMillis() + " ms", lastErr);
                fire = true;
            }
            l = lost;
        }
        return l;
    }

    /** Calls listener (on the lease's thread) once the lease is lost; at once if it already is. */
    public void onLost(Consumer<LeaseLostException> listener) {
        LeaseLostException l;
        synchronized (this) {
            l = lost;
            if (l == null || thread.isAlive()) {
                listeners.add(listener);
                return;
            }
        }
        listener.accept(l);
    }

    private void lose(String why, Throwable cause) {
        if (lost == null) {
            lost = new LeaseLostException(name, token, why, cause);
            notifyAll();
        }
    }

    private void run() {
        synchronized (this) {
            while (!stopped && lost == null) {
                long now = System.nanoTime();
                if (now - deadline >= 0) {
                    lose("no renew succeeded within " + Duration.ofNanos(keepNanos).toMillis() + " ms of the TTL of "
                            + ttl.toMillis() + " ms" + (lastErr != null ? " (last: " + lastErr.getMessage() + ")" : ""), lastErr);
                    break;
                }
                if (client.isClosed()) {
                    lose("the client is closed: no renew can be sent", null);
                    break;
                }
                if (!inflight && now - nextRenew >= 0) startRenew(now);
                long until = deadline;
                if (!inflight && nextRenew - until < 0) until = nextRenew;
                long waitNanos = Math.max(until - now, 100_000);
                try {
                    TimeUnit.NANOSECONDS.timedWait(this, waitNanos);
                } catch (InterruptedException e) {
                    break;
                }
            }
        }
        List<Consumer<LeaseLostException>> ls;
        LeaseLostException l;
        synchronized (this) {
            l = lost;
            ls = new ArrayList<>(listeners);
            listeners.clear();
        }
        if (l != null) {
            for (Consumer<LeaseLostException> c : ls) {
                try {
                    c.accept(l);
                } catch (RuntimeException ignored) {
                    // a listener's failure is its own
                }
            }
        }
    }

    private void startRenew(long at) {
        inflight = true;
        Link l = client.current();
        long timeoutMs = Math.max(1, Math.min(ttl.toMillis(), everyNanos / 1_000_000));
        CompletableFuture<java.util.Map<String, Object>> f;
        try {
            f = client.callAsync("renew", FencekvClient.params("lock", name, "token", token), timeoutMs);
        } catch (RuntimeException e) {
            f = CompletableFuture.failedFuture(e);
        }
        f.whenComplete((r, e) -> renewed(at, l, e));
    }

    private synchronized void renewed(long at, Link l, Throwable e) {
        inflight = false;
        long now = System.nanoTime();
        if (e == null) {
            lastErr = null;
            if (at - lastSent > 0) {
                lastSent = at;
                deadline = at + keepNanos;
            }
            nextRenew = at + everyNanos;
        } else {
            RuntimeException r = FencekvClient.rethrow(e);
            if (r instanceof NotHolderException || r instanceof LeaseExpiredException) {
                lose("a renew was refused: " + r.getMessage(), r);
            } else {
                // Connection trouble, no leader, no answer in time: the deadline
                // decides; until then, try again sooner, elsewhere if possible.
                lastErr = r;
                if (retryable(r)) client.leave(l, r.getMessage());
                nextRenew = now + Math.max(everyNanos / 4, 1_000_000);
            }
        }
        notifyAll();
    }

    /**
     * Stops renewing and releases the lock (within the release timeout, trying
     * again while the server is unreachable), unless a renew was refused or
     * the client is closed. A release refused not_holder/lease_expired is
     * success. Throws the release's failure only if the lease was not lost.
     */
    @Override
    public void close() {
        boolean refused;
        boolean wasLost;
        synchronized (this) {
            if (released) return;
            released = true;
            stopped = true;
            notifyAll();
            wasLost = lost != null || System.nanoTime() - deadline >= 0;
            refused = lost != null && lost.refused();
        }
        try {
            thread.join(1000);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        if (refused || client.isClosed()) return;
        try {
            retry(client, releaseTimeout, () -> client.releaseAsync(name, token));
        } catch (NotHolderException | LeaseExpiredException e) {
            // not ours any more: done
        } catch (FencekvException e) {
            if (!wasLost) throw e;
        }
    }

    @Override
    public String toString() {
        return "Lease[" + name + ", token " + token + ", ttl " + ttl.toMillis() + " ms]";
    }
}
