package io.fencekv;

import java.time.Duration;
import java.util.NoSuchElementException;
import java.util.Objects;
import java.util.concurrent.Flow;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * A watch as a {@link Flow.Publisher} of events, beside the blocking
 * iterator {@link Watch}: it is that iterator, read by a delivery thread of
 * its own per subscription, so it resumes across reconnects and restarts
 * exactly as the iterator does (every change once, in order, no gap, no
 * repeat; {@link CompactedException} when the revision to resume from is no
 * longer kept).
 *
 * <ul>
 * <li><b>One subscriber per publisher.</b> The first {@link #subscribe}
 * starts the watch (on a connection of its own, opened by the delivery
 * thread: with start revision 0, "from now" is from when it is
 * established); a second subscribe gets {@code onSubscribe} then
 * {@code onError(IllegalStateException)}. Make a new publisher
 * ({@link FencekvClient#watchPublisher}) for each subscriber.</li>
 * <li><b>Demand.</b> No more {@code onNext} than requested; requests add up
 * (to {@code Long.MAX_VALUE}, unbounded). Events not yet requested wait in
 * the iterator's buffer; if the subscriber stays behind long enough for
 * that to fill, the server cancels the watch and it resumes, gap-free,
 * when demand comes (while the server still keeps the revision). A slow
 * subscriber never holds up the client's other calls, which go over the
 * client's own connection. {@code request(n)} with n &lt;= 0 cancels and
 * signals {@code onError(IllegalArgumentException)} (Reactive Streams
 * §3.9).</li>
 * <li><b>Cancel</b> stops delivery, closes the watch's connection (which
 * ends the watch on the server) and ends the delivery thread.</li>
 * <li><b>Errors.</b> {@code onError} with the typed exception the iterator
 * throws ({@link CompactedException}, or the {@link FencekvException} or
 * {@link ConnectionException} that refused or failed the first connect),
 * then nothing more.</li>
 * <li><b>Completion.</b> A watch has no end of its own: {@code onComplete}
 * comes when the client is closed, then nothing more.</li>
 * </ul>
 *
 * <p>Signals come from the delivery thread, one at a time (the Flow rules'
 * serial signalling); {@code onNext} may call {@code request} and
 * {@code cancel}. An exception thrown by {@code onNext} cancels the
 * subscription.
 *
 * <pre>{@code
 * client.watchPublisher("inventory/", WatchOptions.NONE).subscribe(new Flow.Subscriber<Event>() {
 *     Flow.Subscription s;
 *     public void onSubscribe(Flow.Subscription s) { this.s = s; s.request(16); }
 *     public void onNext(Event e) { handle(e); s.request(1); }
 *     public void onError(Throwable t) { ... }   // e.g. CompactedException: re-read, watch again
 *     public void onComplete() { }                // the client was closed
 * });
 * }</pre>
 */
public final class WatchPublisher implements Flow.Publisher<Event> {
    private final FencekvClient client;
    private final byte[] prefix;
    private final WatchOptions options;
    private final AtomicBoolean subscribed = new AtomicBoolean();

    WatchPublisher(FencekvClient client, byte[] prefix, WatchOptions options) {
        this.client = client;
        this.prefix = prefix == null ? new byte[0] : prefix.clone();
        this.options = options == null ? WatchOptions.NONE : options;
    }

    @Override
    public void subscribe(Flow.Subscriber<? super Event> subscriber) {
        Objects.requireNonNull(subscriber, "subscriber"); // §1.9
        if (!subscribed.compareAndSet(false, true)) {
            subscriber.onSubscribe(new Flow.Subscription() {
                @Override
                public void request(long n) {}

                @Override
                public void cancel() {}
            });
            subscriber.onError(new IllegalStateException("fencekv: this watch publisher already has its subscriber; make a new one per subscriber"));
            return;
        }
        Sub s = new Sub(subscriber);
        subscriber.onSubscribe(s);
        s.thread.start();
    }

    /** One subscription: its demand, and the thread that reads the iterator and signals the subscriber. */
    final class Sub implements Flow.Subscription {
        private final Flow.Subscriber<? super Event> subscriber;
        final Thread thread;
        private long demand; // guarded by this
        private boolean cancelled; // guarded by this
        private IllegalArgumentException badRequest; // guarded by this
        private Watch watch; // guarded by this
        private final Runnable onClientClose = this::clientClosed;
        private volatile boolean clientClosed;

        Sub(Flow.Subscriber<? super Event> subscriber) {
            this.subscriber = subscriber;
            thread = new Thread(this::run, "fencekv-watch-publisher");
            thread.setDaemon(true);
        }

        @Override
        public void request(long n) {
            Watch w;
            synchronized (this) {
                if (cancelled) return;
                if (n <= 0) {
                    if (badRequest == null) badRequest = new IllegalArgumentException("fencekv: request(" + n + "): the demand must be positive (Reactive Streams §3.9)");
                    cancelled = true;
                    w = watch;
                } else {
                    demand = demand + n < 0 ? Long.MAX_VALUE : demand + n; // §3.17
                    notifyAll();
                    return;
                }
                notifyAll();
            }
            if (w != null) w.close(); // wakes the delivery thread if it waits for an event
        }

        @Override
        public void cancel() {
            Watch w;
            synchronized (this) {
                if (cancelled) return;
                cancelled = true;
                w = watch;
                notifyAll();
            }
            if (w != null) w.close();
        }

        private void clientClosed() {
            clientClosed = true;
            Watch w;
            synchronized (this) {
                w = watch;
                notifyAll();
            }
            if (w != null) w.close();
        }

        /** Whether the delivery thread has ended (for the tests). */
        boolean ended() {
            return !thread.isAlive();
        }

        private void run() {
            client.onClose(onClientClose);
            Watch w = null;
            try {
                if (client.isClosed()) {
                    finish(null);
                    return;
                }
                try {
                    w = Watch.start(client, prefix, options.locks, options.startRevision);
                } catch (RuntimeException e) {
                    finish(e);
                    return;
                }
                synchronized (this) {
                    watch = w;
                    if (cancelled) {
                        w.close();
                    }
                }
                if (clientClosed) w.close();
                while (true) {
                    synchronized (this) {
                        while (demand == 0 && !cancelled && !clientClosed) {
                            try {
                                wait();
                            } catch (InterruptedException e) {
                                Thread.currentThread().interrupt();
                                cancelled = true;
                            }
                        }
                        if (cancelled || clientClosed) break;
                    }
                    Event e;
                    try {
                        e = w.next(Duration.ofSeconds(1));
                    } catch (NoSuchElementException closed) {
                        break; // closed: by cancel, a bad request, or the client's close
                    } catch (RuntimeException x) {
                        finish(x);
                        return;
                    }
                    if (e == null) continue;
                    synchronized (this) {
                        if (cancelled) break;
                        if (demand != Long.MAX_VALUE) demand--;
                    }
                    try {
                        subscriber.onNext(e);
                    } catch (Throwable t) {
                        cancel(); // §2.13: a subscriber that throws is taken as cancelled
                        break;
                    }
                }
                finish(null);
            } finally {
                if (w != null) w.close();
                client.offClose(onClientClose);
            }
        }

        /** The terminal signal, if one is due: the bad request's error, err, or completion after the client closed; never after cancel. */
        private void finish(RuntimeException err) {
            boolean complete;
            Throwable signal;
            synchronized (this) {
                if (badRequest != null) {
                    signal = badRequest;
                    complete = false;
                } else if (cancelled) {
                    return;
                } else if (err != null && !(clientClosed && err instanceof ConnectionException)) {
                    signal = err;
                    complete = false;
                } else {
                    signal = null;
                    complete = true;
                }
                cancelled = true;
            }
            try {
                if (complete) {
                    subscriber.onComplete();
                } else {
                    subscriber.onError(signal);
                }
            } catch (Throwable ignored) {
                // §2.13: nothing more to signal
            }
        }
    }
}
