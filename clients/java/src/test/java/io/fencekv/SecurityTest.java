package io.fencekv;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyStore;
import java.security.cert.CertificateFactory;
import java.time.Duration;

import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;

import org.junit.jupiter.api.Test;

/** C10: TLS and auth against a real server with --tls-cert and --auth-file (certificates made with openssl). */
class SecurityTest {
    static void run(Path dir, String... cmd) throws Exception {
        Process p = new ProcessBuilder(cmd).directory(dir.toFile()).redirectErrorStream(true)
                .redirectOutput(dir.resolve("cmd.log").toFile()).start();
        assertEquals(0, p.waitFor(), String.join(" ", cmd) + ": " + Files.readString(dir.resolve("cmd.log")));
    }

    @Test
    void c10TlsAndAuth() throws Exception {
        Path dir = Files.createTempDirectory("fencekv-tls");
        try {
            run(dir, "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
                    "-days", "2", "-subj", "/CN=test CA");
            run(dir, "openssl", "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=server");
            Files.writeString(dir.resolve("ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\n");
            run(dir, "openssl", "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
                    "-out", "server.crt", "-days", "2", "-extfile", "ext");
            Process h = new ProcessBuilder(Servers.binary().toString(), "auth", "hash", "--cost", "4").start();
            h.getOutputStream().write("app secret\n".getBytes());
            h.getOutputStream().close();
            String hash = new String(h.getInputStream().readAllBytes()).trim();
            assertEquals(0, h.waitFor());
            Files.writeString(dir.resolve("auth"), "app " + hash + " write:app/ lock:app/\n");

            try (Servers.Server s = Servers.Server.launch("--tls-cert", dir.resolve("server.crt").toString(),
                    "--tls-key", dir.resolve("server.key").toString(), "--auth-file", dir.resolve("auth").toString())) {
                KeyStore ks = KeyStore.getInstance(KeyStore.getDefaultType());
                ks.load(null, null);
                try (InputStream in = Files.newInputStream(dir.resolve("ca.crt"))) {
                    ks.setCertificateEntry("ca", CertificateFactory.getInstance("X.509").generateCertificate(in));
                }
                TrustManagerFactory tmf = TrustManagerFactory.getInstance(TrustManagerFactory.getDefaultAlgorithm());
                tmf.init(ks);
                SSLContext ssl = SSLContext.getInstance("TLS");
                ssl.init(null, tmf.getTrustManagers(), null);

                try (FencekvClient c = FencekvClient.builder().addresses(s.addr()).ssl(ssl).credentials("app", "app secret").build()) {
                    c.put("app/k", "v");
                    assertEquals("v", c.get("app/k").valueString());
                    try (Lease l = c.lock("app/L", Duration.ofSeconds(2))) {
                        c.put("app/k", "held", l);
                    }
                    assertThrows(PermissionDeniedException.class, () -> c.get("other/k"));
                    assertThrows(PermissionDeniedException.class, c::status);
                }
                assertThrows(UnauthenticatedException.class,
                        () -> FencekvClient.builder().addresses(s.addr()).ssl(ssl).credentials("app", "wrong").build());
                try (FencekvClient c = FencekvClient.builder().addresses(s.addr()).ssl(ssl).build()) {
                    assertThrows(UnauthenticatedException.class, () -> c.get("app/k"));
                }
                try (FencekvClient plain = FencekvClient.connect(s.addr())) {
                    TlsRequiredException e = assertThrows(TlsRequiredException.class, plain::ping);
                    assertTrue(e.getMessage().contains("requires TLS"), e.getMessage());
                }
            }
        } finally {
            Servers.deleteTree(dir);
        }
    }
}
