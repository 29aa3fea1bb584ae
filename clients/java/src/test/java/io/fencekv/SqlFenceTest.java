package io.fencekv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;

import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/** SqlFence.check against a real PostgreSQL the test starts (initdb + postgres in a temp dir); skipped without one. */
class SqlFenceTest {
    static Process pg;
    static Path dir;
    static int port;

    static Path pgBin() {
        Path base = Path.of("/usr/lib/postgresql");
        if (!Files.isDirectory(base)) return null;
        try (var s = Files.list(base)) {
            return s.map(p -> p.resolve("bin")).filter(p -> Files.isExecutable(p.resolve("initdb")))
                    .sorted().reduce((a, b) -> b).orElse(null);
        } catch (Exception e) {
            return null;
        }
    }

    static List<String> asUser(String... cmd) {
        List<String> l = new ArrayList<>();
        if ("root".equals(System.getProperty("user.name"))) {
            l.addAll(List.of("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"));
        }
        l.addAll(List.of(cmd));
        return l;
    }

    @BeforeAll
    static void up() throws Exception {
        Path bin = pgBin();
        assumeTrue(bin != null, "no PostgreSQL server installed (apt-get install postgresql)");
        dir = Files.createTempDirectory("fencekv-pg");
        Path data = dir.resolve("data");
        if ("root".equals(System.getProperty("user.name"))) {
            new ProcessBuilder("chown", "-R", "65534:65534", dir.toString()).inheritIO().start().waitFor();
        }
        Process init = new ProcessBuilder(asUser(bin.resolve("initdb").toString(), "-D", data.toString(), "-U", "postgres",
                "--auth=trust", "-E", "UTF8", "--no-sync")).redirectErrorStream(true)
                .redirectOutput(dir.resolve("initdb.log").toFile()).start();
        assertEquals(0, init.waitFor(), "initdb: " + Files.readString(dir.resolve("initdb.log")));
        port = Servers.freePort();
        pg = new ProcessBuilder(asUser(bin.resolve("postgres").toString(), "-D", data.toString(), "-p", Integer.toString(port),
                "-h", "127.0.0.1", "-k", dir.toString(), "-F")).redirectErrorStream(true)
                .redirectOutput(dir.resolve("postgres.log").toFile()).start();
        Servers.waitFor(Duration.ofSeconds(30), "PostgreSQL on " + port, () -> {
            try (Connection c = connect()) {
                return true;
            } catch (Exception e) {
                return false;
            }
        });
        try (Connection c = connect()) {
            SqlFence.install(c);
            SqlFence.install(c); // idempotent
            try (Statement st = c.createStatement()) {
                st.execute("CREATE TABLE stock (sku text PRIMARY KEY, n int)");
            }
        }
    }

    static Connection connect() throws Exception {
        return DriverManager.getConnection("jdbc:postgresql://127.0.0.1:" + port + "/postgres", "postgres", "");
    }

    @AfterAll
    static void down() throws Exception {
        if (pg != null) {
            pg.destroy(); // SIGTERM to its PID: smart shutdown
            pg.waitFor();
        }
        Servers.deleteTree(dir);
    }

    @Test
    void staleTokenRefusedAndRolledBack() throws Exception {
        try (Connection c = connect()) {
            c.setAutoCommit(false);
            SqlFence.check(c, "inventory", 10);
            try (Statement st = c.createStatement()) {
                st.execute("INSERT INTO stock VALUES ('sku-1', 42)");
            }
            c.commit();
            SqlFence.check(c, "inventory", 10); // the same holder again
            c.commit();
            StaleTokenException e = assertThrows(StaleTokenException.class, () -> SqlFence.check(c, "inventory", 9));
            assertEquals(10, e.fence());
            c.rollback();
            SqlFence.check(c, "inventory", 11);
            c.commit();
            try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT token FROM fencekv_fences WHERE resource = 'inventory'")) {
                rs.next();
                assertEquals(11, rs.getLong(1));
            }
        }
    }

    @Test
    void autocommitRefused() throws Exception {
        try (Connection c = connect()) {
            c.setAutoCommit(true);
            assertThrows(IllegalStateException.class, () -> SqlFence.check(c, "inventory", 100));
            c.setAutoCommit(false);
            assertThrows(BadRequestException.class, () -> SqlFence.check(c, "", 1));
            assertThrows(BadRequestException.class, () -> SqlFence.check(c, "r", 0));
        }
    }

    @Test
    void withARealLease() throws Exception {
        try (Servers.Server s = Servers.Server.launch();
                FencekvClient client = FencekvClient.connect(s.addr());
                Connection c = connect()) {
            c.setAutoCommit(false);
            long first;
            try (Lease lease = client.lock("orders", Duration.ofSeconds(5))) {
                first = lease.token();
                SqlFence.check(c, "orders", lease.token());
                c.commit();
            }
            try (Lease lease = client.lock("orders", Duration.ofSeconds(5))) {
                SqlFence.check(c, "orders", lease.token());
                c.commit();
            }
            assertEquals(first + 1, assertThrows(StaleTokenException.class, () -> SqlFence.check(c, "orders", first)).fence());
            c.rollback();
        }
    }
}
