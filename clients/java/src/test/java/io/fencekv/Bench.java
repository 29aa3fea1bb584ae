package io.fencekv;

import java.io.IOException;
import java.net.ServerSocket;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicLong;

import redis.clients.jedis.ConnectionPoolConfig;
import redis.clients.jedis.RedisClient;
import redis.clients.jedis.params.SetParams;

/**
 * Per-call cost of this client beside Jedis, on this machine (bench.sh; not a test).
 *
 * <pre>java ... io.fencekv.Bench [seconds per case, default 1] [rounds, default 3]</pre>
 *
 * Starts {@code fencekv serve} ($FENCEKV_BIN) and redis-server ($REDIS_SERVER, else
 * /usr/bin/redis-server or the one on PATH; skipped if missing) with
 * {@code --appendonly yes --appendfsync always} (every write synced before
 * the answer, as fencekv's are), each on a free loopback port with a temp dir,
 * and stops them by PID. Cases, 100-byte values, 1 and 16 caller threads
 * sharing one fencekv client (pipelined on one connection) and one Jedis
 * RedisClient (a pool of 16 connections): get / GET; put (durable) / SET;
 * fenced put (a token) / EVALSHA of the same fence rule (HGET fence, compare,
 * HSET); acquire + release / SET NX PX + EVALSHA compare-and-delete. Every
 * case runs once per round, so the ratios compare runs made close together;
 * the table gives medians over the rounds (client cpu: this JVM's CPU time per call), the ratio the median of the
 * rounds' ratios of mean µs per call.
 */
public final class Bench {
    interface Op {
        void call(int thread, long i) throws Exception;
    }

    record Result(double rate, double us, double cpuUs) {}

    static final byte[] VALUE = new byte[100];

    static {
        Arrays.fill(VALUE, (byte) 'x');
    }

    static int freePort() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, java.net.InetAddress.getLoopbackAddress())) {
            return s.getLocalPort();
        }
    }

    static Process start(List<String> cmd, Path log, int port) throws Exception {
        Process p = new ProcessBuilder(cmd).redirectErrorStream(true).redirectOutput(log.toFile()).start();
        long end = System.nanoTime() + Duration.ofSeconds(20).toNanos();
        while (true) {
            if (!p.isAlive()) throw new IllegalStateException(cmd.get(0) + " exited: " + Files.readString(log));
            try (Socket s = new Socket("127.0.0.1", port)) {
                return p;
            } catch (IOException e) {
                if (System.nanoTime() - end > 0) throw new IllegalStateException(cmd.get(0) + " did not listen on " + port);
                Thread.sleep(20); // polling for the port, with a deadline
            }
        }
    }

    /** Calls op from n threads for secs; calls per second and mean µs per call. */
    static Result run(int n, double secs, Op op) throws Exception {
        AtomicLong count = new AtomicLong();
        AtomicLong busyNanos = new AtomicLong();
        CountDownLatch go = new CountDownLatch(1);
        Throwable[] err = new Throwable[1];
        List<Thread> ts = new ArrayList<>();
        long[] until = new long[1];
        for (int t = 0; t < n; t++) {
            int th = t;
            Thread x = new Thread(() -> {
                try {
                    go.await();
                    long i = (long) th * 10_000_000L, c = 0, t0 = System.nanoTime(), now = t0;
                    while (now - until[0] < 0) {
                        for (int k = 0; k < 20; k++) op.call(th, i++);
                        c += 20;
                        now = System.nanoTime();
                    }
                    count.addAndGet(c);
                    busyNanos.addAndGet(now - t0);
                } catch (Throwable e) {
                    err[0] = e;
                }
            });
            x.start();
            ts.add(x);
        }
        com.sun.management.OperatingSystemMXBean os =
                (com.sun.management.OperatingSystemMXBean) java.lang.management.ManagementFactory.getOperatingSystemMXBean();
        long cpu0 = os.getProcessCpuTime();
        long t0 = System.nanoTime();
        until[0] = t0 + (long) (secs * 1e9);
        go.countDown();
        for (Thread x : ts) x.join();
        double el = (System.nanoTime() - t0) / 1e9;
        if (err[0] != null) throw new IllegalStateException("case failed", err[0]);
        double cpu = (os.getProcessCpuTime() - cpu0) / 1e3 / count.get();
        return new Result(count.get() / el, busyNanos.get() / 1e3 / count.get(), cpu);
    }

    static double median(List<Double> xs) {
        List<Double> s = new ArrayList<>(xs);
        s.sort(null);
        return s.get(s.size() / 2);
    }

    public static void main(String[] args) throws Exception {
        double secs = args.length > 0 ? Double.parseDouble(args[0]) : 1;
        int rounds = args.length > 1 ? Integer.parseInt(args[1]) : 3;
        String bin = System.getenv("FENCEKV_BIN");
        if (bin == null || bin.isEmpty()) throw new IllegalStateException("set FENCEKV_BIN to a fencekv binary (bench.sh builds one)");
        String redisBin = System.getenv("REDIS_SERVER");
        if (redisBin == null || redisBin.isEmpty()) {
            redisBin = Files.isExecutable(Paths.get("/usr/bin/redis-server")) ? "/usr/bin/redis-server" : null;
            if (redisBin == null) {
                for (String d : System.getenv().getOrDefault("PATH", "").split(":")) {
                    if (Files.isExecutable(Paths.get(d, "redis-server"))) redisBin = Paths.get(d, "redis-server").toString();
                }
            }
        }
        Path tmp = Files.createTempDirectory("fencekv-java-bench");
        List<Process> procs = new ArrayList<>();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            for (Process p : procs) p.destroy(); // SIGTERM by PID
            for (Process p : procs) {
                try {
                    p.waitFor();
                } catch (InterruptedException ignored) {
                    // exiting
                }
            }
            Servers.deleteTree(tmp);
        }));
        int fport = freePort();
        procs.add(start(List.of(bin, "serve", "--data", tmp.resolve("data").toString(), "--listen", "127.0.0.1:" + fport, "--http", ""),
                tmp.resolve("fencekv.log"), fport));
        FencekvClient c = FencekvClient.connect("127.0.0.1:" + fport);
        c.put(Codec.bytes("bench/get"), VALUE, WriteOptions.NONE);
        long token = c.acquire("bench/fence", Duration.ofHours(1)).token();
        Duration ttl = Duration.ofSeconds(60);

        Map<String, Op[]> cases = new LinkedHashMap<>(); // op -> {fencekv, jedis}
        cases.put("get", new Op[] {(t, i) -> c.get(Codec.bytes("bench/get")), null});
        cases.put("put (durable)", new Op[] {(t, i) -> c.put(Codec.bytes("bench/p" + (i % 1000)), VALUE, WriteOptions.NONE), null});
        cases.put("fenced put", new Op[] {(t, i) -> c.put(Codec.bytes("bench/f" + (i % 1000)), VALUE, WriteOptions.token(token)), null});
        cases.put("acquire+release", new Op[] {(t, i) -> {
            String lock = "bench/L" + t;
            Grant g = c.acquire(lock, ttl);
            c.release(lock, g.token());
        }, null});

        RedisClient r = null;
        if (redisBin == null) {
            System.out.println("redis-server missing: no comparison (install with apt-get install redis-server)");
        } else {
            int rport = freePort();
            procs.add(start(List.of(redisBin, "--port", Integer.toString(rport), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "yes", "--appendfsync", "always", "--dir", tmp.toString()), tmp.resolve("redis.log"), rport));
            ConnectionPoolConfig pc = new ConnectionPoolConfig();
            pc.setMaxTotal(16);
            pc.setMaxIdle(16);
            pc.setMinIdle(16);
            r = RedisClient.builder().hostAndPort("127.0.0.1", rport).poolConfig(pc).build();
            RedisClient rr = r;
            byte[] rkey = "bench/get".getBytes(StandardCharsets.UTF_8);
            rr.set(rkey, VALUE);
            String fence = rr.scriptLoad("local f = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')\n"
                    + "if tonumber(ARGV[1]) < f then return redis.error_reply('stale_token') end\n"
                    + "redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2]) return f");
            String unlock = rr.scriptLoad("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0");
            String tok = Long.toString(token);
            byte[] fenceSha = fence.getBytes(StandardCharsets.UTF_8);
            byte[] tokB = tok.getBytes(StandardCharsets.UTF_8);
            SetParams nx = SetParams.setParams().nx().px(ttl.toMillis());
            cases.get("get")[1] = (t, i) -> rr.get(rkey);
            cases.get("put (durable)")[1] = (t, i) -> rr.set(("bench/p" + (i % 1000)).getBytes(StandardCharsets.UTF_8), VALUE);
            cases.get("fenced put")[1] = (t, i) -> rr.evalsha(fenceSha, 1, ("bench/f" + (i % 1000)).getBytes(StandardCharsets.UTF_8), tokB, VALUE);
            cases.get("acquire+release")[1] = (t, i) -> {
                String lock = "bench/L" + t, holder = "h" + i;
                if (!"OK".equals(rr.set(lock, holder, nx))) throw new IllegalStateException("lock " + lock + " not free");
                rr.evalsha(unlock, 1, lock, holder);
            };
        }
        String only = System.getenv("BENCH_OPS"); // e.g. "get,fenced put": only those
        if (only != null && !only.isEmpty()) cases.keySet().retainAll(List.of(only.split(",")));
        String ns = System.getenv("BENCH_CALLERS"); // e.g. "1"
        int[] callers = ns == null || ns.isEmpty() ? new int[] {1, 16} : Arrays.stream(ns.split(",")).mapToInt(Integer::parseInt).toArray();
        String[] who = {"fencekv-java", "jedis"};
        // Warm up (JIT): every case briefly.
        for (Op[] ops : cases.values()) {
            for (Op op : ops) {
                if (op != null) run(4, Math.min(secs, 0.5), op);
            }
        }
        // name/n/who -> per-round results
        Map<String, List<Result>> res = new LinkedHashMap<>();
        for (int round = 0; round < rounds; round++) {
            for (int n : callers) {
                for (Map.Entry<String, Op[]> e : cases.entrySet()) {
                    for (int k = 0; k < 2; k++) {
                        if (e.getValue()[k] == null) continue;
                        res.computeIfAbsent(e.getKey() + "/" + n + "/" + k, x -> new ArrayList<>()).add(run(n, secs, e.getValue()[k]));
                    }
                }
            }
        }
        System.out.printf("%d rounds of %.1f s per case; medians (Java %s, %d cores):%n", rounds, secs,
                System.getProperty("java.version"), Runtime.getRuntime().availableProcessors());
        System.out.printf("%-18s %-13s %8s %12s %10s %14s%n", "op", "client", "callers", "calls/s", "us/call", "client cpu us");
        for (int n : callers) {
            for (String name : cases.keySet()) {
                for (int k = 0; k < 2; k++) {
                    List<Result> rs = res.get(name + "/" + n + "/" + k);
                    if (rs == null) continue;
                    System.out.printf("%-18s %-13s %8d %12.0f %10.1f %14.1f%n", name, who[k], n,
                            median(rs.stream().map(Result::rate).toList()), median(rs.stream().map(Result::us).toList()),
                            median(rs.stream().map(Result::cpuUs).toList()));
                }
            }
        }
        if (r != null) {
            System.out.println();
            System.out.println("per-call cost fencekv-java / jedis (median of the rounds' ratios of us/call; goal <= 1.5x):");
            for (int n : callers) {
                StringBuilder sb = new StringBuilder(String.format("  %2d callers:", n));
                for (String name : cases.keySet()) {
                    List<Result> a = res.get(name + "/" + n + "/0"), b = res.get(name + "/" + n + "/1");
                    List<Double> ratios = new ArrayList<>();
                    for (int i = 0; i < a.size(); i++) ratios.add(a.get(i).us() / b.get(i).us());
                    sb.append(String.format("  %s %.2fx", name, median(ratios)));
                }
                System.out.println(sb);
            }
            r.close();
        }
        c.close();
    }
}
