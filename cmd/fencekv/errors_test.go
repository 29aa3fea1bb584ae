package main

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestPutOverMessageLimit: a value over the message limit, far over the
// socket buffers, is refused with the server's too_large (exit 2), not a
// connection reset with an unknown outcome (exit 1), on both of the
// server's connection paths.
func TestPutOverMessageLimit(t *testing.T) {
	t.Parallel()
	for _, loop := range []string{"--event-loop=true", "--event-loop=false"} {
		s := startServer(t, t.TempDir(), loop)
		c := s.shell(t)
		c.stdin = strings.Repeat("x", 5<<20)
		r := c.fails(exitUsage, "put", "big", "-")
		wantContains(t, loop+": stderr", r.stderr, "too_large")
		if strings.Contains(r.stderr, "may or may not") || strings.Contains(r.stderr, "TLS") {
			t.Errorf("%s: %v", loop, r)
		}
		r = c.fails(exitUsage, "put", "big", "-", "--json")
		wantFields(t, decodeJSON(t, r.stdout), map[string]any{"error": "too_large"})
		c.stdin = ""
		c.ok("put", "small", "v")
	}
}

// TestServeValueOverMessageLimit: serve refuses a value limit the
// message limit leaves no room for, saying why, and accepts one that fits.
func TestServeValueOverMessageLimit(t *testing.T) {
	t.Parallel()
	c := &shell{t: t}
	r := c.fails(exitUsage, "serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--http", "",
		"--max-value-size", "8388608")
	wantContains(t, "stderr", r.stderr, "--max-value-size 8388608 does not fit in --max-message-size 4194304")
	wantContains(t, "stderr", r.stderr, "raise --max-message-size to at least 8397056")
	// Equal limits leave no room for the key.
	r = c.fails(exitUsage, "serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--http", "",
		"--max-value-size", "1048576", "--max-message-size", "1048576")
	wantContains(t, "stderr", r.stderr, "does not fit")
	s := startServer(t, t.TempDir(), "--max-value-size", "8388608", "--max-message-size", "8397056")
	s.shell(t).ok("ping")
}

// TestTLSConfigurationErrors: a TLS failure before the first request is
// a configuration error: exit 2, --json error "tls" with no outcome, a
// hint that names the flag to set, and no question whether a server runs
// there; nothing reaches the store.
func TestTLSConfigurationErrors(t *testing.T) {
	t.Parallel()
	f := makeSecureFiles(t)
	s := startServer(t, t.TempDir(), "--tls-cert", f.serverCert, "--tls-key", f.serverKey,
		"--tls-client-ca", f.ca, "--auth-file", f.authFile)
	for _, tc := range []struct {
		name string
		env  []string
		hint string
	}{
		{"plain client", nil, "the server requires TLS: set --tls-ca"},
		{"no client certificate", []string{"FENCEKV_TLS_CA=" + f.ca, "FENCEKV_USER=ops", "FENCEKV_SECRET_FILE=" + f.opsSecret},
			"the server requires a client certificate: set --tls-cert and --tls-key"},
		{"untrusted server", []string{"FENCEKV_TLS=true"}, "set --tls-ca to the CA that issued it"},
		{"client certificate from another CA", []string{"FENCEKV_TLS_CA=" + f.ca, "FENCEKV_TLS_CERT=" + f.intruderCert, "FENCEKV_TLS_KEY=" + f.intrKey},
			"a client certificate that its --tls-client-ca issued"},
	} {
		for _, addr := range []string{s.addr, s.addr + "," + s.addr} {
			c := &shell{t: t, env: append([]string{"FENCEKV_ADDR=" + addr}, tc.env...)}
			r := c.fails(exitUsage, "put", "deploy/x", "1")
			wantContains(t, tc.name+": stderr", r.stderr, tc.hint)
			for _, bad := range []string{"running", "may or may not", "may still be applied"} {
				if strings.Contains(r.stderr, bad) {
					t.Errorf("%s: stderr says %q: %s", tc.name, bad, r.stderr)
				}
			}
			r = c.fails(exitUsage, "put", "deploy/x", "1", "--json")
			m := decodeJSON(t, r.stdout)
			wantFields(t, m, map[string]any{"error": "tls"})
			if _, ok := m["outcome"]; ok {
				t.Errorf("%s: an outcome for a request TLS refused: %v", tc.name, m)
			}
		}
	}
	asDeploy := s.shell(t, "FENCEKV_TLS_CA="+f.ca, "FENCEKV_TLS_CERT="+f.deployCert, "FENCEKV_TLS_KEY="+f.deployKey)
	r := asDeploy.fails(exitNotFound, "get", "deploy/x")
	wantContains(t, "stderr", r.stderr, "not found")
}

// TestServeReadTimeout: serve --read-timeout closes a connection whose
// message stays half-sent, on both connection paths.
func TestServeReadTimeout(t *testing.T) {
	t.Parallel()
	for _, loop := range []string{"--event-loop=true", "--event-loop=false"} {
		s := startServer(t, t.TempDir(), "--read-timeout", "300ms", loop)
		nc, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		nc.Write([]byte{0x94, 0x00, 0x01}) // the start of a request
		nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		if n, err := nc.Read(make([]byte, 16)); n != 0 || err == nil || strings.Contains(err.Error(), "timeout") {
			t.Errorf("%s: read %d, %v; want the server to close the connection", loop, n, err)
		}
		s.shell(t).ok("ping")
	}
	(&shell{t: t}).fails(exitUsage, "serve", "--data", t.TempDir(), "--listen", "127.0.0.1:0", "--http", "", "--read-timeout", "-1s")
}
