package io.fencekv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import org.junit.jupiter.api.Test;

/**
 * Issue #35: a blocking caller reads its own answer when no one else is
 * reading, and hands the reading on (Link's class comment).
 */
class HandOverTest {
    /** A blocking acquire of lock (held elsewhere) that the server answers after waitMs, with its own call timeout. */
    private static Map<String, Object> waitingAcquire(FencekvClient c, String lock, long waitMs, long timeoutMs) {
        return FencekvClient.sync(() -> c.callAsync("acquire",
                FencekvClient.params("lock", lock, "ttl_ms", 10_000L, "wait_ms", waitMs), timeoutMs));
    }

    /** Starts a thread running r, recording what it threw. */
    private static Thread start(String name, ConcurrentLinkedQueue<Throwable> errs, Runnable r) {
        Thread t = new Thread(() -> {
            try {
                r.run();
            } catch (Throwable e) {
                errs.add(e);
            }
        }, name);
        t.setDaemon(true);
        t.start();
        return t;
    }

    private static void joinAll(List<Thread> ts, ConcurrentLinkedQueue<Throwable> errs) throws Exception {
        for (Thread t : ts) {
            t.join(60_000);
            assertFalse(t.isAlive(), t.getName() + " still running");
        }
        if (!errs.isEmpty()) throw new AssertionError("a thread failed: " + errs.peek(), errs.peek());
    }

    @Test
    void aLoneBlockingCallerReadsItsOwnAnswers() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.connect(s.addr())) {
            c.put("h/k", "v");
            Link l = c.current();
            long before = l.threadReads();
            for (int i = 0; i < 200; i++) assertEquals("v", c.get("h/k").valueString());
            // (It may read a few: the first call after 1 ms idle, the connection watched meanwhile.)
            assertTrue(l.threadReads() - before < 100, "the reader thread read " + (l.threadReads() - before)
                    + " of 200 answers of a lone blocking caller");
            // An async call with no blocked caller is read by the reader thread.
            assertEquals("v", c.getAsync(Codec.bytes("h/k")).get(10, TimeUnit.SECONDS).valueString());
            assertTrue(l.threadReads() > before, "no one read the async call's answer but the reader thread");
        }
    }

    @Test
    void manyThreadsWithRandomTimeoutsEachGetTheirOwnAnswers() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient holder = FencekvClient.connect(s.addr());
                FencekvClient c = FencekvClient.connect(s.addr())) {
            holder.acquire("h/held", Duration.ofSeconds(60));
            ConcurrentLinkedQueue<Throwable> errs = new ConcurrentLinkedQueue<>();
            AtomicInteger timedOut = new AtomicInteger(), answered = new AtomicInteger();
            List<Thread> ts = new ArrayList<>();
            for (int t = 0; t < 8; t++) {
                int me = t;
                ts.add(start("caller-" + t, errs, () -> {
                    ThreadLocalRandom r = ThreadLocalRandom.current();
                    for (int i = 0; i < 60; i++) {
                        String key = "h/t" + me + "/" + (i % 5);
                        String val = me + ":" + i;
                        if (r.nextInt(4) == 0) {
                            // A call the server answers (lock_held) after wait ms, with a timeout either side of it.
                            long wait = 20 + r.nextInt(60), timeout = 10 + r.nextInt(120);
                            long t0 = System.nanoTime();
                            try {
                                waitingAcquire(c, "h/held", wait, timeout);
                                throw new AssertionError("acquired a held lock");
                            } catch (LockHeldException e) {
                                answered.incrementAndGet();
                            } catch (ConnectionException e) {
                                assertTrue(e.getMessage().contains("no answer within " + timeout + " ms"), e.getMessage());
                                long took = (System.nanoTime() - t0) / 1_000_000;
                                assertTrue(took >= timeout - 1, "timed out after " + took + " ms, its timeout " + timeout);
                                timedOut.incrementAndGet();
                            }
                        }
                        c.put(key, val);
                        assertEquals(val, c.get(key).valueString(), "thread " + me + " got another's answer");
                    }
                }));
            }
            joinAll(ts, errs);
            assertTrue(timedOut.get() > 0 && answered.get() > 0, "timed out " + timedOut + ", answered " + answered);
            assertEquals("7:59", c.get("h/t7/4").valueString());
            assertTrue(c.current().idle(), "calls left waiting");
        }
    }

    @Test
    void aReaderWhoseCallTimesOutHandsTheReadingOn() throws Exception {
        long idle = Link.watchIdleNs;
        Link.watchIdleNs = Long.MAX_VALUE; // the reader thread does not watch the idle connection: the caller reads
        try {
            try (Servers.Server s = Servers.Server.launch();
                    FencekvClient holder = FencekvClient.connect(s.addr());
                    FencekvClient c = FencekvClient.connect(s.addr())) {
                holder.acquire("h/held", Duration.ofSeconds(60));
                c.put("h/k", "v");
                ConcurrentLinkedQueue<Throwable> errs = new ConcurrentLinkedQueue<>();
                long[] tookA = new long[1];
                Thread a = start("reader", errs, () -> {
                    long t0 = System.nanoTime();
                    ConnectionException e = assertThrows(ConnectionException.class, () -> waitingAcquire(c, "h/held", 3_000, 300));
                    tookA[0] = (System.nanoTime() - t0) / 1_000_000;
                    assertTrue(e.getMessage().contains("no answer within 300 ms"), e.getMessage());
                    assertTrue(e.outcomeUnknown(), "an acquire may have been applied");
                });
                Link l = c.current();
                Servers.waitFor(Duration.ofSeconds(5), "the caller to read", () -> l.readingThread() == a);
                // Blocked behind the reader: a call answered while it reads, and one answered after it left.
                List<Thread> ts = new ArrayList<>();
                ts.add(start("get", errs, () -> assertEquals("v", c.get("h/k").valueString())));
                long[] tookB = new long[1];
                ts.add(start("late", errs, () -> {
                    long t0 = System.nanoTime();
                    assertThrows(LockHeldException.class, () -> waitingAcquire(c, "h/held", 800, 10_000));
                    tookB[0] = (System.nanoTime() - t0) / 1_000_000;
                }));
                ts.add(a);
                joinAll(ts, errs);
                assertTrue(tookA[0] >= 299 && tookA[0] < 2_500, "the reader's call timed out after " + tookA[0] + " ms");
                assertTrue(tookB[0] >= 790, "the late call was answered after " + tookB[0] + " ms, its wait 800 ms");
                assertEquals("v", c.get("h/k").valueString());
            }
        } finally {
            Link.watchIdleNs = idle;
        }
    }

    @Test
    void asyncCallsWhileABlockingCallerReads() throws Exception {
        long idle = Link.watchIdleNs;
        Link.watchIdleNs = Long.MAX_VALUE; // the reader thread does not watch the idle connection: the caller reads
        try {
            try (Servers.Server s = Servers.Server.launch();
                    FencekvClient holder = FencekvClient.connect(s.addr());
                    FencekvClient c = FencekvClient.connect(s.addr())) {
                holder.acquire("h/held", Duration.ofSeconds(60));
                c.put("h/k", "v");
                c.put("h/k2", "w");
                ConcurrentLinkedQueue<Throwable> errs = new ConcurrentLinkedQueue<>();
                Thread a = start("reader", errs, () -> assertThrows(LockHeldException.class, () -> waitingAcquire(c, "h/held", 2_000, 10_000)));
                Link l = c.current();
                Servers.waitFor(Duration.ofSeconds(5), "the caller to read", () -> l.readingThread() == a);
                List<CompletableFuture<Entry>> fs = new ArrayList<>();
                for (int i = 0; i < 20; i++) fs.add(c.getAsync(Codec.bytes("h/k")));
                // A callback that makes a blocking call, on the thread that completes the future (the reader).
                CompletableFuture<String> nested = c.getAsync(Codec.bytes("h/k")).thenApply(e -> e.valueString() + c.get("h/k2").valueString());
                for (CompletableFuture<Entry> f : fs) assertEquals("v", f.get(1_500, TimeUnit.MILLISECONDS).valueString());
                assertEquals("vw", nested.get(1_500, TimeUnit.MILLISECONDS));
                assertTrue(a.isAlive(), "the reader's own call is still waiting");
                joinAll(List.of(a), errs);
                // An async call whose callback blocks, read by the reader thread (no blocked caller).
                assertEquals("vw", c.getAsync(Codec.bytes("h/k")).thenApply(e -> e.valueString() + c.get("h/k2").valueString()).get(5, TimeUnit.SECONDS));
            }
        } finally {
            Link.watchIdleNs = idle;
        }
    }

    @Test
    void brokenWhileACallerReads() throws Exception {
        long idle = Link.watchIdleNs;
        Link.watchIdleNs = Long.MAX_VALUE; // the reader thread does not watch the idle connection: the caller reads
        try {
            try (Servers.Server s = Servers.Server.launch();
                    CutProxy p = new CutProxy(s.addr());
                    FencekvClient c = FencekvClient.builder().addresses(p.addr()).backoff(Duration.ofMillis(10), Duration.ofMillis(50)).build()) {
                c.put("h/k", "v0");
                p.dropAnswers = true; // the server answers; nothing comes back
                ConcurrentLinkedQueue<Throwable> errs = new ConcurrentLinkedQueue<>();
                ConnectionException[] got = new ConnectionException[2];
                Thread w = start("writer", errs, () -> got[0] = assertThrows(ConnectionException.class, () -> c.put("h/k", "v1")));
                Link l = c.current();
                Servers.waitFor(Duration.ofSeconds(5), "the writer to read", () -> l.readingThread() == w);
                Thread r = start("getter", errs, () -> got[1] = assertThrows(ConnectionException.class, () -> c.get("h/k")));
                CompletableFuture<WriteResult> async = c.putAsync(Codec.bytes("h/k"), Codec.bytes("v2"), WriteOptions.NONE);
                Servers.waitFor(Duration.ofSeconds(5), "the calls to be sent", () -> r.getState() == Thread.State.WAITING
                        || r.getState() == Thread.State.TIMED_WAITING);
                p.cut();
                joinAll(List.of(w, r), errs);
                assertTrue(got[0].outcomeUnknown(), "the reader's write may have been applied: " + got[0]);
                assertFalse(got[1].outcomeUnknown(), "a read: " + got[1]);
                ExecutionException e = assertThrows(ExecutionException.class, () -> async.get(10, TimeUnit.SECONDS));
                assertInstanceOf(ConnectionException.class, e.getCause());
                assertTrue(((ConnectionException) e.getCause()).outcomeUnknown(), "an async write: " + e.getCause());
                p.dropAnswers = false;
                Servers.waitFor(Duration.ofSeconds(5), "a new connection", () -> {
                    try {
                        return c.get("h/k").found();
                    } catch (ConnectionException x) {
                        return false;
                    }
                });
            }
        } finally {
            Link.watchIdleNs = idle;
        }
    }

    @Test
    void callersPausingOftenKeepTheStreamWhole() throws Exception {
        // Pauses of 2 ms let the reader thread take the read side to watch the
        // idle connection while other callers' answers are on their way.
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.connect(s.addr())) {
            for (int t = 0; t < 16; t++) c.put("h/p" + t, "v" + t);
            ConcurrentLinkedQueue<Throwable> errs = new ConcurrentLinkedQueue<>();
            long end = System.nanoTime() + TimeUnit.SECONDS.toNanos(4);
            AtomicInteger calls = new AtomicInteger();
            List<Thread> ts = new ArrayList<>();
            for (int t = 0; t < 16; t++) {
                String key = "h/p" + t, want = "v" + t;
                ts.add(start("pauser-" + t, errs, () -> {
                    ThreadLocalRandom r = ThreadLocalRandom.current();
                    while (System.nanoTime() - end < 0 && errs.isEmpty()) {
                        assertEquals(want, c.get(key).valueString());
                        calls.incrementAndGet();
                        if (r.nextInt(10) == 0) {
                            try {
                                Thread.sleep(2);
                            } catch (InterruptedException e) {
                                throw new AssertionError(e);
                            }
                        }
                    }
                }));
            }
            joinAll(ts, errs);
            assertTrue(calls.get() > 1000, "only " + calls + " calls");
        }
    }

    @Test
    void answersNoOneReadSurviveProbesOfTheIdleConnection() throws Exception {
        // Interrupted callers leave their answers unread (or read by the
        // reader thread watching the idle connection); the connection must
        // survive them (on a SocketChannel an interrupted write closed it), and
        // the later calls get their own answers.
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient c = FencekvClient.connect(s.addr())) {
            c.put("h/k", "v");
            for (int i = 0; i < 3; i++) {
                Thread.currentThread().interrupt();
                try {
                    assertEquals("v", c.get("h/k").valueString()); // answered before the interrupt was looked at
                } catch (FencekvException e) {
                    assertEquals("interrupted", e.code(), e.toString());
                }
                assertTrue(Thread.interrupted(), "the interrupt is kept"); // (and cleared here)
                Thread.sleep(5); // the answer arrives, unread; the next send comes after 1 ms idle
            }
            for (int i = 0; i < 20; i++) assertEquals("v", c.get("h/k").valueString());
        }
    }
}
