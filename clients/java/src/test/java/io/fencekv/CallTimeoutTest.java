package io.fencekv;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.junit.jupiter.api.Test;

/** The call timeout (one sweep for every call in flight, not a timer task per call). */
class CallTimeoutTest {
    @Test
    void eachCallTimesOutAtItsOwnDeadline() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                CutProxy p = new CutProxy(s.addr());
                FencekvClient c = FencekvClient.builder().addresses(p.addr()).callTimeout(Duration.ofMillis(300)).build()) {
            assertTrue(c.put("t/k", "v0").revision() > 0);
            p.dropAnswers = true; // the server answers; nothing comes back
            // A call with a long timeout first (300 ms + its 3 s wait), then short ones: each still times out at its own deadline.
            CompletableFuture<Grant> longCall = c.acquireAsync("t/L", Duration.ofSeconds(10), AcquireOptions.waitFor(Duration.ofSeconds(3)));
            long t0 = System.nanoTime();
            ConnectionException get = assertThrows(ConnectionException.class, () -> c.get("t/k"));
            long took = (System.nanoTime() - t0) / 1_000_000;
            assertTrue(took >= 290 && took < 2000, "the get timed out after " + took + " ms, its timeout 300 ms");
            assertFalse(get.outcomeUnknown(), "a read: " + get);
            assertTrue(get.getMessage().contains("no answer within 300 ms"), get.getMessage());
            ConnectionException put = assertThrows(ConnectionException.class, () -> c.put("t/k", "v1"));
            assertTrue(put.outcomeUnknown(), "a write may have been applied: " + put);
            assertFalse(longCall.isDone(), "the long call timed out with the short ones");
            ExecutionException e = assertThrows(ExecutionException.class, () -> longCall.get(30, TimeUnit.SECONDS));
            assertTrue(e.getCause() instanceof ConnectionException, "got " + e.getCause());
            long all = (System.nanoTime() - t0) / 1_000_000;
            assertTrue(all >= 3_000, "the long call timed out after " + all + " ms, its timeout 3.3 s");
        }
    }
}
