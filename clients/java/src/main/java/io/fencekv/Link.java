package io.fencekv;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.io.OutputStream;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.function.BiConsumer;

import org.msgpack.core.MessageBufferPacker;
import org.msgpack.core.MessagePack;
import org.msgpack.core.buffer.MessageBuffer;
import org.msgpack.core.MessageUnpacker;

/**
 * One connection: requests are written under a lock, and one reader thread
 * reads every answer and completes the call waiting for its msgid. When the
 * connection breaks (the server closed it, a read or write failed, or the
 * client left it), the link is dead for good: every call in flight fails
 * with a {@link ConnectionException}, its outcome unknown if it changes
 * state, and the client never sends on it again.
 */
final class Link {
    /** Thrown by send when nothing of the request was written: safe to send elsewhere. */
    static final class NotSent extends Exception {
        private static final long serialVersionUID = 1L;

        NotSent() {
            super(null, null, false, false);
        }
    }

    private static final class Pending {
        final CompletableFuture<Map<String, Object>> future;
        final boolean effect;
        final long deadline; // System.nanoTime; meaningful if ms > 0
        final long ms;

        Pending(CompletableFuture<Map<String, Object>> future, boolean effect, long deadline, long ms) {
            this.future = future;
            this.effect = effect;
            this.deadline = deadline;
            this.ms = ms;
        }
    }

    final String addr;
    private final Socket socket;
    private final OutputStream out;
    private final MessageUnpacker in;
    private final ConcurrentHashMap<Long, Pending> pending = new ConcurrentHashMap<>();
    private final Object writeLock = new Object();
    private final MessageBufferPacker packer = MessagePack.newDefaultBufferPacker(); // guarded by writeLock: reused, its buffer kept
    private final BiConsumer<String, Map<String, Object>> onNotification;
    private long nextId; // guarded by writeLock
    private volatile boolean answered; // any message read from the server
    private volatile boolean dead;
    private volatile String why = "";
    private volatile FencekvException refusal; // the server's error notification, if any

    Link(String addr, Socket socket, BiConsumer<String, Map<String, Object>> onNotification) throws IOException {
        this.addr = addr;
        this.socket = socket;
        this.out = new BufferedOutputStream(socket.getOutputStream(), 16 * 1024);
        this.in = MessagePack.newDefaultUnpacker(new BufferedInputStream(socket.getInputStream(), 64 * 1024));
        this.onNotification = onNotification;
        Thread t = new Thread(this::readLoop, "fencekv-reader " + addr);
        t.setDaemon(true);
        t.start();
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
     * within timeoutMs (> 0): {@link #expire} finds it.
     */
    CompletableFuture<Map<String, Object>> send(String method, Map<String, Object> params, boolean effect, long timeoutMs) throws NotSent {
        CompletableFuture<Map<String, Object>> f = new CompletableFuture<>();
        long deadline = timeoutMs > 0 ? System.nanoTime() + timeoutMs * 1_000_000 : 0;
        synchronized (writeLock) {
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
            pending.put(id, new Pending(f, effect, deadline, timeoutMs));
            try {
                for (MessageBuffer b : packer.toBufferList()) out.write(b.array(), b.arrayOffset(), b.size());
                out.flush();
            } catch (IOException e) {
                // Some of it may have been written: the outcome is unknown.
                fail("write failed: " + e.getMessage());
            }
        }
        if (timeoutMs > 0 && sweeper != null) sweeper.due(deadline);
        return f;
    }

    /** Who fails the timed calls: told of each deadline. */
    interface Sweeper {
        void due(long deadline);
    }

    volatile Sweeper sweeper;

    /**
     * Fails the calls whose deadline has passed (the client's sweep calls it);
     * returns the earliest deadline of the timed calls still waiting, or 0 if none.
     */
    long expire(long now) {
        long next = 0;
        boolean any = false;
        for (Map.Entry<Long, Pending> e : pending.entrySet()) {
            Pending p = e.getValue();
            if (p.ms <= 0) continue;
            if (now - p.deadline >= 0) {
                if (pending.remove(e.getKey(), p)) {
                    p.future.completeExceptionally(new ConnectionException(addr, p.effect, "no answer within " + p.ms + " ms", null));
                }
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
            socket.close();
        } catch (IOException ignored) {
            // closing anyway
        }
        for (Long id : new ArrayList<>(pending.keySet())) {
            Pending p = pending.remove(id);
            if (p != null) failed.add(p);
        }
        for (Pending p : failed) {
            // A plain client on a TLS port: nothing was served, a configuration error.
            p.future.completeExceptionally(refusal instanceof TlsRequiredException
                    ? refusal : new ConnectionException(addr, p.effect, why, refusal));
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

    private void readLoop() {
        try {
            while (true) {
                int n = in.unpackArrayHeader();
                answered = true;
                int type = in.unpackInt();
                if (type == 1 && n == 4) {
                    long id = in.unpackLong();
                    Object err = Codec.unpack(in);
                    Object res = Codec.unpack(in);
                    Pending p = pending.remove(id);
                    if (p == null) continue; // a call that gave up
                    if (err instanceof Map) {
                        @SuppressWarnings("unchecked")
                        Map<String, Object> em = (Map<String, Object>) err;
                        p.future.completeExceptionally(FencekvException.of(em));
                    } else {
                        @SuppressWarnings("unchecked")
                        Map<String, Object> rm = res instanceof Map ? (Map<String, Object>) res : Map.of();
                        p.future.complete(rm);
                    }
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
        } catch (EOFException | org.msgpack.core.MessageInsufficientBufferException e) {
            fail(answered ? "closed by the server"
                    : "closed by the server before any answer (does it require TLS? is it at its connection limit?)");
        } catch (IOException | RuntimeException e) {
            fail(dead ? why : "read failed: " + e);
        }
    }
}
