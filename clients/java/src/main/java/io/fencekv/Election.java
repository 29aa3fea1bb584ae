package io.fencekv;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.Iterator;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.concurrent.TimeoutException;

/**
 * Leader election, a composition of the lock calls (PROTOCOL.md §12): the
 * election {@code name} is the lock of that name, the leader's value is the
 * lock's holder, and the epoch is the lock's token.
 *
 * <pre>{@code
 * Election e = client.election("nightly-report");
 * try (Leadership lead = e.campaign(hostAndPort, Duration.ofSeconds(10))) { // blocks until leading
 *     client.put("reports/latest", "...", lead.lease());                   // fenced by the epoch
 * }                                                                         // resigns
 * LeaderState now = e.leader();
 * try (Election.Observer states = e.observe()) {
 *     for (LeaderState s : states) System.out.println(s.value() + " " + s.epoch());
 * }
 * }</pre>
 *
 * <p>Candidates lead in the order they queued (the lock's FIFO queue), each
 * with a higher epoch. An acquire whose answer was lost (the connection broke
 * after it was sent, {@code unavailable} with the outcome unknown, no answer
 * in time) is looked up by value: a lock held under the value is released (it
 * has no send time to measure a deadline from) and the campaign goes on, so
 * give each candidate a value of its own (its address, say). An Election is
 * immutable and may be shared between threads.
 */
public final class Election {
    /** The longest value (and name): the lock holder's limit, in UTF-8 bytes. */
    public static final int MAX_VALUE = 4096;

    private static final Duration DEFAULT_WAIT = Duration.ofSeconds(60);

    private final FencekvClient client;
    private final String name;
    private final Duration margin; // null: min(ttl/3, 3 s)
    private final Duration wait;

    public Election(FencekvClient client, String name) {
        this(client, name, null, DEFAULT_WAIT);
    }

    private Election(FencekvClient client, String name, Duration margin, Duration wait) {
        if (name == null || name.isEmpty()) throw bad("election name: empty");
        this.client = client;
        this.name = name;
        this.margin = margin;
        this.wait = wait;
    }

    /**
     * The same election with another margin: how long before the lease may
     * run out the leadership is taken as lost (the time the leader needs to
     * stop its work). Default min(TTL/3, 3 s); 0 or more, shorter than the TTL.
     */
    public Election withMargin(Duration margin) {
        return new Election(client, name, margin, wait);
    }

    /** The same election with another wait per acquire (sent again when it runs out); default 60 s, 1 ms – 1 h. */
    public Election withWait(Duration wait) {
        if (wait == null || wait.toMillis() < 1 || wait.compareTo(Duration.ofHours(1)) > 0) {
            throw bad("election wait " + wait + ": want 1 ms to 1 h");
        }
        return new Election(client, name, margin, wait);
    }

    public String name() {
        return name;
    }

    private static BadRequestException bad(String msg) {
        return new BadRequestException("fencekv: " + msg, Map.of("code", "bad_request", "message", msg));
    }

    private Duration marginFor(String value, Duration ttl) {
        if (value == null || value.isEmpty()) {
            throw bad("election value: empty; each candidate needs a value of its own (its address, say)");
        }
        int n = value.getBytes(StandardCharsets.UTF_8).length;
        if (n > MAX_VALUE) {
            String msg = "election value: " + n + " bytes, over " + MAX_VALUE;
            throw new TooLargeException("fencekv: " + msg, Map.of("code", "too_large", "message", msg));
        }
        if (ttl == null || ttl.isNegative() || ttl.isZero()) throw bad("election ttl " + ttl + ": want above 0");
        Duration m = margin != null ? margin : min(ttl.dividedBy(3), Duration.ofSeconds(3));
        if (m.isNegative() || m.compareTo(ttl) >= 0) {
            throw bad("election margin " + m + ": want 0 or more, and shorter than the TTL of " + ttl);
        }
        return m;
    }

    private static Duration min(Duration a, Duration b) {
        return a.compareTo(b) <= 0 ? a : b;
    }

    /**
     * Blocks until this caller leads with value (1–4096 bytes, its own) under
     * a lease of ttl (the server allows 100 ms – 1 h), and returns the
     * leadership. Bad input throws BadRequestException (TooLargeException for
     * an oversized value) with nothing sent. Interrupting the thread gives up
     * (FencekvException code "interrupted"): a grant already made under value
     * is released, but the acquire may stay queued on the server until its
     * wait ends, and a grant made then runs out after ttl unrenewed; use the
     * timeout variant to give up leaving nothing.
     */
    public Leadership campaign(String value, Duration ttl) {
        try {
            return campaign(value, ttl, 0);
        } catch (TimeoutException e) {
            throw new IllegalStateException(e); // no deadline: not reached
        }
    }

    /**
     * As {@link #campaign(String, Duration)}, giving up after timeout with
     * TimeoutException; nothing is left held or queued then (the last
     * acquire's wait is what is left of the timeout).
     */
    public Leadership campaign(String value, Duration ttl, Duration timeout) throws TimeoutException {
        if (timeout == null || timeout.isNegative()) throw bad("campaign timeout " + timeout + ": want 0 or more");
        return campaign(value, ttl, System.nanoTime() + timeout.toNanos() | 1); // never 0
    }

    private Leadership campaign(String value, Duration ttl, long until) throws TimeoutException {
        Duration m = marginFor(value, ttl);
        long pause = 20;
        while (true) {
            Duration w = wait;
            if (until != 0) {
                long left = until - System.nanoTime();
                if (left <= 0) throw new TimeoutException("campaign for " + name + ": not leading in time");
                if (w.toNanos() > left) w = Duration.ofMillis(Math.max(1, left / 1_000_000));
            }
            try {
                Lease l = Lease.acquire(client, name, ttl, LockOptions.waitFor(w).withHolder(value).withMargin(m));
                return new Leadership(l, value);
            } catch (LockHeldException e) {
                pause = 20;
                continue; // the wait ran out: queue again, at the tail
            } catch (UnavailableException e) { // also ConnectionException
                if (client.isClosed()) throw e;
                if (e.outcomeUnknown()) releaseOurs(value);
            } catch (FencekvException e) {
                if ("interrupted".equals(e.code())) {
                    // The acquire may yet be granted: free it if it was, then give up.
                    boolean was = Thread.interrupted();
                    releaseOurs(value);
                    if (was) Thread.currentThread().interrupt();
                }
                if (!Lease.retryable(e)) throw e;
            }
            long sleep = pause;
            if (until != 0) sleep = Math.min(sleep, Math.max(1, (until - System.nanoTime()) / 1_000_000));
            try {
                Thread.sleep(sleep);
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
                throw new FencekvException("interrupted", "interrupted while campaigning for " + name, Map.of(), ie);
            }
            pause = Math.min(2 * pause, 1000);
        }
    }

    /** §12 step 3: an acquire whose answer was lost may have been granted; if the lock is held under value, release it. */
    private void releaseOurs(String value) {
        try {
            LockInfo in = Lease.retry(client, Duration.ofSeconds(10), () -> client.lockInfoAsync(name));
            if (in.held() && value.equals(in.holder())) {
                Lease.retry(client, Duration.ofSeconds(5), () -> client.releaseAsync(name, in.token()));
            }
        } catch (FencekvException e) {
            // Not found, or gone already: a grant left behind runs out after its TTL.
        }
    }

    /**
     * The election's state, read once ({@code lock_info}). A lease run out
     * whose expiry the server has not applied yet counts as leading, with ttl 0.
     */
    public LeaderState leader() {
        return LeaderState.of(name, client.lockInfo(name));
    }

    /**
     * The election's states as they change: see {@link Observer}. Throws if
     * the first watch or read fails (the server is unreachable, say).
     */
    public Observer observe() {
        return new Observer(client, name);
    }

    /**
     * The states of an election, as a blocking iterator of
     * {@link LeaderState}: the current one first, then each change (§12: a
     * watch of the lock's events, a {@code lock_info} after it started and
     * after each batch with an event of exactly this lock). Epochs only rise:
     * a held state whose epoch is not above the last held one emitted is
     * never emitted, nor a state equal to the last. Leaders that come and go
     * between two reads are coalesced; the latest state is always delivered.
     * It goes on through reconnects and server restarts (a new watch and a new
     * read each time) until {@link #close()}, which any thread may call, or
     * the client's close; then {@link #hasNext()} is false. A refusal that
     * no restart can cure (permission_denied, say) is thrown. Iterate it
     * from one thread.
     */
    public static final class Observer implements Iterator<LeaderState>, Iterable<LeaderState>, AutoCloseable {
        private final FencekvClient client;
        private final String name;
        private final byte[] prefix;
        private final Object sleeper = new Object();
        private final ArrayDeque<LeaderState> ready = new ArrayDeque<>();
        private volatile boolean closed;
        private volatile Watch watch;
        private LeaderState last;
        private long top; // the epoch of the last held state emitted
        private long pause = 20;
        private final Runnable onClientClose = this::close;

        Observer(FencekvClient client, String name) {
            this.client = client;
            this.name = name;
            this.prefix = Codec.bytes(name);
            watch = Watch.start(client, prefix, true, 0, true);
            try {
                emit(LeaderState.of(name, client.lockInfo(name)));
            } catch (RuntimeException e) {
                watch.close();
                throw e;
            }
            client.onClose(onClientClose); // the watch has a connection of its own: end it with the client
        }

        private void emit(LeaderState s) {
            if (s.sameAs(last)) return;
            if (s.held() && top != 0 && s.epoch() <= top) return; // a stale answer
            last = s;
            if (s.held()) top = s.epoch();
            ready.add(s);
        }

        private static boolean restartable(RuntimeException e) {
            return e instanceof UnavailableException || e instanceof NotLeaderException || e instanceof CompactedException
                    || e instanceof LimitExceededException || e instanceof NoSuchElementException;
        }

        /** The next state, waiting up to timeout; null if none came (or the observer is closed). */
        public LeaderState next(Duration timeout) {
            long end = System.nanoTime() + timeout.toNanos();
            while (ready.isEmpty()) {
                if (closed) return null;
                Watch w = watch;
                try {
                    if (w == null) {
                        // §12 step 4: the watch ended; start again (a new watch, then a read).
                        w = Watch.start(client, prefix, true, 0, true);
                        watch = w;
                        if (closed) {
                            w.close();
                            return null;
                        }
                        emit(LeaderState.of(name, client.lockInfo(name)));
                        pause = 20;
                        continue;
                    }
                    long left = end - System.nanoTime();
                    if (left <= 0) return null;
                    Event e = w.next(Duration.ofNanos(left));
                    boolean ours = false;
                    for (; e != null; e = w.next(Duration.ZERO)) { // the rest of the batch, already received
                        if (name.equals(e.lock()) && e.key() == null) ours = true;
                    }
                    if (ours) emit(LeaderState.of(name, client.lockInfo(name)));
                } catch (RuntimeException x) {
                    if (closed) return null;
                    if (client.isClosed()) {
                        close(); // the client's end is the observer's
                        return null;
                    }
                    if (!restartable(x)) throw x;
                    if (w != null) w.close();
                    watch = null;
                    long left = (end - System.nanoTime()) / 1_000_000;
                    if (left <= 0) return null;
                    synchronized (sleeper) {
                        try {
                            if (!closed) sleeper.wait(Math.max(1, Math.min(pause, left)));
                        } catch (InterruptedException ie) {
                            Thread.currentThread().interrupt();
                            return null;
                        }
                    }
                    pause = Math.min(2 * pause, 1000);
                }
            }
            return ready.poll();
        }

        /** Waits for the next state; false once closed. */
        @Override
        public boolean hasNext() {
            while (ready.isEmpty()) {
                if (closed || Thread.currentThread().isInterrupted()) return false;
                LeaderState s = next(Duration.ofSeconds(1));
                if (s != null) {
                    ready.addFirst(s);
                    return true;
                }
            }
            return true;
        }

        @Override
        public LeaderState next() {
            if (!hasNext()) throw new NoSuchElementException("the observer is closed");
            return ready.poll();
        }

        @Override
        public Iterator<LeaderState> iterator() {
            return this;
        }

        /** Ends the observation (closes its watch); from any thread. */
        @Override
        public void close() {
            closed = true;
            client.offClose(onClientClose);
            Watch w = watch;
            if (w != null) w.close();
            synchronized (sleeper) {
                sleeper.notifyAll();
            }
        }
    }
}
