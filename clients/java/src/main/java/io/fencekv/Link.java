package io.fencekv;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.EOFException;
import java.io.FilterInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.locks.LockSupport;
import java.util.function.BiConsumer;

import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.msgpack.core.buffer.MessageBuffer;
import org.msgpack.core.MessageUnpacker;

/**
 * One connection. Requests are written under a lock; every call waits for
 * the answer that carries its msgid.
 *
 * <p>Who reads the answers (issue #35: a thread hand-off per call costs a
 * lone caller as much as the call). The read side is held by at most one
 * thread at a time ({@link #owner}):
 * <ul>
 * <li>A caller blocked on its own call (the blocking methods, through
 * {@link FencekvClient#sync}) reads the connection itself when no one else
 * is, as the Go client does (wire/link.go): it completes every answer it
 * reads, for whichever call, until its own arrives. A lone caller so wakes
 * straight from the socket, with no thread between it and its answer.</li>
 * <li>A caller that finds the read side held waits (parked) until its call
 * is completed by whoever reads.</li>
 * <li>When the reader's own answer has come (or its call timed out, or its
 * thread was interrupted) it gives the read side up at a message boundary:
 * to the link's reader thread if another caller is blocked or calls made
 * without a blocked caller (async calls) wait, else to no one (the next
 * blocked caller takes it). Handing the reading from caller to caller (as
 * the Go client does) was measured slower here: the socket goes unread while
 * each next reader wakes, and with 16 callers get took 400 µs a call against
 * 300 with one reader thread.</li>
 * <li>The reader thread holds the read side until no call waits, then gives
 * it up; an async call made while no one reads wakes it. A lone caller so
 * reads for itself, contending callers are served as before by one thread.</li>
 * <li>The reader thread also takes the read side when no one reads and
 * nothing was sent for {@link #watchIdleNs} (it polls for that each
 * millisecond): blocked in a read, it sees a server close at once, so the next
 * send fails as not sent instead of going into a dead connection, its outcome
 * unknown. (A non-blocking probe needs a SocketChannel, which an interrupted
 * caller's read or write closes, breaking the connection for every caller.)</li>
 * <li>A TLS link, and a link with a notification handler (a watch's), is read by its reader
 * thread only, for good (notifications come unasked; a TLS read timeout is
 * not trusted to leave the stream whole).</li>
 * </ul>
 * A reader waits for the next message in slices of at most {@link #SLICE_MS}
 * (and never past its own call's deadline): a read timeout is only taken at a
 * message boundary, where the stream is intact (a timeout in the middle of a
 * message just reads on), so a reader whose call times out, or whose thread
 * is interrupted, gets out and hands the reading on. Callbacks of the futures
 * a reader completes run on the reader's thread; a blocking call made from
 * one reads on (reentrant: it is at a message boundary).
 *
 * <p>When the connection breaks (the server closed it, a read or write
 * failed, or the client left it), the link is dead for good: every call in
 * flight fails with a {@link ConnectionException}, its outcome unknown if it
 * changes state, and the client never sends on it again.
 */
final class Link {
    /** Thrown by send when nothing of the request was written: safe to send elsewhere. */
    static final class NotSent extends Exception {
        private static final long serialVersionUID = 1L;

        NotSent() {
            super(null, null, false, false);
        }
    }

    static final class Pending {
        final CompletableFuture<Map<String, Object>> future;
        final long id;
        final boolean effect;
        final boolean blocking; // its sender waits for it (await): no reader thread is woken for it
        final long deadline; // System.nanoTime; meaningful if ms > 0
        final long ms;
        volatile Thread waiter; // the thread blocked in await for it, unparked when it completes

        Pending(CompletableFuture<Map<String, Object>> future, long id, boolean effect, boolean blocking, long deadline, long ms) {
            this.future = future;
            this.id = id;
            this.effect = effect;
            this.blocking = blocking;
            this.deadline = deadline;
            this.ms = ms;
        }
    }

    /**
     * Set on a thread while it makes a call it will block on (see
     * {@link FencekvClient#sync}): the first send records its call here, and
     * the caller then waits for it with {@link #await}, reading if no one is.
     */
    static final class Blocking {
        Link link;
        Pending pending;
        private Blocking prev;
    }

    private static final ThreadLocal<Blocking> BLOCKING = new ThreadLocal<>();

    static Blocking beginBlocking() {
        Blocking b = new Blocking();
        b.prev = BLOCKING.get();
        BLOCKING.set(b);
        return b;
    }

    static void endBlocking(Blocking b) {
        BLOCKING.set(b.prev);
    }

    /** The longest a reader waits for the next message before it looks at its call's deadline and its interrupt. */
    static final int SLICE_MS = 200;

    /** The owner that stands for the link's reader thread. */
    private static final Object READER = new Object();

    final String addr;
    private final Socket socket;
    private final OutputStream out;
    private final SocketIn bin;
    private final boolean always; // only the reader thread reads (a watch's link, or TLS)
    private volatile long lastSend = System.nanoTime(); // when a call was last sent (see watchIdleNs)
    private final MessageUnpacker in;
    private final ConcurrentHashMap<Long, Pending> pending = new ConcurrentHashMap<>();
    private final AtomicInteger async = new AtomicInteger(); // the calls in pending that are not blocking
    private final Object writeLock = new Object();
    private final MessageBufferPacker packer = MessagePack.newDefaultBufferPacker(); // guarded by writeLock: reused, its buffer kept
    private final BiConsumer<String, Map<String, Object>> onNotification;
    private final Thread readerThread;
    private long nextId; // guarded by writeLock
    private volatile boolean answered; // any message read from the server
    private volatile boolean dead;
    private volatile String why = "";
    private volatile FencekvException refusal; // the server's error notification, if any

    // The read side. owner and waiters are written under rl; owner is read without it (a hint, checked under it).
    private final Object rl = new Object();
    private volatile Object owner; // null (no one reads), READER, or the Pending whose blocked caller reads (or is handed the read side)
    private volatile Thread ownerThread; // the thread reading now: a blocking call it makes reads on (reentrant)
    private final ArrayDeque<Pending> waiters = new ArrayDeque<>(); // blocked callers not reading; guarded by rl
    private volatile long threadReads; // messages the reader thread read (for the tests)
    private int soTimeout = -1; // the socket's read timeout as last set; used by the reading thread only

    /**
     * The socket's input, under the buffers: a read timeout ends the read
     * only where a message begins ({@link #boundary} set by the reader); in
     * the middle of one it reads on, so that the stream is never cut inside a
     * message.
     */
    private static final class SocketIn extends FilterInputStream {
        boolean boundary; // used by the reading thread only

        SocketIn(InputStream in) {
            super(in);
        }

        @Override
        public int read() throws IOException {
            byte[] b = new byte[1];
            int n = read(b, 0, 1);
            return n <= 0 ? -1 : b[0] & 0xff;
        }

        @Override
        public int read(byte[] b, int off, int len) throws IOException {
            if (len == 0) return 0;
            while (true) {
                try {
                    return in.read(b, off, len);
                } catch (SocketTimeoutException e) {
                    if (boundary) throw e;
                }
            }
        }
    }

    Link(String addr, Socket socket, BiConsumer<String, Map<String, Object>> onNotification) throws IOException {
        this.addr = addr;
        this.socket = socket;
        this.out = new BufferedOutputStream(socket.getOutputStream(), 16 * 1024);
        this.bin = new SocketIn(socket.getInputStream());
        this.in = MessagePack.newDefaultUnpacker(new BufferedInputStream(bin, 64 * 1024));
        this.onNotification = onNotification;
        this.always = onNotification != null || socket instanceof javax.net.ssl.SSLSocket;
        if (always) owner = READER; // its reader thread reads, for good
        readerThread = new Thread(this::readerLoop, "fencekv-reader " + addr);
        readerThread.setDaemon(true);
        readerThread.start();
    }

    boolean dead() {
        return dead;
    }

    /**
     * Sends a request (or, with future null, a notification) and returns the
     * future its answer completes. Throws NotSent if the link was dead before
     * any byte of it was written.
     */
    CompletableFuture<Map<String, Object>> send(String method, Map<String, Object> params, boolean effect) throws NotSent {
        return send(method, params, effect, 0);
    }

    /**
     * As {@link #send(String, Map, boolean)}, failing the call with a
     * ConnectionException (of unknown outcome if effect) if no answer came
     * within timeoutMs (> 0): {@link #expire} finds it, or its own reader.
     * Made within {@link #beginBlocking}, the call is the caller's to wait
     * for with {@link #await}; otherwise the reader thread is woken if no one
     * reads.
     */
    CompletableFuture<Map<String, Object>> send(String method, Map<String, Object> params, boolean effect, long timeoutMs) throws NotSent {
        CompletableFuture<Map<String, Object>> f = new CompletableFuture<>();
        long deadline = timeoutMs > 0 ? System.nanoTime() + timeoutMs * 1_000_000 : 0;
        Blocking b = always ? null : BLOCKING.get();
        boolean blocking = b != null && b.pending == null;
        Pending p;
        synchronized (writeLock) {
            if (!always) lastSend = System.nanoTime();
            if (dead) throw new NotSent();
            long id;
            do {
                id = nextId;
                nextId = (nextId + 1) & 0xffffffffL;
            } while (pending.containsKey(id));
            packer.clear();
            try {
                Codec.request(packer, id, method, params); // throws before anything is written for a value it cannot encode
            } catch (IOException e) {
                throw new IllegalStateException(e); // a buffer packer does not fail
            }
            p = new Pending(f, id, effect, blocking, deadline, timeoutMs);
            if (!blocking) async.incrementAndGet();
            pending.put(id, p);
            try {
                for (MessageBuffer m : packer.toBufferList()) out.write(m.array(), m.arrayOffset(), m.size());
                out.flush();
            } catch (IOException e) {
                // Some of it may have been written: the outcome is unknown.
                fail("write failed: " + e.getMessage());
            }
        }
        if (blocking) {
            b.link = this;
            b.pending = p;
        } else if (owner == null) {
            wakeReader();
        }
        if (timeoutMs > 0 && sweeper != null) sweeper.due(deadline);
        return f;
    }

    /**
     * How long a link must have sent nothing before its reader thread, if no
     * one reads, reads it (and so sees at once a server close, as of a stopped
     * or restarted server, and the next send fails as not sent instead of
     * going into the dead connection, its outcome unknown). The first call
     * after such an idle spell is read by the reader thread, as before.
     */
    static volatile long watchIdleNs = 1_000_000; // (tests change it)

    /** An async call waits and no one reads: the reader thread takes the read side. */
    private void wakeReader() {
        synchronized (rl) {
            if (owner == null && !dead) {
                owner = READER;
                rl.notifyAll();
            }
        }
    }

    /** Who fails the timed calls: told of each deadline. */
    interface Sweeper {
        void due(long deadline);
    }

    volatile Sweeper sweeper;

    /** Removes p from the calls waiting; whether it was there (then it is the remover's to complete). */
    private boolean take(Pending p) {
        if (!pending.remove(p.id, p)) return false;
        if (!p.blocking) async.decrementAndGet();
        return true;
    }

    /** Wakes p's blocked caller, if any, once p's future is complete. */
    private static void wake(Pending p) {
        Thread w = p.waiter;
        if (w != null && w != Thread.currentThread()) LockSupport.unpark(w);
    }

    private void timedOut(Pending p) {
        p.future.completeExceptionally(new ConnectionException(addr, p.effect, "no answer within " + p.ms + " ms", null));
        wake(p);
    }

    /**
     * Fails the calls whose deadline has passed (the client's sweep calls it);
     * returns the earliest deadline of the timed calls still waiting, or 0 if none.
     */
    long expire(long now) {
        long next = 0;
        boolean any = false;
        for (Pending p : pending.values()) {
            if (p.ms <= 0) continue;
            if (now - p.deadline >= 0) {
                if (take(p)) timedOut(p);
            } else if (!any || p.deadline - next < 0) {
                next = p.deadline;
                any = true;
            }
        }
        return any && next == 0 ? 1 : next;
    }

    /** Whether no call waits for an answer here. */
    boolean idle() {
        return pending.isEmpty();
    }

    /** Sends a notification (no answer). */
    void notify(String method, Map<String, Object> params) throws NotSent {
        synchronized (writeLock) {
            if (dead) throw new NotSent();
            try {
                out.write(Codec.request(-1, method, params));
                out.flush();
            } catch (IOException e) {
                fail("write failed: " + e.getMessage());
            }
        }
    }

    /** Kills the link: it is never used again; the calls in flight fail with why. */
    void fail(String reason) {
        List<Pending> failed = new ArrayList<>();
        boolean first = false;
        synchronized (pending) {
            if (!dead) {
                why = reason;
                dead = true;
                first = true;
            }
        }
        try {
            socket.close(); // a reader blocked in a read gets out with an error
        } catch (IOException ignored) {
            // closing anyway
        }
        for (Pending p : new ArrayList<>(pending.values())) {
            if (take(p)) failed.add(p);
        }
        for (Pending p : failed) {
            // A plain client on a TLS port: nothing was served, a configuration error.
            p.future.completeExceptionally(refusal instanceof TlsRequiredException
                    ? refusal : new ConnectionException(addr, p.effect, why, refusal));
            wake(p);
        }
        synchronized (rl) {
            rl.notifyAll(); // the reader thread ends
        }
        if (first && onNotification != null) {
            // Tell the owner (a watch) that the connection is gone, off this thread if it is the reader.
            Thread t = new Thread(() -> onNotification.accept("", Map.of()), "fencekv-link-closed");
            t.setDaemon(true);
            t.start();
        }
    }

    String why() {
        return why;
    }

    /** The thread reading the connection now, if any (for the tests). */
    Thread readingThread() {
        return ownerThread;
    }

    /** How many messages the link's reader thread has read (for the tests). */
    long threadReads() {
        return threadReads;
    }

    // ---- the read side ----

    /**
     * Waits until the call p (sent by this thread within beginBlocking) is
     * complete, reading the connection itself while no one else is (see the
     * class comment). Returns early, p perhaps not complete, if the thread is
     * interrupted.
     */
    void await(Pending p) {
        if (p.future.isDone()) return;
        Thread me = Thread.currentThread();
        if (ownerThread == me) {
            readFor(p); // a call made by a callback of the reader: read on
            return;
        }
        p.waiter = me;
        synchronized (rl) {
            if (owner == null && !dead) owner = p;
            else waiters.add(p);
        }
        while (true) {
            if (owner == p) { // (only ever taken above: the read side is not handed to a waiting caller)
                ownerThread = me;
                readFor(p);
                synchronized (rl) {
                    handOn();
                }
                return;
            }
            if (p.future.isDone() || me.isInterrupted()) {
                synchronized (rl) {
                    waiters.remove(p);
                }
                return;
            }
            // Woken when p completes (by the reader, the sweep, or a broken link).
            LockSupport.parkNanos(this, 1_000_000_000L);
        }
    }

    /**
     * Gives the read side up (under rl, by its holder, at a message
     * boundary): to the reader thread if another caller is blocked (the
     * callers contend: one thread reading for all of them keeps the socket
     * read while they wake) or async calls wait, else to no one (the next
     * blocked caller takes it).
     */
    private void handOn() {
        ownerThread = null;
        boolean contended = false;
        for (Iterator<Pending> it = waiters.iterator(); it.hasNext(); ) {
            if (it.next().future.isDone()) it.remove();
            else contended = true;
        }
        owner = null;
        // An async send that saw the read side held counts on its holder to
        // hand it on: owner is cleared before async is looked at (send does
        // the opposite), so one of the two wakes the reader thread.
        if (!dead && (contended || async.get() > 0)) {
            owner = READER;
            rl.notifyAll();
        }
    }

    /** Reads messages, holding the read side, until p is complete, times out (then fails it), or the thread is interrupted. */
    private void readFor(Pending p) {
        try {
            while (!p.future.isDone() && !dead) {
                if (!awaitMessage(p)) return;
                readMessage();
            }
        } catch (IOException | RuntimeException e) {
            readFailed(e);
        }
    }

    /**
     * Waits for the next message to begin: true once it has; false if p's
     * deadline passed first (p is failed) or the thread was interrupted
     * (with p null: only if a blocked caller waits for the read side).
     */
    private boolean awaitMessage(Pending p) throws IOException {
        while (true) {
            int wait = always ? 0 : SLICE_MS; // a reader thread that reads for good waits as long as it takes
            if (p != null && p.ms > 0) {
                long left = p.deadline - System.nanoTime();
                if (left <= 0) {
                    if (take(p)) timedOut(p);
                    return false;
                }
                wait = (int) Math.min(wait, (left + 999_999) / 1_000_000);
            }
            if (p != null && Thread.currentThread().isInterrupted()) return false;
            if (wait != soTimeout) {
                socket.setSoTimeout(wait);
                soTimeout = wait;
            }
            bin.boundary = true;
            try {
                if (!in.hasNext()) throw new EOFException();
                return true;
            } catch (SocketTimeoutException e) {
                if (p == null) return false; // the reader thread: look for a blocked caller to hand over to
            } finally {
                bin.boundary = false;
            }
        }
    }

    /** Reads one message and completes its call (or passes on its notification). */
    private void readMessage() throws IOException {
        int n = in.unpackArrayHeader();
        answered = true;
        int type = in.unpackInt();
        if (type == 1 && n == 4) {
            long id = in.unpackLong();
            Object err = Codec.unpack(in);
            Object res = Codec.unpack(in);
            Pending p = pending.get(id);
            if (p == null || !take(p)) return; // a call that gave up
            if (err instanceof Map) {
                @SuppressWarnings("unchecked")
                Map<String, Object> em = (Map<String, Object>) err;
                p.future.completeExceptionally(FencekvException.of(em));
            } else {
                @SuppressWarnings("unchecked")
                Map<String, Object> rm = res instanceof Map ? (Map<String, Object>) res : Map.of();
                p.future.complete(rm);
            }
            wake(p);
        } else if (type == 2 && n == 3) {
            Object mo = Codec.unpack(in);
            String method = mo instanceof byte[] ? new String((byte[]) mo, java.nio.charset.StandardCharsets.UTF_8) : String.valueOf(mo);
            Object ps = Codec.unpack(in);
            Map<String, Object> params = Map.of();
            if (ps instanceof List && !((List<?>) ps).isEmpty() && ((List<?>) ps).get(0) instanceof Map) {
                @SuppressWarnings("unchecked")
                Map<String, Object> m = (Map<String, Object>) ((List<?>) ps).get(0);
                params = m;
            }
            if ("error".equals(method)) {
                refusal = FencekvException.of(params);
                fail("the server closed the connection: " + refusal.getMessage());
                return;
            }
            if (onNotification != null) onNotification.accept(method, params);
        } else {
            for (int i = 1; i < n; i++) in.skipValue();
        }
    }

    private void readFailed(Exception e) {
        if (e instanceof EOFException || e instanceof org.msgpack.core.MessageInsufficientBufferException) {
            fail(answered ? "closed by the server"
                    : "closed by the server before any answer (does it require TLS? is it at its connection limit?)");
        } else {
            fail(dead ? why : "read failed: " + e);
        }
    }

    /**
     * The reader thread: reads while it holds the read side (async calls
     * wait, or callers contend), and takes it to watch the connection when it
     * has been idle watchIdleNs with no one reading (polling for that every
     * millisecond while callers read for themselves).
     */
    private void readerLoop() {
        Thread me = Thread.currentThread();
        while (true) {
            synchronized (rl) {
                while (true) {
                    if (dead) return;
                    if (owner == READER) break;
                    if (!always && owner == null && System.nanoTime() - lastSend >= watchIdleNs) {
                        owner = READER;
                        break;
                    }
                    try {
                        rl.wait(1); // notified when the read side is handed to it; polls for idleness (a holder gives it up without a word)
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            }
            ownerThread = me;
            try {
                while (!dead) {
                    if (awaitMessage(null)) {
                        threadReads++; // (written by this thread only; counted before the answer completes its call)
                        readMessage();
                    }
                    if (!always) {
                        synchronized (rl) {
                            if (pending.isEmpty()) { // no call waits: the next blocked caller reads for itself
                                handOn();
                                if (owner != READER) break;
                                ownerThread = me;
                            }
                        }
                    }
                }
            } catch (IOException | RuntimeException e) {
                readFailed(e);
                return;
            }
        }
    }
}
