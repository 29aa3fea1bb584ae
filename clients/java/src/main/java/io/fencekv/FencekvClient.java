package io.fencekv;

import java.io.IOException;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.function.BiConsumer;
import java.util.function.Function;

import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLParameters;
import javax.net.ssl.SSLSocket;

/**
 * A client of a fencekv server, or of any node of a fencekv cluster
 * (wire/PROTOCOL.md). Thread-safe: calls from many threads are pipelined on
 * one connection and matched to their answers by msgid by one reader thread.
 *
 * <p>When the connection breaks, the calls in flight on it fail with a
 * {@link ConnectionException} ({@link UnavailableException#outcomeUnknown()}
 * true for a write or lock call: it may or may not have been applied), and
 * the next call connects again, trying the addresses in turn from the one
 * after the failed one. A closed connection is never reused: the reader
 * thread sees the server close it (a restarted server does) and marks it
 * dead, so the next call goes over a new connection; a call that was never
 * written is sent on the new one, and is not reported as an unknown outcome.
 * With several addresses, a node that accepts the connection but does not
 * answer a ping within the connect timeout (a stopped node) is passed over.
 * While no address answers, calls fail at once (nothing sent) until a
 * backoff, doubling from 50 ms to 1 s, has passed.
 *
 * <p>Each method comes blocking (throwing a {@link FencekvException}
 * subclass: one per refusal code) and as {@code ...Async} returning a
 * {@link CompletableFuture} completed with the same exception. Every call
 * has the client's call timeout (an acquire that waits, its wait on top);
 * a write or lock call that times out fails with a ConnectionException of
 * unknown outcome.
 */
public final class FencekvClient implements AutoCloseable {
    static final Set<String> READS = Set.of("ping", "get", "scan", "lock_info", "locks", "status", "members", "term", "refusals");

    /** Builds a client. */
    public static final class Builder {
        private final List<String> addresses = new ArrayList<>();
        private Duration connectTimeout = Duration.ofSeconds(2);
        private Duration callTimeout = Duration.ofSeconds(10);
        private Duration minBackoff = Duration.ofMillis(50);
        private Duration maxBackoff = Duration.ofSeconds(1);
        private SSLContext ssl;
        private boolean verifyHostname = true;
        private String user;
        private byte[] secret;

        private Builder() {}

        /** The server's address, or the nodes of a cluster (host:port each). */
        public Builder addresses(String... addrs) {
            addresses.addAll(List.of(addrs));
            return this;
        }

        public Builder addresses(List<String> addrs) {
            addresses.addAll(addrs);
            return this;
        }

        /** Bounds the connection to one address, its TLS handshake, and (with several addresses) its answer to a ping. Default 2 s. */
        public Builder connectTimeout(Duration d) {
            connectTimeout = d;
            return this;
        }

        /** Bounds each call (an acquire's wait comes on top). Default 10 s. */
        public Builder callTimeout(Duration d) {
            callTimeout = d;
            return this;
        }

        /** The pause after a round of failed connects, doubling from min to max. Default 50 ms and 1 s. */
        public Builder backoff(Duration min, Duration max) {
            minBackoff = min;
            maxBackoff = max.compareTo(min) < 0 ? min : max;
            return this;
        }

        /** Connect with TLS (1.2 or 1.3), verified with this context (trust store; key store for mutual TLS). */
        public Builder ssl(SSLContext ctx) {
            ssl = ctx;
            return this;
        }

        /** Whether TLS checks that the certificate names the host dialed (default true). */
        public Builder verifyHostname(boolean v) {
            verifyHostname = v;
            return this;
        }

        /** Authenticate every connection (method {@code auth}) as this principal. */
        public Builder credentials(String user, String secret) {
            return credentials(user, Codec.bytes(secret));
        }

        public Builder credentials(String user, byte[] secret) {
            this.user = user;
            this.secret = secret.clone();
            return this;
        }

        /** Connects to the first address that answers and returns the client. */
        public FencekvClient build() {
            if (addresses.isEmpty()) throw new IllegalArgumentException("fencekv: no server address given");
            FencekvClient c = new FencekvClient(this);
            try {
                c.reconnect(null);
            } catch (RuntimeException e) {
                c.close();
                throw e;
            }
            return c;
        }
    }

    public static Builder builder() {
        return new Builder();
    }

    /** A client of the server at address, with the defaults. */
    public static FencekvClient connect(String... addresses) {
        return builder().addresses(addresses).build();
    }

    final List<String> addrs;
    final Duration connectTimeout;
    final Duration callTimeout;
    private final Duration minBackoff, maxBackoff;
    final SSLContext ssl;
    final boolean verifyHostname;
    final String user;
    final byte[] secret;

    private final Object dialLock = new Object();
    private volatile Link cur;
    private volatile boolean closed;
    private long backoffNanos; // guarded by dialLock
    private long nextDial; // System.nanoTime; guarded by dialLock
    private String dialErr = "";

    final ExecutorService executor;
    final ScheduledExecutorService timer;
    private final Set<Runnable> closeHooks = java.util.concurrent.ConcurrentHashMap.newKeySet();

    private FencekvClient(Builder b) {
        addrs = List.copyOf(b.addresses);
        connectTimeout = b.connectTimeout;
        callTimeout = b.callTimeout;
        minBackoff = b.minBackoff;
        maxBackoff = b.maxBackoff;
        ssl = b.ssl;
        verifyHostname = b.verifyHostname;
        user = b.user;
        secret = b.secret;
        executor = Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "fencekv-client");
            t.setDaemon(true);
            return t;
        });
        timer = Executors.newSingleThreadScheduledExecutor(r -> {
            Thread t = new Thread(r, "fencekv-timer");
            t.setDaemon(true);
            return t;
        });
    }

    /*
     * Call timeouts: one sweep task, scheduled for the earliest deadline of the
     * calls in flight (not a timer task per call, which costs more than the
     * call), fails every call past its deadline and schedules itself again.
     */
    private final Set<Link> links = java.util.concurrent.ConcurrentHashMap.newKeySet();
    private final Object sweepLock = new Object();
    private volatile long sweepAt; // System.nanoTime of the scheduled sweep, if sweepOn; guarded by sweepLock for writes
    private volatile boolean sweepOn;

    /** A timed call went out with this deadline: make sure a sweep runs by then. */
    private void due(long deadline) {
        if (sweepOn && sweepAt - deadline <= 0) return; // a sweep comes in time
        synchronized (sweepLock) {
            if (sweepOn && sweepAt - deadline <= 0) return;
            sweepAt = deadline;
            sweepOn = true;
            try {
                timer.schedule(this::sweep, Math.max(0, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
            } catch (java.util.concurrent.RejectedExecutionException e) {
                // closed: the links fail their calls
            }
        }
    }

    private void sweep() {
        synchronized (sweepLock) {
            if (sweepOn && sweepAt - System.nanoTime() > 0) return; // an earlier sweep of a later schedule: that one comes
            sweepOn = false;
        }
        long now = System.nanoTime();
        long next = 0;
        boolean any = false;
        for (Link l : links) {
            if (l.dead() && l.idle()) {
                links.remove(l);
                continue;
            }
            long d = l.expire(now);
            if (d != 0 && (!any || d - next < 0)) {
                next = d;
                any = true;
            }
        }
        if (any) due(next);
    }

    // ---- connections ----

    /** Opens a TCP (and TLS) socket to addr within the connect timeout. */
    Socket openSocket(String addr) throws IOException {
        int colon = addr.lastIndexOf(':');
        if (colon < 0) throw new IOException("address " + addr + ": want host:port");
        String host = addr.substring(0, colon);
        if (host.startsWith("[") && host.endsWith("]")) host = host.substring(1, host.length() - 1);
        int port = Integer.parseInt(addr.substring(colon + 1));
        int ms = (int) Math.max(1, connectTimeout.toMillis());
        Socket s = new Socket(); // (not a SocketChannel's: an interrupted caller's read or write would close it for all)
        try {
            s.setTcpNoDelay(true);
            s.connect(new InetSocketAddress(host, port), ms);
            if (ssl == null) return s;
            SSLSocket t = (SSLSocket) ssl.getSocketFactory().createSocket(s, host, port, true);
            List<String> versions = new ArrayList<>();
            for (String v : t.getSupportedProtocols()) {
                if (v.equals("TLSv1.3") || v.equals("TLSv1.2")) versions.add(v);
            }
            t.setEnabledProtocols(versions.toArray(new String[0]));
            if (verifyHostname) {
                SSLParameters p = t.getSSLParameters();
                p.setEndpointIdentificationAlgorithm("HTTPS");
                t.setSSLParameters(p);
            }
            t.setSoTimeout(ms);
            t.startHandshake();
            t.setSoTimeout(0);
            return t;
        } catch (IOException | RuntimeException e) {
            s.close();
            throw e;
        }
    }

    /** Opens a link to addr, authenticates it, and (with several addresses) checks it answers a ping. */
    Link openLink(String addr, BiConsumer<String, Map<String, Object>> onNotification) throws IOException {
        Socket s = openSocket(addr);
        Link l = new Link(addr, s, onNotification);
        l.sweeper = this::due;
        links.add(l);
        try {
            if (user != null) {
                Map<String, Object> p = new LinkedHashMap<>();
                p.put("name", user);
                p.put("secret", secret);
                await(l.send("auth", p, false), Math.max(callTimeout.toMillis(), 10_000), "auth");
            }
            if (addrs.size() > 1) {
                await(l.send("ping", null, false), connectTimeout.toMillis(), "ping");
            }
            return l;
        } catch (Link.NotSent e) {
            l.fail("closed");
            throw new IOException("closed by the server: " + l.why());
        } catch (RuntimeException e) {
            l.fail("closed by the client: " + e.getMessage());
            throw e;
        }
    }

    private static Map<String, Object> await(CompletableFuture<Map<String, Object>> f, long ms, String what) throws IOException {
        try {
            return f.get(ms, TimeUnit.MILLISECONDS);
        } catch (java.util.concurrent.TimeoutException e) {
            throw new IOException("no answer to " + what + " within " + ms + " ms");
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException("interrupted");
        } catch (ExecutionException e) {
            Throwable c = e.getCause();
            if (c instanceof ConnectionException) throw new IOException(c.getMessage(), c);
            if (c instanceof RuntimeException) throw (RuntimeException) c;
            throw new IOException(c);
        }
    }

    /** The link to send on: the current one if alive, else a new one. */
    private Link conn() {
        Link l = cur;
        if (l != null && !l.dead()) return l;
        return reconnect(l);
    }

    /** Replaces the dead link old with a new one, or fails (nothing sent) while in backoff. */
    private Link reconnect(Link old) {
        synchronized (dialLock) {
            if (closed) throw new ConnectionException(String.join(",", addrs), false, "the client is closed", null);
            Link l = cur;
            if (l != null && l != old && !l.dead()) return l; // replaced meanwhile
            if (l != null && !l.dead()) return l;
            long now = System.nanoTime();
            if (nextDial != 0 && now - nextDial < 0) {
                throw new ConnectionException(String.join(",", addrs), false,
                        dialErr + " (next attempt in " + (nextDial - now) / 1_000_000 + " ms)", null);
            }
            int first = 0;
            if (l != null) {
                int i = addrs.indexOf(l.addr);
                if (i >= 0) first = i + 1;
            }
            List<String> errs = new ArrayList<>();
            for (int k = 0; k < addrs.size(); k++) {
                String a = addrs.get((first + k) % addrs.size());
                try {
                    Link n = openLink(a, null);
                    if (closed) {
                        n.fail("the client is closed");
                        throw new ConnectionException(String.join(",", addrs), false, "the client is closed", null);
                    }
                    cur = n;
                    backoffNanos = 0;
                    nextDial = 0;
                    return n;
                } catch (UnauthenticatedException e) {
                    throw e; // refused credentials: every node would say the same
                } catch (IOException | FencekvException e) {
                    errs.add(a + ": " + e.getMessage());
                }
            }
            long min = minBackoff.toNanos(), max = maxBackoff.toNanos();
            backoffNanos = Math.min(Math.max(2 * backoffNanos, min), max);
            nextDial = System.nanoTime() + (long) (backoffNanos * (0.8 + 0.4 * ThreadLocalRandom.current().nextDouble()));
            if (nextDial == 0) nextDial = 1;
            dialErr = "no server answered: " + String.join("; ", errs);
            throw new ConnectionException(String.join(",", addrs), false, dialErr, null);
        }
    }

    /** The address the client is (or was last) connected to. */
    public String address() {
        Link l = cur;
        return l == null ? "" : l.addr;
    }

    /**
     * Makes the next call go to the next address, if there are several and l is
     * still the connection: its node did not answer in time, or answered that it
     * could not serve (no leader). The calls still waiting on it fail (their
     * outcome unknown, as when a connection breaks).
     */
    void leave(Link l, String why) {
        if (addrs.size() < 2 || l == null || cur != l) return;
        l.fail("left " + l.addr + " for the next address: " + why);
    }

    Link current() {
        return cur;
    }

    /** Closes the connection; calls in flight and every later call fail. Leases are not released. Idempotent. */
    @Override
    public void close() {
        Link l;
        synchronized (dialLock) {
            closed = true;
            l = cur;
        }
        if (l != null) l.fail("the client is closed");
        executor.shutdownNow();
        timer.shutdownNow();
        for (Runnable r : closeHooks) r.run();
        closeHooks.clear();
    }

    /** Runs r when the client is closed (at once if it is): the end of a watch publisher's subscription. */
    void onClose(Runnable r) {
        closeHooks.add(r);
        if (closed && closeHooks.remove(r)) r.run();
    }

    void offClose(Runnable r) {
        closeHooks.remove(r);
    }

    public boolean isClosed() {
        return closed;
    }

    // ---- calls ----

    /**
     * Sends method with params (a map, or null) and returns its result map.
     * The escape hatch for methods without a wrapper. The future fails with the
     * server's refusal, or a ConnectionException.
     */
    public CompletableFuture<Map<String, Object>> callAsync(String method, Map<String, Object> params) {
        return callAsync(method, params, callTimeout.toMillis());
    }

    CompletableFuture<Map<String, Object>> callAsync(String method, Map<String, Object> params, long timeoutMs) {
        boolean effect = !READS.contains(method);
        Link l = cur;
        if (l != null && !l.dead()) {
            try {
                return l.send(method, params, effect, timeoutMs);
            } catch (Link.NotSent e) {
                // dead before anything was written: connect again, off the caller's thread
            }
        }
        if (closed) return CompletableFuture.failedFuture(new ConnectionException(String.join(",", addrs), false, "the client is closed", null));
        CompletableFuture<CompletableFuture<Map<String, Object>>> r = new CompletableFuture<>();
        try {
            executor.execute(() -> {
                try {
                    r.complete(sendSync(method, params, effect, timeoutMs));
                } catch (Throwable t) {
                    r.completeExceptionally(t);
                }
            });
        } catch (java.util.concurrent.RejectedExecutionException e) {
            return CompletableFuture.failedFuture(new ConnectionException(String.join(",", addrs), false, "the client is closed", null));
        }
        return r.thenCompose(Function.identity());
    }

    private CompletableFuture<Map<String, Object>> sendSync(String method, Map<String, Object> params, boolean effect, long timeoutMs) {
        for (int attempt = 0; ; attempt++) {
            Link l = conn();
            try {
                return l.send(method, params, effect, timeoutMs);
            } catch (Link.NotSent e) {
                if (attempt >= 3) throw new ConnectionException(l.addr, false, l.why(), null);
            }
        }
    }

    /** Sends method as a notification: no answer, not even for a refusal (PROTOCOL.md §2.3). */
    public void notify(String method, Map<String, Object> params) {
        for (int attempt = 0; ; attempt++) {
            Link l = conn();
            try {
                l.notify(method, params);
                return;
            } catch (Link.NotSent e) {
                if (attempt >= 3) throw new ConnectionException(l.addr, false, l.why(), null);
            }
        }
    }

    /** Blocking form of {@link #callAsync(String, Map)}. */
    public Map<String, Object> call(String method, Map<String, Object> params) {
        return sync(() -> callAsync(method, params));
    }

    /**
     * Makes the call call (one request sent from this thread, then stages on
     * its future) and waits for it, reading its answer from the connection
     * itself when no other caller is reading (see {@link Link}): a blocking
     * method's call costs no thread hand-off. Throws its FencekvException as
     * it is.
     */
    static <T> T sync(java.util.function.Supplier<CompletableFuture<T>> call) {
        Link.Blocking b = Link.beginBlocking();
        CompletableFuture<T> f;
        try {
            f = call.get();
        } finally {
            Link.endBlocking(b);
        }
        if (b.link != null) b.link.await(b.pending);
        return join(f);
    }

    /** Waits for f and throws its FencekvException as it is. */
    static <T> T join(CompletableFuture<T> f) {
        try {
            return f.get();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            f.cancel(false);
            throw new FencekvException("interrupted", "interrupted while waiting for the answer", Map.of(), e);
        } catch (ExecutionException e) {
            throw rethrow(e.getCause());
        }
    }

    static RuntimeException rethrow(Throwable c) {
        while ((c instanceof CompletionException || c instanceof ExecutionException) && c.getCause() != null) c = c.getCause();
        if (c instanceof RuntimeException) return (RuntimeException) c;
        if (c instanceof Error) throw (Error) c;
        return new FencekvException("internal", String.valueOf(c), Map.of(), c);
    }

    static Map<String, Object> params(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) {
            if (kv[i + 1] != null) m.put((String) kv[i], kv[i + 1]);
        }
        return m;
    }

    private static WriteResult writeResult(Map<String, Object> r) {
        return new WriteResult(Codec.lng(r, "fence"), Codec.lng(r, "revision"), Codec.bool(r, "deleted"), Codec.lng(r, "value"));
    }

    private static Entry entry(byte[] key, Map<String, Object> r) {
        byte[] k = Codec.bin(r, "key");
        return new Entry(k != null ? k : key, r.containsKey("found") ? Codec.bool(r, "found") : true,
                Codec.bin(r, "value"), Codec.lng(r, "fence"), Codec.lng(r, "revision"));
    }

    private static LockInfo lockInfo(String name, Map<String, Object> r) {
        String n = r.containsKey("lock") ? Codec.str(r, "lock") : name;
        LockInfo in = new LockInfo(n, Codec.bool(r, "held"), Codec.str(r, "holder"), Codec.lng(r, "token"),
                Duration.ofMillis(Codec.lng(r, "ttl_ms")), Codec.lng(r, "waiters"), Duration.ofMillis(Codec.lng(r, "lock_delay_ms")));
        if (!r.containsKey("limit")) return in;
        // A semaphore: its limit and live permits.
        List<LockInfo.Holder> hs = new ArrayList<>();
        for (Object o : r.get("holders") instanceof List<?> l ? l : List.of()) {
            if (!(o instanceof Map<?, ?>)) continue;
            @SuppressWarnings("unchecked")
            Map<String, Object> h = (Map<String, Object>) o;
            hs.add(new LockInfo.Holder(Codec.str(h, "holder"), Codec.lng(h, "token"), Duration.ofMillis(Codec.lng(h, "ttl_ms"))));
        }
        return new LockInfo(in.lock(), in.held(), in.holder(), in.token(), in.ttl(), in.waiters(), in.lockDelay(),
                (int) Codec.lng(r, "limit"), hs);
    }

    // ping

    /** The server's version. */
    public CompletableFuture<String> pingAsync() {
        return callAsync("ping", null).thenApply(r -> Codec.str(r, "version"));
    }

    public String ping() {
        return sync(() -> pingAsync());
    }

    // get

    public CompletableFuture<Entry> getAsync(byte[] key) {
        return callAsync("get", params("key", key)).thenApply(r -> entry(key, r));
    }

    /** Reads key. A missing key is not an error: {@link Entry#found()} is false. */
    public Entry get(byte[] key) {
        return sync(() -> getAsync(key));
    }

    public Entry get(String key) {
        return get(Codec.bytes(key));
    }

    // put

    public CompletableFuture<WriteResult> putAsync(byte[] key, byte[] value, WriteOptions w) {
        Map<String, Object> p = params("key", key, "value", value == null ? new byte[0] : value);
        w.into(p);
        return callAsync("put", p).thenApply(FencekvClient::writeResult);
    }

    /** Writes value to key, fenced by w (a token, strict, a held lock). */
    public WriteResult put(byte[] key, byte[] value, WriteOptions w) {
        return sync(() -> putAsync(key, value, w));
    }

    public WriteResult put(String key, String value, WriteOptions w) {
        return put(Codec.bytes(key), Codec.bytes(value), w);
    }

    public WriteResult put(String key, byte[] value, WriteOptions w) {
        return put(Codec.bytes(key), value, w);
    }

    /** A tokenless write (refused stale_token once the key is fenced). */
    public WriteResult put(String key, String value) {
        return put(key, value, WriteOptions.NONE);
    }

    /**
     * A held write under lease: sends its token and its lock, so that the
     * server refuses it once the lease has run out (G4). Checks the lease
     * locally first: throws LeaseLostException, sending nothing, if it may be lost.
     */
    public WriteResult put(byte[] key, byte[] value, Lease lease) {
        lease.check();
        return put(key, value, WriteOptions.held(lease));
    }

    public WriteResult put(String key, String value, Lease lease) {
        return put(Codec.bytes(key), Codec.bytes(value), lease);
    }

    public CompletableFuture<WriteResult> putAsync(byte[] key, byte[] value, Lease lease) {
        try {
            lease.check();
        } catch (LeaseLostException e) {
            return CompletableFuture.failedFuture(e);
        }
        return putAsync(key, value, WriteOptions.held(lease));
    }

    // delete

    public CompletableFuture<WriteResult> deleteAsync(byte[] key, WriteOptions w) {
        Map<String, Object> p = params("key", key);
        w.into(p);
        return callAsync("delete", p).thenApply(FencekvClient::writeResult);
    }

    /** Deletes key; its fence survives. {@link WriteResult#deleted()} says if a live key was removed. */
    public WriteResult delete(byte[] key, WriteOptions w) {
        return sync(() -> deleteAsync(key, w));
    }

    public WriteResult delete(String key, WriteOptions w) {
        return delete(Codec.bytes(key), w);
    }

    // cas

    public CompletableFuture<WriteResult> casAsync(byte[] key, long revision, byte[] value, WriteOptions w) {
        Map<String, Object> p = params("key", key, "revision", revision, "value", value == null ? new byte[0] : value);
        w.into(p);
        return callAsync("cas", p).thenApply(FencekvClient::writeResult);
    }

    /** Writes value if key is at revision (0: absent); else CompareFailedException with the current revision. */
    public WriteResult cas(byte[] key, long revision, byte[] value, WriteOptions w) {
        return sync(() -> casAsync(key, revision, value, w));
    }

    public WriteResult cas(String key, long revision, String value, WriteOptions w) {
        return cas(Codec.bytes(key), revision, Codec.bytes(value), w);
    }

    // incr

    public CompletableFuture<WriteResult> incrAsync(byte[] key, long delta, WriteOptions w) {
        Map<String, Object> p = params("key", key, "delta", delta);
        w.into(p);
        return callAsync("incr", p).thenApply(FencekvClient::writeResult);
    }

    /** Adds delta to the decimal integer at key; {@link WriteResult#value()} is the new value. */
    public WriteResult incr(byte[] key, long delta, WriteOptions w) {
        return sync(() -> incrAsync(key, delta, w));
    }

    public WriteResult incr(String key, long delta, WriteOptions w) {
        return incr(Codec.bytes(key), delta, w);
    }

    // txn

    public CompletableFuture<TxnResult> txnAsync(List<TxnOp> ops, List<Map<String, Object>> compares, WriteOptions w) {
        List<Object> o = new ArrayList<>();
        for (TxnOp op : ops) o.add(op.m);
        Map<String, Object> p = params("ops", o, "compare", compares == null || compares.isEmpty() ? null : new ArrayList<Object>(compares));
        w.into(p);
        return callAsync("txn", p).thenApply(r -> {
            List<TxnResult.Result> rs = new ArrayList<>();
            for (Map<String, Object> m : Codec.list(r, "results")) {
                rs.add(new TxnResult.Result(Codec.bin(m, "key"), Codec.lng(m, "fence"), Codec.lng(m, "revision"), Codec.lng(m, "value")));
            }
            return new TxnResult(Codec.lng(r, "revision"), rs);
        });
    }

    /** Several writes, all or none, at one revision, if every compare ({@link TxnOp#compare}) holds. */
    public TxnResult txn(List<TxnOp> ops, List<Map<String, Object>> compares, WriteOptions w) {
        return sync(() -> txnAsync(ops, compares, w));
    }

    // scan

    public CompletableFuture<Page<Entry>> scanAsync(byte[] prefix, byte[] start, int limit) {
        Map<String, Object> p = params("prefix", prefix, "start", start, "limit", limit == 0 ? null : (Object) (long) limit);
        return callAsync("scan", p).thenApply(r -> {
            List<Entry> items = new ArrayList<>();
            for (Map<String, Object> m : Codec.list(r, "items")) items.add(entry(null, m));
            return new Page<>(items, Codec.bool(r, "more"));
        });
    }

    /** One page of live keys under prefix from start (inclusive); page on with start = last key + "\0" while more. */
    public Page<Entry> scan(byte[] prefix, byte[] start, int limit) {
        return sync(() -> scanAsync(prefix, start, limit));
    }

    public Page<Entry> scan(String prefix) {
        return scan(Codec.bytes(prefix), null, 0);
    }

    // acquire, renew, release

    public CompletableFuture<Grant> acquireAsync(String lock, Duration ttl, AcquireOptions o) {
        Map<String, Object> p = params("lock", lock, "ttl_ms", ttl.toMillis(), "holder", o.holder,
                "wait_ms", o.wait.isZero() ? null : (Object) o.wait.toMillis(),
                "lock_delay_ms", o.lockDelay.isZero() ? null : (Object) o.lockDelay.toMillis(),
                "limit", o.limit); // a semaphore's permits: sent as given, the server checks the range
        return callAsync("acquire", p, callTimeout.toMillis() + o.wait.toMillis())
                .thenApply(r -> new Grant(lock, Codec.lng(r, "token"), Duration.ofMillis(Codec.lng(r, "ttl_ms"))));
    }

    /**
     * A raw acquire: the caller renews and releases. Prefer {@link #lock}, which
     * renews in the background and finds a grant whose answer was lost.
     */
    public Grant acquire(String lock, Duration ttl, AcquireOptions o) {
        return sync(() -> acquireAsync(lock, ttl, o));
    }

    public Grant acquire(String lock, Duration ttl) {
        return acquire(lock, ttl, AcquireOptions.NONE);
    }

    public CompletableFuture<Duration> renewAsync(String lock, long token) {
        return callAsync("renew", params("lock", lock, "token", token)).thenApply(r -> Duration.ofMillis(Codec.lng(r, "ttl_ms")));
    }

    /** Gives the lease its full TTL again (idempotent: always safe to resend). */
    public Duration renew(String lock, long token) {
        return sync(() -> renewAsync(lock, token));
    }

    public CompletableFuture<Void> releaseAsync(String lock, long token) {
        return callAsync("release", params("lock", lock, "token", token)).thenApply(r -> null);
    }

    /** Frees the lock held by token. not_holder/lease_expired mean it is no longer yours. */
    public void release(String lock, long token) {
        sync(() -> releaseAsync(lock, token));
    }

    /**
     * Acquires lock for ttl and keeps it: see {@link Lease}. Use in
     * try-with-resources; close releases it.
     */
    public Lease lock(String lock, Duration ttl) {
        return lock(lock, ttl, LockOptions.DEFAULT);
    }

    public Lease lock(String lock, Duration ttl, LockOptions o) {
        return Lease.acquire(this, lock, ttl, o);
    }

    // lock_info, locks

    public CompletableFuture<LockInfo> lockInfoAsync(String lock) {
        return callAsync("lock_info", params("lock", lock)).thenApply(r -> lockInfo(lock, r));
    }

    public LockInfo lockInfo(String lock) {
        return sync(() -> lockInfoAsync(lock));
    }

    public CompletableFuture<Page<LockInfo>> locksAsync(String prefix, String start, int limit) {
        Map<String, Object> p = params("prefix", prefix, "start", start, "limit", limit == 0 ? null : (Object) (long) limit);
        return callAsync("locks", p).thenApply(r -> {
            List<LockInfo> items = new ArrayList<>();
            for (Map<String, Object> m : Codec.list(r, "locks")) items.add(lockInfo(null, m));
            return new Page<>(items, Codec.bool(r, "more"));
        });
    }

    /** One page of held locks under prefix. */
    public Page<LockInfo> locks(String prefix, String start, int limit) {
        return sync(() -> locksAsync(prefix, start, limit));
    }

    // election (PROTOCOL.md §12)

    /** The election name: a composition of the lock of that name; see {@link Election}. */
    public Election election(String name) {
        return new Election(this, name);
    }

    // status, members, term

    public CompletableFuture<Status> statusAsync() {
        return callAsync("status", null).thenApply(r -> new Status(Codec.str(r, "version"), Codec.str(r, "node"),
                Codec.str(r, "role"), Codec.str(r, "leader"), Codec.lng(r, "term"), Codec.lng(r, "last_token"),
                Codec.lng(r, "revision"), Codec.lng(r, "keys"), Codec.lng(r, "locks"), Codec.lng(r, "waiters"), Map.copyOf(r)));
    }

    public Status status() {
        return sync(() -> statusAsync());
    }

    public CompletableFuture<List<Member>> membersAsync() {
        return callAsync("members", null).thenApply(r -> {
            List<Member> ms = new ArrayList<>();
            for (Map<String, Object> m : Codec.list(r, "members")) {
                ms.add(new Member(Codec.str(m, "node"), Codec.str(m, "client_addr"), Codec.str(m, "raft_addr"),
                        Codec.str(m, "gossip_addr"), Codec.str(m, "state"), Codec.bool(m, "voter"), Codec.str(m, "raft_role")));
            }
            return ms;
        });
    }

    public List<Member> members() {
        return sync(() -> membersAsync());
    }

    public CompletableFuture<Long> termAsync() {
        return callAsync("term", null).thenApply(r -> Codec.lng(r, "term"));
    }

    public long term() {
        return sync(() -> termAsync());
    }

    // refusals

    public CompletableFuture<Page<Refusal>> refusalsAsync(long since, int limit) {
        Map<String, Object> p = params("since", since == 0 ? null : (Object) since, "limit", limit == 0 ? null : (Object) (long) limit);
        return callAsync("refusals", p).thenApply(r -> {
            List<Refusal> items = new ArrayList<>();
            for (Map<String, Object> m : Codec.list(r, "refusals")) {
                items.add(new Refusal(Codec.lng(m, "seq"), Codec.lng(m, "time_ms"), Codec.str(m, "code"), Codec.str(m, "op"),
                        Codec.bin(m, "key"), Codec.str(m, "lock"), Codec.lng(m, "token"), Codec.lng(m, "fence"),
                        Codec.lng(m, "holder_token"), Codec.str(m, "granted_lock"), Codec.str(m, "granted_holder"),
                        Codec.str(m, "client"), Codec.bool(m, "known")));
            }
            return new Page<>(items, Codec.lng(r, "last") > (items.isEmpty() ? since : items.get(items.size() - 1).seq()));
        });
    }

    /** The fenced writes the server refused, oldest first, after sequence number since. */
    public Page<Refusal> refusals(long since, int limit) {
        return sync(() -> refusalsAsync(since, limit));
    }

    // backup

    public CompletableFuture<BackupInfo> backupAsync() {
        return callAsync("backup", null).thenApply(r -> new BackupInfo(Codec.lng(r, "size"), Codec.lng(r, "index"),
                Codec.lng(r, "last_token"), Codec.lng(r, "revision"), Codec.lng(r, "chunk_size")));
    }

    /** Takes a consistent copy of the store, held on this connection for {@link #backupRead} (lost if the connection breaks). */
    public BackupInfo backup() {
        return sync(() -> backupAsync());
    }

    public CompletableFuture<BackupChunk> backupReadAsync(long offset) {
        return callAsync("backup_read", params("offset", offset)).thenApply(r -> new BackupChunk(
                Codec.bin(r, "data") == null ? new byte[0] : Codec.bin(r, "data"), Codec.bool(r, "done"), Codec.lng(r, "crc32c")));
    }

    public BackupChunk backupRead(long offset) {
        return sync(() -> backupReadAsync(offset));
    }

    // auth

    public CompletableFuture<String> authAsync(String name, String secret) {
        return callAsync("auth", params("name", name, "secret", Codec.bytes(secret))).thenApply(r -> Codec.str(r, "principal"));
    }

    /** Authenticates the current connection (the builder's credentials authenticate every connection). */
    public String auth(String name, String secret) {
        return sync(() -> authAsync(name, secret));
    }

    // watch

    /** Watches keys (and with locks, lock names) under prefix from startRevision (0: from now); see {@link Watch}. */
    public Watch watch(byte[] prefix, boolean locks, long startRevision) {
        return Watch.start(this, prefix, locks, startRevision);
    }

    public Watch watch(String prefix) {
        return watch(Codec.bytes(prefix), false, 0);
    }

    /**
     * The same watch as a {@link java.util.concurrent.Flow.Publisher} of events
     * (one subscriber per publisher; see {@link WatchPublisher}).
     */
    public WatchPublisher watchPublisher(byte[] prefix, WatchOptions options) {
        return new WatchPublisher(this, prefix, options);
    }

    public WatchPublisher watchPublisher(String prefix, WatchOptions options) {
        return watchPublisher(Codec.bytes(prefix), options);
    }
}
