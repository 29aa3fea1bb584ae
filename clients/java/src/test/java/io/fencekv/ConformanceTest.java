package io.fencekv;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The scenarios of clients/CONFORMANCE.md (C01–C07, C09, C11–C14) against a
 * real fencekv serve built from the tree. C08 is in ClusterTest, C10 in
 * SecurityTest.
 */
class ConformanceTest {
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

    private static void waitFor(String what, java.util.function.BooleanSupplier cond) {
        Servers.waitFor(Duration.ofSeconds(10), what, cond);
    }

    /** Waits until the lease of lock has run out on the server (held with ttl 0, or free). */
    private static void waitExpired(FencekvClient c, String lock) {
        waitFor("the lease of " + lock + " to run out", () -> {
            LockInfo in = c.lockInfo(lock);
            return !in.held() || in.ttl().isZero();
        });
    }

    @Test
    void c01Seed() throws Exception {
        FencekvClient b = FencekvClient.connect(shared.addr());
        try {
            Grant a = client.acquire("c01/L", Duration.ofMillis(300), AcquireOptions.holder("A"));
            // B queues; A is "paused": it never renews, and its lease expires.
            CompletableFuture<Grant> bf = b.acquireAsync("c01/L", Duration.ofSeconds(10),
                    AcquireOptions.holder("B").withWait(Duration.ofSeconds(10)));
            Grant bg = bf.get(10, TimeUnit.SECONDS);
            assertTrue(bg.token() > a.token(), "B's token " + bg.token() + " above A's " + a.token());
            b.put("c01/k", "B", WriteOptions.token(bg.token()));
            StaleTokenException e = assertThrows(StaleTokenException.class,
                    () -> client.put("c01/k", "A", WriteOptions.token(a.token())));
            assertEquals(bg.token(), e.fence());
            assertEquals("stale_token", e.code());
            assertEquals("B", client.get("c01/k").valueString());
            b.release("c01/L", bg.token());
        } finally {
            b.close();
        }
    }

    @Test
    void c02HeldWriteAfterExpiry() {
        Grant g = client.acquire("c02/L", Duration.ofMillis(200));
        waitExpired(client, "c02/L");
        FencekvException e = assertThrows(FencekvException.class,
                () -> client.put("c02/k", "late", WriteOptions.token(g.token()).lock("c02/L")));
        assertTrue(e instanceof LeaseExpiredException || e instanceof NotHolderException, "got " + e);
        if (e instanceof LeaseExpiredException) assertEquals(g.token(), ((LeaseExpiredException) e).token());
        Entry en = client.get("c02/k");
        assertFalse(en.found());
        assertEquals(0, en.fence());
    }

    @Test
    void c03FenceSurvivesDelete() {
        client.put("c03/k", "v", WriteOptions.token(5));
        WriteResult d = client.delete("c03/k", WriteOptions.token(5));
        assertTrue(d.deleted());
        assertEquals(5, d.fence());
        StaleTokenException e = assertThrows(StaleTokenException.class, () -> client.put("c03/k", "old", WriteOptions.token(4)));
        assertEquals(5, e.fence());
        Entry en = client.get("c03/k");
        assertFalse(en.found());
        assertNull(en.value());
        assertEquals(5, en.fence());
    }

    @Test
    void c04FifoQueuedAcquires() throws Exception {
        Grant a = client.acquire("c04/L", Duration.ofSeconds(10));
        CompletableFuture<Grant> b = client.acquireAsync("c04/L", Duration.ofSeconds(10), AcquireOptions.waitFor(Duration.ofSeconds(20)));
        waitFor("B queued", () -> client.lockInfo("c04/L").waiters() == 1);
        CompletableFuture<Grant> c = client.acquireAsync("c04/L", Duration.ofSeconds(10), AcquireOptions.waitFor(Duration.ofSeconds(20)));
        waitFor("C queued", () -> client.lockInfo("c04/L").waiters() == 2);
        client.release("c04/L", a.token());
        Grant bg = b.get(10, TimeUnit.SECONDS);
        assertFalse(c.isDone(), "C was granted while B holds the lock");
        assertEquals(1, client.lockInfo("c04/L").waiters());
        client.release("c04/L", bg.token());
        Grant cg = c.get(10, TimeUnit.SECONDS);
        assertTrue(cg.token() > bg.token());
        assertTrue(bg.token() > a.token());
        client.release("c04/L", cg.token());
    }

    @Test
    void c05LostGrantFound() throws Exception {
        try (CutProxy p = new CutProxy(shared.addr());
                FencekvClient c = FencekvClient.builder().addresses(p.addr()).build()) {
            c.ping();
            p.dropAnswers = true; // the acquire reaches the server; its answer never comes back
            CompletableFuture<Lease> lf = CompletableFuture.supplyAsync(() -> c.lock("c05/L", Duration.ofSeconds(5)));
            waitFor("the grant on the server", () -> client.lockInfo("c05/L").held());
            LockInfo granted = client.lockInfo("c05/L");
            long lastToken = client.status().lastToken();
            p.dropAnswers = false;
            p.cut(); // the connection breaks with the acquire's answer lost
            try (Lease lease = lf.get(15, TimeUnit.SECONDS)) {
                assertEquals(granted.token(), lease.token(), "the lease is the grant the server made");
                assertEquals(granted.holder(), lease.holder());
                assertTrue(lease.holder().startsWith(InetAddress.getLocalHost().getHostName() + ":" + ProcessHandle.current().pid() + ":"));
                assertFalse(lease.isLost());
                assertEquals(lastToken, client.status().lastToken(), "no second grant");
                LockInfo after = client.lockInfo("c05/L");
                assertTrue(after.held());
                assertEquals(lease.token(), after.token());
            }
            assertFalse(client.lockInfo("c05/L").held(), "released on close");
        }
    }

    @Test
    void c06LeaseKeptThroughRestart() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.connect(s.addr())) {
            Duration ttl = Duration.ofSeconds(3);
            try (Lease lease = c.lock("c06/L", ttl)) {
                long token = lease.token();
                s.kill9();
                s.start(); // same data dir and port, well within the TTL
                long restarted = System.nanoTime();
                // Past a whole TTL after the restart, the lease lives only if renewed on the new process.
                Servers.waitFor(Duration.ofSeconds(15), "a TTL after the restart", () -> {
                    assertFalse(lease.isLost(), "lease lost across the restart");
                    return System.nanoTime() - restarted > ttl.toNanos() + ttl.toNanos() / 3;
                });
                try (FencekvClient d = FencekvClient.connect(s.addr())) {
                    LockInfo in = d.lockInfo("c06/L");
                    assertTrue(in.held());
                    assertEquals(token, in.token());
                    assertTrue(in.ttl().compareTo(ttl.dividedBy(3)) > 0, "renewed recently: " + in.ttl());
                }
                lease.check();
                assertEquals(token, lease.token());
            }
        }
    }

    @Test
    void c07LossSignalledBeforeExpiry() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.connect(s.addr())) {
            Duration ttl = Duration.ofMillis(1500);
            AtomicLong lostAt = new AtomicLong();
            long before = System.nanoTime(); // at or before the acquire's send, so before the grant
            Lease lease = c.lock("c07/L", ttl);
            lease.onLost(e -> lostAt.set(System.nanoTime()));
            Servers.signal(s.pid(), "STOP");
            try {
                Servers.waitFor(Duration.ofSeconds(10), "the loss signal", () -> lostAt.get() != 0);
                long by = before + ttl.toNanos();
                assertTrue(lostAt.get() - by < 0, "loss signalled " + (lostAt.get() - by) / 1_000_000 + " ms after grant + TTL");
                assertTrue(lease.isLost());
                assertThrows(LeaseLostException.class, lease::check);
                // Stopped for longer than the TTL.
                Servers.waitFor(Duration.ofSeconds(10), "the TTL to pass", () -> System.nanoTime() - by > ttl.toNanos() / 2);
            } finally {
                Servers.signal(s.pid(), "CONT");
            }
            assertThrows(LeaseLostException.class, () -> c.put("c07/k", "v", lease), "a held write after the loss is not sent");
            lease.close();
        }
    }

    @Test
    void c09WatchResumed() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.connect(s.addr())) {
            long r = 0;
            for (int i = 1; i <= 10; i++) r = c.put("w/k", Integer.toString(i)).revision();
            // From revision r: every event after r once, in order.
            try (Watch w = c.watch(Codec.bytes("w/"), false, r + 1)) {
                for (int i = 11; i <= 50; i++) {
                    c.put("other", "x"); // outside the prefix: not delivered
                    c.put("w/k", Integer.toString(i));
                }
                expect(w, 11, 50);
                // The watch resumes right after the last revision it delivered,
                // from the server's durable history, so nothing is missed.
                s.kill9();
                s.start();
                for (int i = 51; i <= 100; i++) c.put("w/k", Integer.toString(i));
                expect(w, 51, 100);
                assertNull(w.next(Duration.ofMillis(200)), "no repeat");
            }
            // The history is durable: the restarted server replays from revision 1.
            try (Watch w2 = c.watch(Codec.bytes("w/"), false, 1)) {
                expect(w2, 1, 3);
            }
        }
    }

    @Test
    void c09WatchResumedAcrossCuts() throws Exception {
        try (CutProxy p = new CutProxy(shared.addr());
                FencekvClient wc = FencekvClient.connect(p.addr());
                Watch w = wc.watch("cw/")) {
            CompletableFuture<Void> writer = CompletableFuture.runAsync(() -> {
                for (int i = 1; i <= 300; i++) {
                    client.put("cw/k", Integer.toString(i));
                    if (i == 100 || i == 200) p.cut();
                }
            });
            expect(w, 1, 300);
            writer.get(10, TimeUnit.SECONDS);
        }
    }

    private static void expect(Watch w, int from, int to) {
        for (int i = from; i <= to; i++) {
            Event e = w.next(Duration.ofSeconds(10));
            assertNotNull(e, "event " + i + " within 10s");
            assertEquals("put", e.type());
            assertEquals(Integer.toString(i), e.valueString(), "a gap or a repeat");
        }
    }

    @Test
    void c11RefusalCodes() {
        client.put("c11/k", "v", WriteOptions.token(7));
        assertEquals(7, assertThrows(StaleTokenException.class, () -> client.put("c11/k", "v", WriteOptions.token(6))).fence());
        Grant g = client.acquire("c11/L", Duration.ofSeconds(10), AcquireOptions.holder("me"));
        NotHolderException nh = assertThrows(NotHolderException.class, () -> client.renew("c11/L", g.token() + 1000));
        assertEquals(g.token(), nh.token());
        LockHeldException lh = assertThrows(LockHeldException.class, () -> client.acquire("c11/L", Duration.ofSeconds(1)));
        assertEquals("me", lh.holder());
        assertEquals(g.token(), lh.token());
        assertTrue(lh.retryAfter().toMillis() > 0 && lh.retryAfter().toMillis() <= 10_000, "retry " + lh.retryAfter());
        client.release("c11/L", g.token());
        Grant e = client.acquire("c11/E", Duration.ofMillis(100));
        waitExpired(client, "c11/E");
        assertEquals(e.token(), assertThrows(LeaseExpiredException.class, () -> client.renew("c11/E", e.token())).token());
        WriteResult w = client.put("c11/cas", "1");
        assertEquals(w.revision(), assertThrows(CompareFailedException.class, () -> client.cas("c11/cas", w.revision() + 99, "2", WriteOptions.NONE)).revision());
        client.put("c11/text", "abc");
        assertEquals("not_integer", assertThrows(NotIntegerException.class, () -> client.incr("c11/text", 1, WriteOptions.NONE)).code());
        assertEquals("too_large", assertThrows(TooLargeException.class, () -> client.put(Codec.bytes("c11/big"), new byte[1024 * 1024 + 1], WriteOptions.NONE)).code());
        assertEquals("bad_request", assertThrows(BadRequestException.class, () -> client.acquire("c11/T", Duration.ofMillis(1))).code());
        assertEquals("unknown_method", assertThrows(UnknownMethodException.class, () -> client.call("no_such_method", null)).code());
        // The facts arrive as they were sent.
        StaleTokenException st = assertThrows(StaleTokenException.class, () -> client.put("c11/k", "v", WriteOptions.token(1)));
        assertEquals(7L, st.facts().get("fence"));
        assertFalse(st.serverMessage().isEmpty());
    }

    @Test
    void c12BadInput() {
        client.put("c12/k", "v");
        long rev = client.status().revision();
        assertThrows(BadRequestException.class, () -> client.put("", "v", WriteOptions.NONE));
        assertThrows(TooLargeException.class, () -> client.put("k".repeat(4097), "v", WriteOptions.NONE));
        assertThrows(BadRequestException.class, () -> client.put("c12/k", "w", WriteOptions.NONE.strict()));
        assertThrows(BadRequestException.class, () -> client.acquire("c12/L", Duration.ofMillis(99)));
        assertThrows(BadRequestException.class, () -> client.acquire("c12/L", Duration.ofMillis(3_600_001)));
        assertThrows(BadRequestException.class, () -> client.acquire("", Duration.ofSeconds(1)));
        assertEquals(rev, client.status().revision(), "nothing changed");
        assertEquals("v", client.get("c12/k").valueString());
        assertFalse(client.lockInfo("c12/L").held());
    }

    @Test
    void c13NoReuseOfClosedConnection() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.builder().addresses(s.addr()).backoff(Duration.ofMillis(10), Duration.ofMillis(50)).build()) {
            c.put("c13/k", "1");
            s.stop(); // closes the connection
            ConnectionException down = assertThrows(ConnectionException.class, () -> c.put("c13/k", "never sent"));
            assertFalse(down.outcomeUnknown(), "a write never sent is not of unknown outcome: " + down);
            s.start();
            Servers.waitFor(Duration.ofSeconds(5), "the backoff to pass", () -> {
                try {
                    assertEquals("1", c.get("c13/k").valueString()); // a read over a new connection
                    return true;
                } catch (ConnectionException e) {
                    assertFalse(e.outcomeUnknown());
                    return false; // still in the backoff of the failed dial
                }
            });
            s.kill9();
            s.start();
            // The server closed the old connection while it was idle: the next calls go over a new one.
            assertEquals("1", c.get("c13/k").valueString());
            WriteResult w = c.put("c13/k", "2");
            assertTrue(w.revision() > 0);
            assertEquals("2", c.get("c13/k").valueString());
        }
    }

    @Test
    void c14SilentNodePassedOver() throws Exception {
        List<Socket> held = new ArrayList<>();
        try (ServerSocket silent = new ServerSocket(0, 50, InetAddress.getLoopbackAddress())) {
            Thread t = new Thread(() -> {
                try {
                    while (true) held.add(silent.accept()); // accepts, never answers
                } catch (Exception ignored) {
                    // closed
                }
            });
            t.setDaemon(true);
            t.start();
            long start = System.nanoTime();
            try (FencekvClient c = FencekvClient.builder().addresses("127.0.0.1:" + silent.getLocalPort(), shared.addr())
                    .connectTimeout(Duration.ofMillis(500)).build()) {
                assertNotNull(c.ping());
                c.put("c14/k", "v");
                long took = (System.nanoTime() - start) / 1_000_000;
                assertTrue(took < 2000, "took " + took + " ms");
                assertEquals(shared.addr(), c.address());
            }
        } finally {
            for (Socket s : held) s.close();
        }
    }

    @Test
    void pipelinedAsyncCalls() throws Exception {
        List<CompletableFuture<WriteResult>> fs = new ArrayList<>();
        for (int i = 0; i < 500; i++) fs.add(client.putAsync(Codec.bytes("pipe/" + i), Codec.bytes("v" + i), WriteOptions.NONE));
        CompletableFuture.allOf(fs.toArray(new CompletableFuture[0])).get(20, TimeUnit.SECONDS);
        Page<Entry> p = client.scan(Codec.bytes("pipe/"), null, 1000);
        assertEquals(500, p.items().size());
        assertFalse(p.more());
        TxnResult t = client.txn(List.of(TxnOp.put("pipe/t", "x"), TxnOp.incr("pipe/n", 5)),
                List.of(TxnOp.compare("pipe/n", 0)), WriteOptions.NONE);
        assertEquals(2, t.results().size());
        assertEquals(5, t.results().get(1).value());
        assertEquals(client.get("pipe/n").revision(), t.revision());
        assertArrayEquals(Codec.bytes("pipe/t"), t.results().get(0).key());
        Map<String, Object> raw = client.call("ping", null);
        assertEquals(client.ping(), raw.get("version"));
        assertTrue(client.members().isEmpty());
        assertEquals("single", client.status().role());
    }

    @Test
    void leaseHeldWritesAndRelease() {
        try (Lease lease = client.lock("inventory", Duration.ofSeconds(2))) {
            WriteResult w = client.put("inventory/sku-1", "42", lease);
            assertEquals(lease.token(), w.fence());
            assertThrows(LockHeldException.class, () -> client.lock("inventory", Duration.ofSeconds(1)));
            Page<LockInfo> locks = client.locks("inventory", null, 0);
            assertEquals(1, locks.items().size());
            assertEquals(lease.holder(), locks.items().get(0).holder());
        }
        assertFalse(client.lockInfo("inventory").held(), "released on close");
        try (Lease l2 = client.lock("inventory", Duration.ofSeconds(2), LockOptions.waitFor(Duration.ofSeconds(1)))) {
            assertTrue(l2.remaining().toMillis() > 0);
        } catch (RuntimeException e) {
            fail(e);
        }
    }
}
