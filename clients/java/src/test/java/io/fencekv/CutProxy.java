package io.fencekv;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;

/**
 * A TCP proxy to a server for the tests: it forwards both ways; while
 * {@link #dropAnswers} is set it throws away what the server sends; {@link #cut}
 * closes every connection it carries (it keeps accepting new ones).
 */
final class CutProxy implements AutoCloseable {
    private final ServerSocket ln;
    private final List<Socket> conns = new ArrayList<>();
    volatile boolean dropAnswers;

    CutProxy(String upstream) throws IOException {
        ln = new ServerSocket(0, 50, InetAddress.getLoopbackAddress());
        String host = upstream.substring(0, upstream.lastIndexOf(':'));
        int port = Integer.parseInt(upstream.substring(upstream.lastIndexOf(':') + 1));
        Thread t = new Thread(() -> {
            while (true) {
                Socket c;
                Socket u;
                try {
                    c = ln.accept();
                } catch (IOException e) {
                    return;
                }
                try {
                    u = new Socket(host, port);
                } catch (IOException e) {
                    try {
                        c.close();
                    } catch (IOException ignored) {
                        // gone
                    }
                    continue;
                }
                synchronized (conns) {
                    conns.add(c);
                    conns.add(u);
                }
                pump(c, u, false);
                pump(u, c, true);
            }
        }, "cut-proxy");
        t.setDaemon(true);
        t.start();
    }

    private void pump(Socket from, Socket to, boolean answers) {
        Thread t = new Thread(() -> {
            byte[] buf = new byte[64 * 1024];
            try (InputStream in = from.getInputStream(); OutputStream out = to.getOutputStream()) {
                int n;
                while ((n = in.read(buf)) > 0) {
                    if (answers && dropAnswers) continue;
                    out.write(buf, 0, n);
                    out.flush();
                }
            } catch (IOException ignored) {
                // cut
            } finally {
                try {
                    to.close();
                    from.close();
                } catch (IOException ignored) {
                    // closing
                }
            }
        }, "cut-proxy-pump");
        t.setDaemon(true);
        t.start();
    }

    String addr() {
        return "127.0.0.1:" + ln.getLocalPort();
    }

    void cut() {
        synchronized (conns) {
            for (Socket s : conns) {
                try {
                    s.close();
                } catch (IOException ignored) {
                    // closing
                }
            }
            conns.clear();
        }
    }

    @Override
    public void close() throws IOException {
        ln.close();
        cut();
    }
}
