package wire_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// allLogs is a slog.Handler that keeps every line, at every level.
type allLogs struct {
	mu    sync.Mutex
	lines []string
}

func (h *allLogs) Enabled(context.Context, slog.Level) bool { return true }
func (h *allLogs) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *allLogs) WithGroup(string) slog.Handler            { return h }
func (h *allLogs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Level.String() + " " + r.Message)
	r.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	h.mu.Lock()
	h.lines = append(h.lines, b.String())
	h.mu.Unlock()
	return nil
}

// matching returns the lines that contain every one of subs.
func (h *allLogs) matching(subs ...string) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
next:
	for _, l := range h.lines {
		for _, s := range subs {
			if !strings.Contains(l, s) {
				continue next
			}
		}
		out = append(out, l)
	}
	return out
}

func (h *allLogs) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.lines, "\n")
}

// secureServer is a server with TLS or auth, whose every log line is kept.
type secureServer struct {
	Addr string
	DB   *fencekv.DB
	Logs *allLogs
}

func startSecure(t *testing.T, cfg wire.Config) *secureServer {
	t.Helper()
	o := fencekv.DefaultOptions()
	o.NoSync = true
	db, err := fencekv.Open(t.TempDir(), &o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	logs := &allLogs{}
	cfg.Logger = slog.New(logs)
	srv, err := wire.NewServer(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		<-served
		if t.Failed() {
			t.Logf("server log:\n%s", logs)
		}
	})
	return &secureServer{Addr: ln.Addr().String(), DB: db, Logs: logs}
}

// tlsServerConfig serves cert; with clientCA, it requires and verifies
// client certificates.
func tlsServerConfig(cert *fencekvtest.Cert, clientCA *fencekvtest.CA) *tls.Config {
	cfg := &tls.Config{Certificates: []tls.Certificate{cert.TLS}}
	if clientCA != nil {
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
		cfg.ClientCAs = clientCA.Pool
	}
	return cfg
}

func tlsClient(ca *fencekvtest.CA, cert *fencekvtest.Cert) *tls.Config {
	cfg := &tls.Config{RootCAs: ca.Pool}
	if cert != nil {
		// Always sent: with Certificates, Go's client would keep back a
		// certificate whose issuer the server does not list.
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert.TLS, nil }
	}
	return cfg
}

// tryPut dials with o and puts key; the error is the dial's or the put's.
func tryPut(addr string, o *wire.DialOptions, key string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := wire.DialWith(ctx, addr, o)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Put(ctx, []byte(key), []byte("v"), fencekv.WriteOptions{})
	return err
}

func absent(t *testing.T, db *fencekv.DB, key string) {
	t.Helper()
	e, err := db.Get(context.Background(), []byte(key))
	if err != nil {
		t.Fatal(err)
	}
	if e.Found || e.Revision != 0 {
		t.Errorf("key %q was written by a refused client", key)
	}
	st, err := db.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Revision != 0 {
		t.Errorf("revision %d: a refused client changed the store", st.Revision)
	}
}

// TestTLS: a TLS client that trusts the server's CA is served over TLS
// 1.3; a plain client is refused with a log line and changes nothing;
// a client below TLS 1.2 is refused.
func TestTLS(t *testing.T) {
	ca := fencekvtest.NewCA(t, "test CA")
	ts := startSecure(t, secureConfig(tlsServerConfig(ca.Issue(t, "server", nil), nil), nil))

	ctx := context.Background()
	c, err := wire.DialWith(ctx, ts.Addr, &wire.DialOptions{TLS: tlsClient(ca, nil)})
	ok(t, err)
	defer c.Close()
	if _, err := c.Put(ctx, b("k"), b("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	e, err := c.Get(ctx, b("k"))
	ok(t, err)
	if string(e.Value) != "v" {
		t.Fatalf("get over TLS = %q", e.Value)
	}
	// The version negotiated: 1.3 (both sides prefer it).
	raw, err := tls.Dial("tcp", ts.Addr, tlsClient(ca, nil))
	ok(t, err)
	if v := raw.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Errorf("negotiated version %x, want TLS 1.3", v)
	}
	raw.Close()

	// A plain client: refused at the handshake, nothing written.
	if err := tryPut(ts.Addr, nil, "plain"); err == nil {
		t.Fatal("a plain client's put was answered by a TLS server")
	}
	eventually(t, 5*time.Second, "the refusal's log line", func() bool {
		return len(ts.Logs.matching("TLS handshake failed", "does not look like a TLS handshake")) == 1
	})
	e, err = c.Get(ctx, b("plain"))
	ok(t, err)
	if e.Found {
		t.Error("the plain client's put was applied")
	}

	// Below TLS 1.2: refused, whatever the client allows.
	old := tlsClient(ca, nil)
	old.MinVersion, old.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
	if err := tryPut(ts.Addr, &wire.DialOptions{TLS: old}, "old"); err == nil {
		t.Fatal("a TLS 1.1 client was served")
	}
	// A client that does not trust the server's certificate refuses it.
	other := fencekvtest.NewCA(t, "another CA")
	err = tryPut(ts.Addr, &wire.DialOptions{TLS: tlsClient(other, nil)}, "untrusting")
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a client with another CA: %v, want unknown authority", err)
	}
}

// TestTLSRefusalsLoggedOncePerBurst: many plain clients from one host
// make one log line.
func TestTLSRefusalsLoggedOncePerBurst(t *testing.T) {
	ca := fencekvtest.NewCA(t, "test CA")
	ts := startSecure(t, secureConfig(tlsServerConfig(ca.Issue(t, "server", nil), nil), nil))
	for range 5 {
		tryPut(ts.Addr, nil, "plain")
	}
	// Each plain client's dial returned after the server closed it, that
	// is after its handshake failed: all five have been counted.
	eventually(t, 5*time.Second, "a refusal's log line", func() bool {
		return len(ts.Logs.matching("TLS handshake failed")) > 0
	})
	if err := tryPut(ts.Addr, &wire.DialOptions{TLS: tlsClient(ca, nil)}, "k"); err != nil {
		t.Fatal(err)
	}
	if n := len(ts.Logs.matching("TLS handshake failed")); n != 1 {
		t.Errorf("%d log lines for 5 refusals from one host within a burst, want 1:\n%s", n, ts.Logs)
	}
}

// TestMutualTLS: with client certificates required, a client with a
// certificate from the client CA is served; one without, with one from
// another CA, or with an expired one is refused at the handshake with a
// log line that says why, and changes nothing (a fresh server each, so
// that no line is held back by the once-per-burst limit).
func TestMutualTLS(t *testing.T) {
	ca := fencekvtest.NewCA(t, "test CA")
	other := fencekvtest.NewCA(t, "another CA")
	t.Run("good", func(t *testing.T) {
		ts := startSecure(t, secureConfig(tlsServerConfig(ca.Issue(t, "server", nil), ca), nil))
		if err := tryPut(ts.Addr, &wire.DialOptions{TLS: tlsClient(ca, ca.Issue(t, "good", nil))}, "k"); err != nil {
			t.Fatalf("a client with a good certificate: %v", err)
		}
	})
	for _, c := range []struct {
		name string
		cert *fencekvtest.Cert
		log  string
	}{
		{"untrusted", other.Issue(t, "intruder", nil), "certificate signed by unknown authority"},
		{"expired", ca.Issue(t, "expired", &fencekvtest.CertOptions{
			NotBefore: time.Now().Add(-48 * time.Hour), NotAfter: time.Now().Add(-time.Hour)}), "expired"},
		{"no certificate", nil, "didn't provide a certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ts := startSecure(t, secureConfig(tlsServerConfig(ca.Issue(t, "server", nil), ca), nil))
			if err := tryPut(ts.Addr, &wire.DialOptions{TLS: tlsClient(ca, c.cert)}, "k"); err == nil {
				t.Fatal("served")
			}
			eventually(t, 5*time.Second, fmt.Sprintf("a log line with %q", c.log), func() bool {
				return len(ts.Logs.matching("TLS handshake failed", c.log)) == 1
			})
			absent(t, ts.DB, "k")
		})
	}
}

// secureConfig is the default config with TLS and auth.
func secureConfig(t *tls.Config, a wire.Authenticator) wire.Config {
	cfg := wire.DefaultConfig()
	cfg.TLS, cfg.Auth = t, a
	return cfg
}
