package io.fencekv;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayDeque;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * A watch, read as a blocking iterator of events in revision order, on a
 * connection of its own. It survives reconnects: when the connection breaks
 * (or the server cancels the watch because this side fell behind), it
 * connects again (with backoff, over the client's addresses) and resumes
 * from the last revision it delivered, skipping the events of that revision
 * already delivered: every change once, in order, with no gap. If the node
 * it resumes on no longer keeps that revision, {@link #hasNext()} throws
 * {@link CompactedException} (watch again from now after re-reading the
 * state). One exception: a server that restarted keeps no history from
 * before its start; when exactly the revisions after the last one delivered
 * are kept, the watch resumes from there (events of that last revision not
 * yet delivered, if any, were lost with the restart).
 *
 * <pre>{@code
 * try (Watch w = client.watch("inventory/")) {
 *     for (Event e : w) { ... }
 * }
 * }</pre>
 */
public final class Watch implements Iterator<Event>, Iterable<Event>, AutoCloseable {
    private static final Object BROKEN = new Object();

    private final FencekvClient client;
    private final byte[] prefix;
    private final boolean locks;
    private final BlockingQueue<Object> queue = new ArrayBlockingQueue<>(1024);
    private final ArrayDeque<Event> ready = new ArrayDeque<>();
    private volatile boolean closed;
    private volatile Link link;
    private int next; // the address index to try next
    private long lastRev; // revision of the last event delivered (or start − 1)
    private int seen; // events of lastRev delivered
    private long skipRev; // on this connection: skip the first skip events of skipRev
    private int skip;
    private RuntimeException failed;
    private boolean once; // a break ends the watch (ConnectionException) instead of resuming: Election's observer starts over

    private Watch(FencekvClient client, byte[] prefix, boolean locks) {
        this.client = client;
        this.prefix = prefix == null ? new byte[0] : prefix;
        this.locks = locks;
    }

    static Watch start(FencekvClient c, byte[] prefix, boolean locks, long startRevision) {
        return start(c, prefix, locks, startRevision, false);
    }

    /** A watch that, with once, ends at the first break of its connection rather than resuming. */
    static Watch start(FencekvClient c, byte[] prefix, boolean locks, long startRevision, boolean once) {
        Watch w = new Watch(c, prefix, locks);
        w.once = once;
        if (startRevision > 0) w.lastRev = startRevision - 1;
        w.connect(startRevision, true);
        return w;
    }

    /** Connects (trying every address once if once, else until it works) and starts the watch from start (0: now). */
    private void connect(long start, boolean once) {
        long backoff = 50;
        while (true) {
            String err = "";
            for (int k = 0; k < client.addrs.size(); k++) {
                if (closed) throw new ConnectionException(String.join(",", client.addrs), false, "the watch is closed", null);
                String addr = client.addrs.get((next + k) % client.addrs.size());
                try {
                    startOn(addr, start);
                    next = (next + k) % client.addrs.size();
                    return;
                } catch (CompactedException e) {
                    if (seen > 0 && start == lastRev && e.revision() == lastRev + 1) {
                        // The server restarted after lastRev: resume right after it.
                        try {
                            seen = 0;
                            startOn(addr, lastRev + 1);
                            return;
                        } catch (IOException | FencekvException e2) {
                            err = addr + ": " + e2.getMessage();
                            continue;
                        }
                    }
                    throw e;
                } catch (LimitExceededException | UnavailableException | IOException e) {
                    err = addr + ": " + e.getMessage(); // this node's own trouble: another may serve
                }
            }
            next++;
            if (once) throw new ConnectionException(String.join(",", client.addrs), false, "watch: no server answered: " + err, null);
            try {
                Thread.sleep(backoff);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new ConnectionException(String.join(",", client.addrs), false, "interrupted", e);
            }
            backoff = Math.min(2 * backoff, 2000);
        }
    }

    private void startOn(String addr, long start) throws IOException {
        Link[] self = new Link[1];
        java.util.concurrent.CountDownLatch made = new java.util.concurrent.CountDownLatch(1);
        Link l = client.openLink(addr, (m, ps) -> {
            try {
                made.await();
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            notification(self[0], m, ps);
        });
        self[0] = l;
        made.countDown();
        link = l;
        if (closed) {
            l.fail("the watch is closed");
            return;
        }
        Map<String, Object> p = FencekvClient.params("prefix", prefix, "locks", locks ? Boolean.TRUE : null,
                "start_revision", start > 0 ? (Object) start : null);
        CompletableFuture<Map<String, Object>> f;
        try {
            f = l.send("watch", p, false);
        } catch (Link.NotSent e) {
            throw new IOException("closed by the server: " + l.why());
        }
        Map<String, Object> r;
        try {
            r = f.get(Math.max(client.callTimeout.toMillis(), 1000), TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
            l.fail("no answer to watch");
            throw new IOException("no answer to watch in time");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            l.fail("interrupted");
            throw new IOException("interrupted");
        } catch (ExecutionException e) {
            l.fail("watch refused");
            RuntimeException x = FencekvClient.rethrow(e.getCause());
            if (x instanceof ConnectionException) throw new IOException(x.getMessage(), x);
            throw x;
        }
        if (start > 0) {
            skipRev = lastRev;
            skip = start == lastRev ? seen : 0;
        } else {
            skip = 0;
            if (lastRev == 0 && seen == 0) lastRev = Codec.lng(r, "revision"); // resume after the start
        }
    }

    /** Called on the link's reader thread: queue the batch, or the break. */
    private void notification(Link src, String method, Map<String, Object> params) {
        try {
            if ("watch".equals(method)) {
                queue.put(Codec.list(params, "events"));
            } else if ("watch_cancelled".equals(method) || method.isEmpty()) {
                queue.put(src);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** Resumes from the last revision delivered, after the connection broke. */
    private void resume() {
        Link l = link;
        if (l != null) l.fail("resuming");
        next++;
        long from = seen == 0 ? lastRev + 1 : lastRev;
        connect(from, false);
    }

    /** The next event, waiting up to timeout; null if none came. */
    public Event next(Duration timeout) {
        long end = System.nanoTime() + timeout.toNanos();
        while (ready.isEmpty()) {
            if (failed != null) throw failed;
            if (closed) throw new NoSuchElementException("the watch is closed");
            long left = end - System.nanoTime();
            if (left <= 0) return null;
            Object o;
            try {
                o = queue.poll(left, TimeUnit.NANOSECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                return null;
            }
            if (o == null) return null;
            if (o == BROKEN) continue;
            if (o instanceof Link) {
                if (closed || o != link) continue; // an earlier connection's end
                if (once) {
                    failed = new ConnectionException(((Link) o).addr, false, "the watch ended: " + ((Link) o).why(), null);
                    continue;
                }
                try {
                    resume();
                } catch (RuntimeException e) {
                    failed = e;
                }
                continue;
            }
            @SuppressWarnings("unchecked")
            List<Map<String, Object>> evs = (List<Map<String, Object>>) o;
            for (Map<String, Object> m : evs) {
                long rev = Codec.lng(m, "revision");
                if (rev < skipRev || (rev == skipRev && skip > 0)) {
                    if (rev == skipRev) skip--;
                    continue; // delivered before the reconnect
                }
                if (rev != lastRev) {
                    lastRev = rev;
                    seen = 0;
                }
                seen++;
                ready.add(new Event(Codec.str(m, "type"), Codec.bin(m, "key"), Codec.bin(m, "value"), Codec.lng(m, "fence"),
                        rev, m.containsKey("lock") ? Codec.str(m, "lock") : null, Codec.lng(m, "token")));
            }
        }
        return ready.poll();
    }

    /** Waits for the next event. Throws CompactedException if the watch cannot resume. */
    @Override
    public boolean hasNext() {
        while (ready.isEmpty()) {
            if (closed) return false;
            Event e = next(Duration.ofSeconds(1));
            if (e != null) {
                ready.addFirst(e);
                return true;
            }
        }
        return true;
    }

    @Override
    public Event next() {
        if (!hasNext()) throw new NoSuchElementException("the watch is closed");
        return ready.poll();
    }

    @Override
    public Iterator<Event> iterator() {
        return this;
    }

    /** The revision of the last event delivered. */
    public long lastRevision() {
        return lastRev;
    }

    /** Stops the watch (closes its connection). */
    @Override
    public void close() {
        closed = true;
        Link l = link;
        if (l != null) l.fail("the watch is closed");
        queue.offer(BROKEN);
    }
}
