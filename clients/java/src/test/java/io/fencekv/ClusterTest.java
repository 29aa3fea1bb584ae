package io.fencekv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import org.junit.jupiter.api.Test;

/** C08 against a real three-node cluster. */
class ClusterTest {
    @Test
    void c08LeaderKillUnderHeldWrites() throws Exception {
        try (Servers.Cluster cl = new Servers.Cluster()) {
            int leader = cl.leader(Duration.ofSeconds(60));
            List<String> acked = new ArrayList<>();
            List<String> unknown = new ArrayList<>();
            long lastToken = 0;
            try (FencekvClient c = FencekvClient.builder().addresses(cl.addrs()).connectTimeout(Duration.ofMillis(500))
                    .callTimeout(Duration.ofSeconds(8)).build()) {
                Lease lease = c.lock("c08/L", Duration.ofSeconds(6), LockOptions.waitFor(Duration.ofSeconds(10)));
                lastToken = lease.token();
                long killedAt = 0;
                int afterKill = 0;
                for (int i = 0; afterKill < 20 && i < 2000; i++) {
                    if (i == 20) {
                        cl.nodes[leader].kill9();
                        killedAt = System.nanoTime();
                    }
                    String k = "c08/k" + i;
                    try {
                        if (lease.isLost()) {
                            lease.close();
                            lease = c.lock("c08/L", Duration.ofSeconds(6), LockOptions.waitFor(Duration.ofSeconds(15)));
                            assertTrue(lease.token() > lastToken, "tokens only rise: " + lease.token() + " after " + lastToken);
                            lastToken = lease.token();
                        }
                        WriteResult w = c.put(k, Integer.toString(i), lease);
                        assertEquals(lease.token(), w.fence());
                        acked.add(k);
                        if (killedAt != 0) afterKill++;
                    } catch (UnavailableException e) {
                        if (e.outcomeUnknown()) unknown.add(k); // reported as such, not retried silently
                    } catch (LeaseLostException | NotHolderException | LeaseExpiredException | LockHeldException e) {
                        // the lease is lost: acquired again above
                    }
                    assertTrue(System.nanoTime() - (killedAt == 0 ? System.nanoTime() : killedAt) < 60_000_000_000L, "stuck after the kill");
                }
                assertEquals(20, afterKill, "held writes acknowledged after the leader was killed");
                lease.close();
                for (String k : acked) {
                    Entry e = c.get(k);
                    assertTrue(e.found(), "acknowledged write " + k + " is readable");
                    assertEquals(k.substring("c08/k".length()), e.valueString());
                }
                for (String k : unknown) {
                    Entry e = c.get(k); // either outcome is allowed; it must not be an error to read
                    assertTrue(!e.found() || e.fence() > 0);
                }
            }
        }
    }
}
