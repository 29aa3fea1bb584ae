package io.fencekv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.InputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.Test;

/**
 * C16 election (clients/CONFORMANCE.md; PROTOCOL.md §12) against a real
 * fencekv serve: Election.campaign / leader / observe.
 */
class ElectionTest {
    private static final Duration T = Duration.ofSeconds(20);

    private static void waiters(FencekvClient c, String name, long n) {
        Servers.waitFor(T, n + " queued on " + name, () -> c.lockInfo(name).waiters() == n);
    }

    private static CompletableFuture<Leadership> campaignAsync(Election e, String value, Duration ttl) {
        CompletableFuture<Leadership> f = new CompletableFuture<>();
        Thread t = new Thread(() -> {
            try {
                f.complete(e.campaign(value, ttl));
            } catch (Throwable x) {
                f.completeExceptionally(x);
            }
        }, "campaign " + value);
        t.setDaemon(true);
        t.start();
        return f;
    }

    @Test
    void C16_handOverInFifoOrderWithRisingEpochs() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient ca = FencekvClient.connect(s.addr());
                FencekvClient cb = FencekvClient.connect(s.addr());
                FencekvClient cc = FencekvClient.connect(s.addr())) {
            Election e = ca.election("e");
            assertEquals(new LeaderState("e", false, "", 0, Duration.ZERO), e.leader());
            Leadership a = e.campaign("a", Duration.ofSeconds(10));
            assertEquals("a", a.value());
            assertTrue(a.epoch() > 0);
            LeaderState now = cb.election("e").leader();
            assertTrue(now.held());
            assertEquals("a", now.value());
            assertEquals(a.epoch(), now.epoch());

            CompletableFuture<Leadership> b = campaignAsync(cb.election("e"), "b", Duration.ofSeconds(10));
            waiters(ca, "e", 1);
            CompletableFuture<Leadership> c = campaignAsync(new Election(cc, "e"), "c", Duration.ofSeconds(10));
            waiters(ca, "e", 2);
            assertFalse(b.isDone() || c.isDone(), "a candidate led while a leads");

            a.close(); // resign: b queued first, so b leads, not c
            Leadership bl = b.get(10, TimeUnit.SECONDS);
            assertEquals("b", bl.value());
            assertTrue(bl.epoch() > a.epoch(), "epoch " + bl.epoch() + " after " + a.epoch());
            assertEquals(1, ca.lockInfo("e").waiters());
            assertFalse(c.isDone());
            assertEquals("b", e.leader().value());
            a.resign(); // again: nothing

            // The deposed leader's held write is refused; the leader's is accepted.
            assertThrows(NotHolderException.class, () -> ca.put("e/out", "a", WriteOptions.token(a.epoch()).lock("e")));
            cb.put("e/out", "b", bl.lease());

            bl.resign();
            Leadership cl = c.get(10, TimeUnit.SECONDS);
            assertTrue(cl.epoch() > bl.epoch());
            // Once c has written with its epoch, b's epoch is refused as stale, even without the lock.
            cc.put("e/fenced", "c", WriteOptions.token(cl.epoch()));
            StaleTokenException st = assertThrows(StaleTokenException.class,
                    () -> cb.put("e/fenced", "b", WriteOptions.token(bl.epoch())));
            assertEquals(cl.epoch(), st.fence());
            assertEquals("c", ca.get("e/fenced").valueString());
            try (cl) {
                assertFalse(cl.isLost());
            }
            assertFalse(e.leader().held());
        }
    }

    @Test
    void C16_leaderWhoseRenewalsStopLosesAndTheNextLeads() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                CutProxy p = new CutProxy(s.addr());
                FencekvClient ca = FencekvClient.builder().addresses(p.addr()).callTimeout(Duration.ofMillis(300)).build();
                FencekvClient cb = FencekvClient.connect(s.addr())) {
            Leadership a = ca.election("e").campaign("a", Duration.ofMillis(1500));
            AtomicLong lostAt = new AtomicLong();
            a.onLost(x -> lostAt.set(System.nanoTime()));
            CompletableFuture<Leadership> b = campaignAsync(cb.election("e"), "b", Duration.ofSeconds(10));
            waiters(cb, "e", 1);
            p.dropAnswers = true; // a's renewals reach nobody's answer: they stop succeeding
            p.cut();
            Leadership bl = b.get(15, TimeUnit.SECONDS);
            long ledAt = System.nanoTime();
            assertTrue(a.isLost(), "a still believes it leads while b leads");
            assertThrows(LeaseLostException.class, a::check);
            assertNotEquals(0, lostAt.get(), "a's loss listener was not called");
            assertTrue(lostAt.get() - ledAt < 0, "a noticed its loss after b led");
            assertTrue(bl.epoch() > a.epoch());
            cb.put("e/out", "b", WriteOptions.token(bl.epoch()).lock("e"));
            assertThrows(NotHolderException.class, () -> cb.put("e/out", "a", WriteOptions.token(a.epoch()).lock("e")));
            assertThrows(StaleTokenException.class, () -> cb.put("e/out", "a", WriteOptions.token(a.epoch())));
            assertEquals("b", cb.get("e/out").valueString());
            p.dropAnswers = false;
            a.resign(); // lost: releasing b's lock is refused, and that is fine
            assertEquals("b", cb.election("e").leader().value());
            bl.resign();
        }
    }

    @Test
    void C16_serverStoppedPastTheTtlDeposesTheLeader() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient ca = FencekvClient.builder().addresses(s.addr()).callTimeout(Duration.ofMillis(300)).build();
                FencekvClient cb = FencekvClient.connect(s.addr())) {
            Leadership a = ca.election("e").campaign("a", Duration.ofSeconds(1));
            CompletableFuture<Leadership> b = campaignAsync(cb.election("e"), "b", Duration.ofSeconds(10));
            waiters(ca, "e", 1);
            Servers.signal(s.pid(), "STOP");
            long stopped = System.nanoTime();
            try {
                // On its own clock: no renew can succeed while the server is stopped.
                Servers.waitFor(T, "a to take its leadership as lost", a::isLost);
                assertTrue(System.nanoTime() - stopped < TimeUnit.SECONDS.toNanos(1), "lost only after the TTL");
                // Stopped past the TTL: the server expires a's lease as soon as it runs again.
                Servers.waitFor(T, "the TTL to pass", () -> System.nanoTime() - stopped > TimeUnit.MILLISECONDS.toNanos(1300));
                assertFalse(b.isDone(), "b led while the server was stopped");
            } finally {
                Servers.signal(s.pid(), "CONT");
            }
            Leadership bl = b.get(15, TimeUnit.SECONDS);
            assertTrue(bl.epoch() > a.epoch());
            assertThrows(LeaseLostException.class, a::check);
            cb.put("e/out", "b", bl.lease());
            assertThrows(NotHolderException.class, () -> cb.put("e/out", "a", WriteOptions.token(a.epoch()).lock("e")));
            a.resign(); // lost: its release is refused, b keeps leading
            assertEquals("b", cb.election("e").leader().value());
            bl.resign();
        }
    }

    @Test
    void C16_serverKilledAndRestartedDuringACampaign() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient ca = FencekvClient.connect(s.addr());
                FencekvClient cb = FencekvClient.connect(s.addr())) {
            Leadership a = ca.election("e").campaign("a", Duration.ofSeconds(5));
            CompletableFuture<Leadership> b = campaignAsync(cb.election("e"), "b", Duration.ofSeconds(5));
            waiters(ca, "e", 1);
            s.kill9();
            s.start(); // same data, same port: a's lease is restored with its full TTL
            // b's acquire answer was lost with the process: it looks the lock up (a holds it) and queues again.
            waiters(ca, "e", 1);
            assertFalse(b.isDone(), "b led while a leads");
            assertFalse(a.isLost(), "a's lease, renewed on the new process, was lost");
            assertEquals("a", ca.election("e").leader().value());
            a.resign();
            Leadership bl = b.get(15, TimeUnit.SECONDS);
            assertTrue(bl.epoch() > a.epoch());
            assertEquals("b", ca.election("e").leader().value());
            bl.resign();
            assertFalse(ca.election("e").leader().held());
        }
    }

    @Test
    void C16_lostAcquireAnswerIsLookedUpAndReleased() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                CutProxy p = new CutProxy(s.addr());
                FencekvClient cb = FencekvClient.builder().addresses(p.addr()).callTimeout(Duration.ofSeconds(1)).build();
                FencekvClient c = FencekvClient.connect(s.addr())) {
            cb.ping();
            p.dropAnswers = true; // the acquire reaches the server; its answer never comes back
            long start = System.nanoTime();
            CompletableFuture<Leadership> b = campaignAsync(cb.election("e").withWait(Duration.ofMillis(200)), "b",
                    Duration.ofSeconds(30));
            Servers.waitFor(T, "the grant on the server", () -> c.lockInfo("e").held());
            LockInfo first = c.lockInfo("e");
            assertEquals("b", first.holder());
            p.dropAnswers = false;
            Leadership bl = b.get(15, TimeUnit.SECONDS);
            // The first grant (no send time to measure from) was released, and a new one made: not waited out.
            assertTrue(bl.epoch() > first.token(), "led with " + bl.epoch() + ", the lost grant was " + first.token());
            assertTrue(System.nanoTime() - start < TimeUnit.SECONDS.toNanos(20), "the lost grant was waited out, not released");
            LockInfo now = c.lockInfo("e");
            assertEquals(bl.epoch(), now.token());
            assertEquals("b", now.holder());
            assertThrows(NotHolderException.class, () -> c.put("e/out", "x", WriteOptions.token(first.token()).lock("e")));
            bl.resign();
        }
    }

    @Test
    void C16_observeSeesEveryChangeInOrderAcrossARestart() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.connect(s.addr());
                FencekvClient ob = FencekvClient.connect(s.addr())) {
            Election e = c.election("e");
            List<LeaderState> seen = new CopyOnWriteArrayList<>();
            Election.Observer states = ob.election("e").observe();
            Thread t = new Thread(() -> {
                for (LeaderState st : states) seen.add(st);
            }, "observer");
            t.setDaemon(true);
            t.start();
            Servers.waitFor(T, "the first state", () -> seen.size() >= 1);
            assertFalse(seen.get(0).held());

            Leadership a = e.campaign("a", Duration.ofSeconds(10));
            Servers.waitFor(T, "a's leadership", () -> seen.size() >= 2);
            // Noise: a lock that shares the prefix, and the key of the same name.
            Grant x = c.acquire("ex", Duration.ofSeconds(10));
            c.release("ex", x.token());
            c.put("e", "key noise");
            CompletableFuture<Leadership> b = campaignAsync(e, "b", Duration.ofSeconds(10));
            waiters(c, "e", 1);
            a.resign();
            Leadership bl = b.get(10, TimeUnit.SECONDS);
            Servers.waitFor(T, "b's leadership", () -> seen.size() >= 3);
            bl.resign();
            Servers.waitFor(T, "no leader", () -> seen.size() >= 4);
            assertEquals(List.of(new Held(false, "", 0), new Held(true, "a", a.epoch()),
                    new Held(true, "b", bl.epoch()), new Held(false, "", 0)), held(seen.subList(0, 4)));

            // Across a kill -9 and restart of the server: the observer watches and reads again.
            s.kill9();
            s.start();
            Leadership r = e.campaign("r", Duration.ofSeconds(10));
            Servers.waitFor(T, "r's leadership after the restart",
                    () -> seen.get(seen.size() - 1).held() && seen.get(seen.size() - 1).epoch() == r.epoch());
            r.resign();

            // A burst: coalesced perhaps, but the final state is seen and epochs only rise.
            Leadership last = null;
            for (int i = 0; i < 15; i++) {
                last = e.campaign("c" + i, Duration.ofSeconds(10));
                if (i < 14) last.resign();
            }
            long lastEpoch = last.epoch();
            Servers.waitFor(T, "the final leader", () -> seen.get(seen.size() - 1).epoch() == lastEpoch);
            assertEquals("c14", seen.get(seen.size() - 1).value());
            long top = 0;
            for (int i = 0; i < seen.size(); i++) {
                LeaderState st = seen.get(i);
                if (i > 0) assertFalse(st.sameAs(seen.get(i - 1)), "a repeat at " + i + ": " + seen);
                if (st.held()) {
                    assertTrue(st.epoch() > top, "epoch " + st.epoch() + " after " + top + ": " + seen);
                    top = st.epoch();
                }
            }
            states.close();
            t.join(10_000);
            assertFalse(t.isAlive(), "the observer did not end on close");
            last.resign();
        }
    }

    private record Held(boolean held, String value, long epoch) {}

    private static List<Held> held(List<LeaderState> ss) {
        List<Held> out = new ArrayList<>();
        for (LeaderState s : ss) out.add(new Held(s.held(), s.value(), s.held() ? s.epoch() : 0)); // a free lock's token is informational
        return out;
    }

    @Test
    void C16_campaignTimeoutLeavesNothing() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient ca = FencekvClient.connect(s.addr());
                FencekvClient cb = FencekvClient.connect(s.addr())) {
            Leadership a = ca.election("e").campaign("a", Duration.ofSeconds(10));
            assertThrows(TimeoutException.class, () -> cb.election("e").campaign("b", Duration.ofSeconds(10), Duration.ofMillis(300)));
            assertEquals(0, ca.lockInfo("e").waiters());
            a.resign();
            assertFalse(ca.lockInfo("e").held());
        }
    }

    @Test
    void anInterruptedCampaignEndsAndTheClientsCloseEndsAnObserver() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient ca = FencekvClient.connect(s.addr());
                FencekvClient cb = FencekvClient.connect(s.addr())) {
            Leadership a = ca.election("e").campaign("a", Duration.ofSeconds(10));
            CompletableFuture<Leadership> b = new CompletableFuture<>();
            Thread t = new Thread(() -> {
                try {
                    b.complete(cb.election("e").campaign("b", Duration.ofSeconds(1)));
                } catch (Throwable x) {
                    b.completeExceptionally(x);
                }
            });
            t.setDaemon(true);
            t.start();
            waiters(ca, "e", 1);
            t.interrupt();
            java.util.concurrent.ExecutionException x = assertThrows(java.util.concurrent.ExecutionException.class,
                    () -> b.get(10, TimeUnit.SECONDS));
            assertEquals("interrupted", ((FencekvException) x.getCause()).code());
            a.resign();
            // The queued acquire may still be granted after the interrupt: unrenewed, it runs out after its TTL.
            Servers.waitFor(T, "no lease left", () -> {
                LockInfo in = ca.lockInfo("e");
                return !in.held() && in.waiters() == 0;
            });

            FencekvClient co = FencekvClient.connect(s.addr());
            Election.Observer states = co.election("e").observe();
            assertTrue(states.hasNext());
            assertFalse(states.next().held());
            co.close();
            Thread r = new Thread(() -> {
                while (states.hasNext()) states.next();
            });
            r.setDaemon(true);
            r.start();
            r.join(10_000);
            assertFalse(r.isAlive(), "the observer went on after its client's close");
        }
    }

    @Test
    void C16_badInputSendsNothing() throws Exception {
        List<Socket> accepted = new CopyOnWriteArrayList<>();
        try (ServerSocket silent = new ServerSocket(0, 50, InetAddress.getLoopbackAddress())) {
            Thread t = new Thread(() -> {
                try {
                    while (true) accepted.add(silent.accept()); // accepts, never answers
                } catch (Exception ignored) {
                    // closed
                }
            });
            t.setDaemon(true);
            t.start();
            // A server that never answers: a request sent would time out, not be refused at once.
            try (FencekvClient c = FencekvClient.builder().addresses("127.0.0.1:" + silent.getLocalPort())
                    .connectTimeout(Duration.ofMillis(500)).callTimeout(Duration.ofSeconds(2)).build()) {
                Election e = c.election("e");
                Duration ttl = Duration.ofSeconds(1);
                assertThrows(BadRequestException.class, () -> e.campaign("", ttl));
                assertThrows(BadRequestException.class, () -> e.campaign(null, ttl));
                assertThrows(TooLargeException.class, () -> e.campaign("v".repeat(4097), ttl));
                assertThrows(BadRequestException.class, () -> e.campaign("v", Duration.ZERO));
                assertThrows(BadRequestException.class, () -> e.campaign("v", Duration.ofSeconds(-1)));
                assertThrows(BadRequestException.class, () -> e.withMargin(ttl).campaign("v", ttl));
                assertThrows(BadRequestException.class, () -> e.withMargin(Duration.ofMillis(-1)).campaign("v", ttl));
                assertThrows(BadRequestException.class, () -> e.campaign("v", ttl, Duration.ofSeconds(-1)));
                assertThrows(BadRequestException.class, () -> e.withWait(Duration.ZERO));
                assertThrows(BadRequestException.class, () -> c.election(""));
                assertThrows(BadRequestException.class, () -> new Election(c, null));
            }
            for (Socket so : accepted) {
                InputStream in = so.getInputStream();
                assertEquals(0, in.available(), "bytes were sent for bad input");
            }
        } finally {
            for (Socket so : accepted) so.close();
        }
        // And against a real server: the value checks leave the lock untouched; a TTL under the server's
        // minimum is the server's bad_request, changing nothing.
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.connect(s.addr())) {
            long before = c.status().lastToken();
            assertThrows(BadRequestException.class, () -> c.election("e").campaign("", Duration.ofSeconds(1)));
            assertThrows(BadRequestException.class, () -> c.election("e").withMargin(Duration.ZERO).campaign("v", Duration.ofMillis(10)));
            LockInfo in = c.lockInfo("e");
            assertFalse(in.held());
            assertEquals(0, in.waiters());
            assertEquals(before, c.status().lastToken(), "a token was spent on bad input");
            assertNotNull(c.election("e").leader());
        }
    }
}
