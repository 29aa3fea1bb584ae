package io.fencekv;

import java.io.File;
import java.io.IOException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.function.BooleanSupplier;
import java.util.stream.Stream;

/** Real fencekv servers for the tests: built from the tree (or $FENCEKV_BIN), on free loopback ports, stopped by PID. */
final class Servers {
    private static Path bin;

    private Servers() {}

    static synchronized Path binary() throws IOException, InterruptedException {
        if (bin != null) return bin;
        String env = System.getenv("FENCEKV_BIN");
        if (env != null && !env.isEmpty()) {
            bin = Paths.get(env).toAbsolutePath();
            return bin;
        }
        Path root = Paths.get("").toAbsolutePath().getParent().getParent(); // clients/java -> repo root
        Path out = Files.createTempDirectory("fencekv-bin").resolve("fencekv");
        Process p = new ProcessBuilder("go", "build", "-o", out.toString(), "./cmd/fencekv")
                .directory(root.toFile()).inheritIO().start();
        if (p.waitFor() != 0) throw new IOException("go build ./cmd/fencekv failed in " + root);
        bin = out;
        return bin;
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            return s.getLocalPort();
        }
    }

    static void waitFor(Duration within, String what, BooleanSupplier cond) {
        long end = System.nanoTime() + within.toNanos();
        while (!cond.getAsBoolean()) {
            if (System.nanoTime() - end > 0) throw new AssertionError("timed out after " + within + " waiting for " + what);
            try {
                Thread.sleep(10);
            } catch (InterruptedException e) {
                throw new AssertionError(e);
            }
        }
    }

    static void deleteTree(Path dir) {
        if (dir == null || !Files.exists(dir)) return;
        try (Stream<Path> s = Files.walk(dir)) {
            s.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
        } catch (IOException ignored) {
            // a temp dir
        }
    }

    static void signal(long pid, String sig) throws IOException, InterruptedException {
        Process p = new ProcessBuilder("kill", "-" + sig, Long.toString(pid)).inheritIO().start();
        if (p.waitFor() != 0) throw new IOException("kill -" + sig + " " + pid + " failed");
    }

    /** One fencekv serve process. */
    static final class Server implements AutoCloseable {
        final Path data;
        final int port;
        final List<String> extra;
        final Path log;
        Process proc;

        Server(Path data, int port, List<String> extra) throws IOException {
            this.data = data;
            this.port = port;
            this.extra = extra;
            this.log = data.resolveSibling(data.getFileName() + ".log");
        }

        /** A single node on a fresh temp dir and a free port. */
        static Server launch(String... extra) throws Exception {
            Path dir = Files.createTempDirectory("fencekv-java");
            Server s = new Server(dir.resolve("data"), freePort(), List.of(extra));
            s.start();
            return s;
        }

        String addr() {
            return "127.0.0.1:" + port;
        }

        long pid() {
            return proc.pid();
        }

        void start() throws Exception {
            List<String> cmd = new ArrayList<>(List.of(binary().toString(), "serve", "--data", data.toString(),
                    "--listen", addr(), "--http", ""));
            cmd.addAll(extra);
            proc = new ProcessBuilder(cmd).redirectErrorStream(true)
                    .redirectOutput(ProcessBuilder.Redirect.appendTo(log.toFile())).start();
            waitFor(Duration.ofSeconds(20), "the server on " + addr(), () -> {
                if (!proc.isAlive()) throw new AssertionError("fencekv serve exited: " + tail());
                try (java.net.Socket so = new java.net.Socket("127.0.0.1", port)) {
                    return true;
                } catch (IOException e) {
                    return false;
                }
            });
        }

        String tail() {
            try {
                String s = Files.readString(log);
                return s.length() > 4000 ? s.substring(s.length() - 4000) : s;
            } catch (IOException e) {
                return "(no log)";
            }
        }

        void kill9() throws Exception {
            signal(pid(), "KILL");
            proc.waitFor();
        }

        void stop() throws InterruptedException {
            if (proc != null && proc.isAlive()) {
                proc.destroy(); // SIGTERM
                if (!proc.waitFor(15, java.util.concurrent.TimeUnit.SECONDS)) {
                    proc.destroyForcibly();
                    proc.waitFor();
                }
            }
        }

        @Override
        public void close() throws Exception {
            try {
                signal(pid(), "CONT"); // in case a test left it stopped
            } catch (IOException ignored) {
                // it exited
            }
            stop();
            deleteTree(data.getParent());
        }
    }

    /** A three-node cluster on loopback (as cluster/run.sh, on free ports). */
    static final class Cluster implements AutoCloseable {
        final Server[] nodes = new Server[3];
        final Path dir;

        Cluster() throws Exception {
            dir = Files.createTempDirectory("fencekv-cluster");
            int[] gossip = new int[3];
            int[] raft = new int[3];
            int[] client = new int[3];
            for (int i = 0; i < 3; i++) {
                gossip[i] = freePort();
                raft[i] = freePort();
                client[i] = freePort();
            }
            String join = "127.0.0.1:" + gossip[0] + ",127.0.0.1:" + gossip[1] + ",127.0.0.1:" + gossip[2];
            for (int i = 0; i < 3; i++) {
                nodes[i] = new Server(dir.resolve("n" + i), client[i], List.of("--node", "n" + i,
                        "--raft", "127.0.0.1:" + raft[i], "--gossip", "127.0.0.1:" + gossip[i],
                        "--bootstrap-expect", "3", "--join", join));
            }
            for (Server n : nodes) {
                List<String> cmd = new ArrayList<>(List.of(binary().toString(), "serve", "--data", n.data.toString(),
                        "--listen", n.addr(), "--http", ""));
                cmd.addAll(n.extra);
                n.proc = new ProcessBuilder(cmd).redirectErrorStream(true)
                        .redirectOutput(ProcessBuilder.Redirect.appendTo(n.log.toFile())).start();
            }
        }

        String[] addrs() {
            String[] a = new String[3];
            for (int i = 0; i < 3; i++) a[i] = nodes[i].addr();
            return a;
        }

        /** The index of the node that leads, as every live node's status says, waiting for one. */
        int leader(Duration within) {
            int[] found = {-1};
            waitFor(within, "a leader", () -> {
                for (int i = 0; i < 3; i++) {
                    if (!nodes[i].proc.isAlive()) continue;
                    try (FencekvClient c = FencekvClient.builder().addresses(nodes[i].addr())
                            .connectTimeout(Duration.ofMillis(500)).callTimeout(Duration.ofSeconds(1)).build()) {
                        if ("leader".equals(c.status().role())) {
                            found[0] = i;
                            return true;
                        }
                    } catch (RuntimeException e) {
                        // not up yet
                    }
                }
                return false;
            });
            return found[0];
        }

        @Override
        public void close() throws Exception {
            for (Server n : nodes) {
                if (n != null && n.proc != null) n.stop();
            }
            deleteTree(dir);
        }
    }
}
