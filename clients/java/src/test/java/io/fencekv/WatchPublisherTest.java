package io.fencekv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Flow;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** WatchPublisher, the watch as a Flow.Publisher, against a real fencekv serve. */
class WatchPublisherTest {
    static Servers.Server shared;
    static FencekvClient client;

    @BeforeAll
    static void up() throws Exception {
        shared = Servers.Server.launch();
        client = FencekvClient.connect(shared.addr());
    }

    @AfterAll
    static void down() throws Exception {
        if (client != null) client.close();
        if (shared != null) shared.close();
    }

    /** Records every signal; requests initial on subscribe; onNext may block on gate. */
    static final class Rec implements Flow.Subscriber<Event> {
        final LinkedBlockingQueue<Event> events = new LinkedBlockingQueue<>();
        final LinkedBlockingQueue<Throwable> errors = new LinkedBlockingQueue<>();
        final CountDownLatch completed = new CountDownLatch(1);
        final AtomicInteger signalsAfterEnd = new AtomicInteger();
        final CountDownLatch subscribed = new CountDownLatch(1);
        final long initial;
        volatile CountDownLatch gate; // if set, onNext waits for it
        volatile Flow.Subscription sub;
        volatile boolean ended;

        Rec(long initial) {
            this.initial = initial;
        }

        @Override
        public void onSubscribe(Flow.Subscription s) {
            sub = s;
            subscribed.countDown();
            if (initial > 0) s.request(initial);
        }

        @Override
        public void onNext(Event e) {
            if (ended) signalsAfterEnd.incrementAndGet();
            CountDownLatch g = gate;
            if (g != null) {
                try {
                    g.await(30, TimeUnit.SECONDS);
                } catch (InterruptedException x) {
                    Thread.currentThread().interrupt();
                }
            }
            events.add(e);
        }

        @Override
        public void onError(Throwable t) {
            if (ended) signalsAfterEnd.incrementAndGet();
            ended = true;
            errors.add(t);
        }

        @Override
        public void onComplete() {
            if (ended) signalsAfterEnd.incrementAndGet();
            ended = true;
            completed.countDown();
        }

        Event next() throws InterruptedException {
            return events.poll(10, TimeUnit.SECONDS);
        }

        WatchPublisher.Sub impl() {
            return (WatchPublisher.Sub) sub;
        }
    }

    private static long revision(FencekvClient c) {
        return c.status().revision();
    }

    private static void expect(Rec r, String prefix, int from, int to) throws InterruptedException {
        for (int i = from; i <= to; i++) {
            Event e = r.next();
            assertNotNull(e, "event " + i + " within 10s (errors: " + r.errors + ")");
            assertEquals("put", e.type());
            assertEquals(prefix + "k", e.keyString());
            assertEquals(Integer.toString(i), e.valueString(), "a gap or a repeat");
        }
    }

    @Test
    void demandIsRespected() throws Exception {
        long from = revision(client) + 1;
        Rec r = new Rec(1);
        client.watchPublisher("pd/", WatchOptions.from(from)).subscribe(r);
        for (int i = 1; i <= 3; i++) client.put("pd/k", Integer.toString(i));
        // The three events have reached this side: an iterator on the same range sees them.
        try (Watch w = client.watch(Codec.bytes("pd/"), false, from)) {
            for (int i = 1; i <= 3; i++) assertNotNull(w.next(Duration.ofSeconds(10)));
        }
        expect(r, "pd/", 1, 1);
        // The delivery thread waits for demand (WAITING: not polling the watch, which is TIMED_WAITING).
        Thread t = r.impl().thread;
        Servers.waitFor(Duration.ofSeconds(10), "the delivery thread to wait for demand", () -> t.getState() == Thread.State.WAITING);
        assertNull(r.events.poll(300, TimeUnit.MILLISECONDS), "an event beyond the demand of 1");
        r.sub.request(2);
        expect(r, "pd/", 2, 3);
        assertNull(r.events.poll(200, TimeUnit.MILLISECONDS), "no repeat");
        // Requests add up: 2 then 3 deliver 5 events.
        r.sub.request(2);
        r.sub.request(3);
        for (int i = 4; i <= 9; i++) client.put("pd/k", Integer.toString(i));
        expect(r, "pd/", 4, 8);
        Servers.waitFor(Duration.ofSeconds(10), "the delivery thread to wait for demand", () -> t.getState() == Thread.State.WAITING);
        assertNull(r.events.poll(300, TimeUnit.MILLISECONDS), "event 9 beyond the demand");
        r.sub.request(Long.MAX_VALUE);
        r.sub.request(Long.MAX_VALUE); // §3.17: no overflow
        expect(r, "pd/", 9, 9);
        r.sub.cancel();
        assertTrue(r.errors.isEmpty(), "errors: " + r.errors);
    }

    @Test
    void nonPositiveRequestIsAnError() throws Exception {
        Rec r = new Rec(0);
        client.watchPublisher("pn/", WatchOptions.NONE).subscribe(r);
        assertTrue(r.subscribed.await(10, TimeUnit.SECONDS));
        r.sub.request(0);
        Throwable t = r.errors.poll(10, TimeUnit.SECONDS);
        assertInstanceOf(IllegalArgumentException.class, t);
        Servers.waitFor(Duration.ofSeconds(10), "the delivery thread to end", r.impl()::ended);
        r.sub.request(5);
        client.put("pn/k", "1");
        assertNull(r.events.poll(300, TimeUnit.MILLISECONDS), "nothing after onError");
        assertEquals(0, r.signalsAfterEnd.get());
    }

    @Test
    void secondSubscriberIsRefused() throws Exception {
        WatchPublisher p = client.watchPublisher("ps/", WatchOptions.NONE);
        Rec a = new Rec(Long.MAX_VALUE);
        Rec b = new Rec(Long.MAX_VALUE);
        p.subscribe(a);
        p.subscribe(b);
        assertTrue(b.subscribed.await(1, TimeUnit.SECONDS), "onSubscribe before onError (§1.9)");
        assertInstanceOf(IllegalStateException.class, b.errors.poll(10, TimeUnit.SECONDS));
        long from = revision(client) + 1;
        a.sub.cancel();
        // The first subscription is untouched by the refusal of the second.
        Rec c = new Rec(Long.MAX_VALUE);
        client.watchPublisher("ps/", WatchOptions.from(from)).subscribe(c);
        client.put("ps/k", "1");
        expect(c, "ps/", 1, 1);
        c.sub.cancel();
    }

    @Test
    void cancelEndsDeliveryAndUnwatches() throws Exception {
        // A server that admits one watcher: a new watch is admitted only once the cancelled one is gone.
        try (Servers.Server s = Servers.Server.launch("--max-watchers", "1");
                FencekvClient c = FencekvClient.connect(s.addr())) {
            long from = revision(c) + 1;
            Rec r = new Rec(Long.MAX_VALUE);
            c.watchPublisher("pc/", WatchOptions.from(from)).subscribe(r);
            c.put("pc/k", "1");
            expect(r, "pc/", 1, 1);
            ConnectionException full = null;
            try (Watch w = c.watch("pc/")) {
                w.lastRevision();
            } catch (ConnectionException e) {
                full = e; // limit_exceeded: the one watcher is the publisher's
            }
            assertNotNull(full, "a second watcher was admitted: the server's limit is not in force");
            r.sub.cancel();
            Servers.waitFor(Duration.ofSeconds(10), "the delivery thread to end", r.impl()::ended);
            c.put("pc/k", "2");
            Servers.waitFor(Duration.ofSeconds(10), "the server to drop the cancelled watch", () -> {
                try (Watch w = c.watch("pc/")) {
                    return true;
                } catch (ConnectionException e) {
                    return false;
                }
            });
            assertNull(r.events.poll(200, TimeUnit.MILLISECONDS), "an event after cancel");
            assertTrue(r.errors.isEmpty() && r.completed.getCount() == 1, "no terminal signal after cancel");
        }
    }

    @Test
    void resumesAcrossKill9AndRestart() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.connect(s.addr())) {
            long r0 = 0;
            for (int i = 1; i <= 10; i++) r0 = c.put("pr/k", Integer.toString(i)).revision();
            Rec r = new Rec(Long.MAX_VALUE);
            c.watchPublisher("pr/", WatchOptions.from(r0 + 1)).subscribe(r);
            for (int i = 11; i <= 50; i++) {
                c.put("other", "x");
                c.put("pr/k", Integer.toString(i));
            }
            expect(r, "pr/", 11, 50);
            Thread t = r.impl().thread;
            s.kill9();
            s.start();
            for (int i = 51; i <= 100; i++) c.put("pr/k", Integer.toString(i));
            expect(r, "pr/", 51, 100);
            assertNull(r.events.poll(200, TimeUnit.MILLISECONDS), "no repeat");
            assertTrue(r.errors.isEmpty(), "errors: " + r.errors);
            assertTrue(t.isAlive());
            // The history is durable: the restarted server replays from revision 1.
            Rec old = new Rec(Long.MAX_VALUE);
            c.watchPublisher("pr/", WatchOptions.from(1)).subscribe(old);
            expect(old, "pr/", 1, 100);
            assertNull(old.events.poll(200, TimeUnit.MILLISECONDS), "no repeat");
            assertTrue(old.errors.isEmpty(), "errors: " + old.errors);
            old.sub.cancel();
            r.sub.cancel();
        }
    }

    @Test
    void slowSubscriberDoesNotBlockTheClient() throws Exception {
        long from = revision(client) + 1;
        Rec r = new Rec(Long.MAX_VALUE);
        r.gate = new CountDownLatch(1); // onNext blocks until released
        client.watchPublisher("pw/", WatchOptions.from(from)).subscribe(r);
        int n = 1500; // enough to fill the buffers if the server sends one batch per put (then it cancels, and the watch resumes)
        long t0 = System.nanoTime();
        for (int i = 1; i <= n; i++) client.put("pw/k", Integer.toString(i));
        assertEquals(Integer.toString(n), client.get("pw/k").valueString());
        long took = (System.nanoTime() - t0) / 1_000_000;
        assertTrue(took < 20_000, "calls took " + took + " ms with the subscriber stuck");
        assertTrue(r.events.isEmpty(), "the stuck subscriber got events");
        r.gate.countDown();
        r.gate = null;
        expect(r, "pw/", 1, n);
        assertNull(r.events.poll(200, TimeUnit.MILLISECONDS), "no repeat");
        assertTrue(r.errors.isEmpty(), "errors: " + r.errors);
        r.sub.cancel();
    }

    @Test
    void clientCloseCompletes() throws Exception {
        FencekvClient c = FencekvClient.connect(shared.addr());
        long from = revision(c) + 1;
        Rec r = new Rec(Long.MAX_VALUE);
        c.watchPublisher("pk/", WatchOptions.from(from)).subscribe(r);
        c.put("pk/k", "1");
        expect(r, "pk/", 1, 1);
        c.close();
        assertTrue(r.completed.await(10, TimeUnit.SECONDS), "onComplete after the client closed");
        Servers.waitFor(Duration.ofSeconds(10), "the delivery thread to end", r.impl()::ended);
        client.put("pk/k", "2");
        assertNull(r.events.poll(200, TimeUnit.MILLISECONDS), "nothing after onComplete");
        assertEquals(0, r.signalsAfterEnd.get());
        assertTrue(r.errors.isEmpty());
    }
}
