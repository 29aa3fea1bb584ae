package io.fencekv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * C15 Semaphores (clients/CONFORMANCE.md) against a real fencekv serve:
 * permits with tokens of their own, FIFO waiters, held writes by a permit's
 * token, lockInfo's limit and holders, limit_mismatch and bad limits changing
 * nothing, the lock helper holding a permit, a lost permit found among the
 * holders by its holder name.
 */
class SemaphoreTest {
    static Servers.Server shared;
    static FencekvClient client;
    static final Duration TEN = Duration.ofSeconds(10);

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

    private static List<String> permits(LockInfo in) {
        List<String> out = new ArrayList<>();
        for (LockInfo.Holder h : in.holders()) out.add(h.holder() + "=" + h.token());
        return out;
    }

    private static List<Long> tokens(LockInfo in) {
        List<Long> out = new ArrayList<>();
        for (LockInfo.Holder h : in.holders()) out.add(h.token());
        return out;
    }

    @Test
    void c15PermitsAndFifo() throws Exception {
        try (FencekvClient d = FencekvClient.connect(shared.addr())) {
            long[] t = new long[3];
            for (int i = 0; i < 3; i++) t[i] = client.acquire("c15/L", TEN, AcquireOptions.holder("h" + i).withLimit(3)).token();
            assertTrue(t[0] < t[1] && t[1] < t[2], "tokens rise: " + t[0] + " " + t[1] + " " + t[2]);
            LockInfo in = client.lockInfo("c15/L");
            assertTrue(in.held());
            assertEquals(3, in.limit());
            assertEquals(List.of("h0=" + t[0], "h1=" + t[1], "h2=" + t[2]), permits(in));
            for (LockInfo.Holder h : in.holders()) assertTrue(!h.ttl().isZero() && h.ttl().compareTo(TEN) <= 0, h.toString());
            assertEquals("h2", in.holder());
            assertEquals(t[2], in.token());
            LockHeldException held = assertThrows(LockHeldException.class,
                    () -> d.acquire("c15/L", TEN, AcquireOptions.holder("h3").withLimit(3)));
            assertEquals(t[0], held.token(), "the permit that runs out first");
            assertEquals("h0", held.holder());
            CompletableFuture<Grant> fourth = d.acquireAsync("c15/L", TEN, AcquireOptions.holder("h3").withLimit(3).withWait(TEN));
            waitFor("the fourth queued", () -> client.lockInfo("c15/L").waiters() == 1);
            assertFalse(fourth.isDone());
            client.release("c15/L", t[0]);
            Grant g4 = fourth.get(10, TimeUnit.SECONDS);
            assertTrue(g4.token() > t[2]);
            in = client.lockInfo("c15/L");
            assertEquals(0, in.waiters());
            assertEquals(List.of("h1=" + t[1], "h2=" + t[2], "h3=" + g4.token()), permits(in));
            List<LockInfo> listed = new ArrayList<>();
            for (LockInfo l : client.locks("c15/L", null, 0).items()) if (l.lock().equals("c15/L")) listed.add(l);
            assertEquals(1, listed.size());
            assertEquals(3, listed.get(0).limit());
            assertEquals(List.of(t[1], t[2], g4.token()), tokens(listed.get(0)));
            for (long tok : new long[] {t[1], t[2], g4.token()}) client.release("c15/L", tok);
            in = client.lockInfo("c15/L");
            assertFalse(in.held());
            assertEquals(List.of(), in.holders());
        }
    }

    @Test
    void c15HeldWriteByPermitToken() {
        Grant a = client.acquire("c15/w", TEN, AcquireOptions.limit(2));
        Grant b = client.acquire("c15/w", TEN, AcquireOptions.limit(2));
        client.put("c15/w/k", "a", WriteOptions.token(a.token()).lock("c15/w"));
        client.put("c15/w/k", "b", WriteOptions.token(b.token()).lock("c15/w"));
        client.release("c15/w", b.token());
        NotHolderException e = assertThrows(NotHolderException.class,
                () -> client.put("c15/w/k", "late", WriteOptions.token(b.token()).lock("c15/w")));
        assertEquals(0, e.token());
        Entry got = client.get("c15/w/k");
        assertEquals("b", got.valueString());
        assertEquals(b.token(), got.fence());
        FencekvException r = assertThrows(FencekvException.class, () -> client.renew("c15/w", b.token()));
        assertTrue(r instanceof NotHolderException || r instanceof LeaseExpiredException, r.toString());
        client.renew("c15/w", a.token());
        client.release("c15/w", a.token());
    }

    @Test
    void c15LimitMismatchAndBadLimits() {
        Grant g = client.acquire("c15/m", TEN, AcquireOptions.holder("a").withLimit(3));
        long last = client.status().lastToken();
        Runnable unchanged = () -> {
            LockInfo in = client.lockInfo("c15/m");
            assertEquals(3, in.limit());
            assertEquals(0, in.waiters());
            assertEquals(List.of("a=" + g.token()), permits(in));
            assertEquals(last, client.status().lastToken());
        };
        List<AcquireOptions> others = List.of(AcquireOptions.limit(2), AcquireOptions.limit(4), AcquireOptions.limit(256),
                AcquireOptions.NONE, AcquireOptions.limit(1));
        for (AcquireOptions o : others) {
            LimitMismatchException e = assertThrows(LimitMismatchException.class,
                    () -> client.acquire("c15/m", TEN, o.withHolder("b").withWait(Duration.ofSeconds(1))));
            assertEquals("limit_mismatch", e.code());
            assertInstanceOf(FencekvException.class, e);
            unchanged.run();
        }
        for (int bad : new int[] {0, -1, 257, Integer.MAX_VALUE}) {
            assertThrows(BadRequestException.class, () -> client.acquire("c15/m", TEN, AcquireOptions.holder("b").withLimit(bad)));
            unchanged.run();
        }
        assertThrows(BadRequestException.class,
                () -> client.acquire("c15/m", TEN, AcquireOptions.limit(3).withLockDelay(Duration.ofSeconds(1))));
        unchanged.run();
        client.release("c15/m", g.token());
        // A held plain lock refuses a semaphore acquire; once free, any limit.
        Grant p = client.acquire("c15/m", TEN);
        assertThrows(LimitMismatchException.class, () -> client.acquire("c15/m", TEN, AcquireOptions.limit(3)));
        LockInfo in = client.lockInfo("c15/m");
        assertEquals(1, in.limit());
        assertEquals(List.of(p.token()), tokens(in));
        client.release("c15/m", p.token());
        assertTrue(client.acquire("c15/m", TEN, AcquireOptions.limit(5)).token() > p.token());
        assertEquals(5, client.lockInfo("c15/m").limit());
    }

    @Test
    void c15LockHelperHoldsAPermit() throws Exception {
        Duration ttl = Duration.ofMillis(1000);
        try (FencekvClient d = FencekvClient.connect(shared.addr())) {
            List<Lease> leases = new ArrayList<>();
            for (int i = 0; i < 3; i++) leases.add(client.lock("c15/l", ttl, LockOptions.limit(3)));
            long start = System.nanoTime();
            CompletableFuture<Lease> fourth = CompletableFuture.supplyAsync(
                    () -> d.lock("c15/l", ttl, LockOptions.limit(3).withWait(TEN)));
            waitFor("the fourth queued", () -> client.lockInfo("c15/l").waiters() == 1);
            // Past two TTLs the permits are still theirs: they were renewed.
            waitFor("two TTLs", () -> System.nanoTime() - start > 2 * ttl.toNanos());
            LockInfo in = client.lockInfo("c15/l");
            List<Long> want = new ArrayList<>();
            HashSet<String> names = new HashSet<>();
            for (Lease l : leases) {
                want.add(l.token());
                names.add(l.holder());
            }
            assertEquals(want, tokens(in));
            HashSet<String> got = new HashSet<>();
            for (LockInfo.Holder h : in.holders()) got.add(h.holder());
            assertEquals(names, got);
            for (Lease l : leases) {
                l.check();
                client.put("c15/l/" + l.token(), "v", l);
            }
            assertFalse(fourth.isDone());
            leases.get(0).close();
            try (Lease f = fourth.get(10, TimeUnit.SECONDS)) {
                assertTrue(f.token() > leases.get(2).token());
                d.put("c15/l/f", "v", f);
                for (Lease l : leases.subList(1, 3)) {
                    assertFalse(l.isLost());
                    l.close();
                }
            }
            assertFalse(client.lockInfo("c15/l").held());
        }
    }

    @Test
    void c15LostPermitFound() throws Exception {
        Grant first = client.acquire("c15/f", TEN, AcquireOptions.holder("other-1").withLimit(3));
        try (CutProxy p = new CutProxy(shared.addr());
                FencekvClient c = FencekvClient.builder().addresses(p.addr()).build()) {
            c.ping();
            p.dropAnswers = true; // the acquire reaches the server; its answer never comes back
            CompletableFuture<Lease> lf = CompletableFuture.supplyAsync(() -> c.lock("c15/f", Duration.ofSeconds(5), LockOptions.limit(3)));
            waitFor("our permit on the server", () -> client.lockInfo("c15/f").holders().size() == 2);
            LockInfo.Holder ours = client.lockInfo("c15/f").holders().get(1);
            // Another holder takes a newer permit: ours is not the newest one.
            Grant later = client.acquire("c15/f", TEN, AcquireOptions.holder("other-2").withLimit(3));
            p.dropAnswers = false;
            p.cut(); // the connection breaks with the acquire's answer lost
            try (Lease lease = lf.get(15, TimeUnit.SECONDS)) {
                assertEquals(ours.token(), lease.token(), "the lease is the permit the server granted");
                assertEquals(ours.holder(), lease.holder());
                assertFalse(lease.isLost());
                LockInfo in = client.lockInfo("c15/f");
                assertEquals("other-2", in.holder());
                assertEquals(List.of("other-1=" + first.token(), lease.holder() + "=" + lease.token(), "other-2=" + later.token()),
                        permits(in));
                assertEquals(later.token(), client.status().lastToken(), "no second permit for us");
                c.put("c15/f/k", "v", lease);
            }
            assertEquals(List.of(first.token(), later.token()), tokens(client.lockInfo("c15/f")));
        }
    }
}
