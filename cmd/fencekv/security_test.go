package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fencekv/fencekv"
	"github.com/fencekv/fencekv/auth"
	"github.com/fencekv/fencekv/fencekvtest"
	"github.com/fencekv/fencekv/wire"
)

// secureFiles are the certificates and the auth file a secure server and
// its clients use, all made by the test.
type secureFiles struct {
	dir                     string
	ca                      string // the CA, for clients and --tls-client-ca
	serverCert, serverKey   string
	deployCert, deployKey   string // common name "deploy": a principal
	intruderCert, intrKey   string // from another CA
	authFile                string
	opsSecret, verifySecret string // secret files
}

func makeSecureFiles(t *testing.T) *secureFiles {
	t.Helper()
	f := &secureFiles{dir: t.TempDir()}
	ca := fencekvtest.NewCA(t, "test CA")
	f.ca = ca.WriteFile(t, f.dir, "ca.crt")
	f.serverCert, f.serverKey = ca.Issue(t, "server", nil).WriteFiles(t, f.dir, "server")
	f.deployCert, f.deployKey = ca.Issue(t, "deploy", nil).WriteFiles(t, f.dir, "deploy")
	f.intruderCert, f.intrKey = fencekvtest.NewCA(t, "other CA").Issue(t, "deploy", nil).WriteFiles(t, f.dir, "intruder")
	f.opsSecret = filepath.Join(f.dir, "ops.secret")
	f.verifySecret = filepath.Join(f.dir, "verify.secret")
	if err := os.WriteFile(f.opsSecret, []byte("ops secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f.verifySecret, []byte("verify secret\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f.authFile = filepath.Join(f.dir, "auth")
	f.writeAuth(t, map[string]string{
		"deploy": "- write:deploy/ lock:deploy",
		"ops":    "ops secret|read: admin",
		"verify": "verify secret|write:verify/ lock:verify/ write:bench/ lock:bench/",
	})
	return f
}

// writeAuth writes the auth file: each value is "SECRET|RIGHTS", or
// "- RIGHTS" for a certificate-only principal. Hashes are made by the
// binary's own `fencekv auth hash`.
func (f *secureFiles) writeAuth(t *testing.T, lines map[string]string) {
	t.Helper()
	var b strings.Builder
	b.WriteString("# written by the test\n")
	for name, v := range lines {
		if rights, ok := strings.CutPrefix(v, "- "); ok {
			b.WriteString(name + " - " + rights + "\n")
			continue
		}
		secret, rights, _ := strings.Cut(v, "|")
		sh := &shell{t: t, stdin: secret + "\n"}
		h := strings.TrimSpace(sh.ok("auth", "hash", "--cost", "4"))
		b.WriteString(name + " " + h + " " + rights + "\n")
	}
	if err := os.WriteFile(f.authFile, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestServeTLSAndAuth: a server with TLS, client certificates and an
// auth file, used through the CLI as a person would.
func TestServeTLSAndAuth(t *testing.T) {
	t.Parallel()
	f := makeSecureFiles(t)
	s := startServer(t, t.TempDir(), "--tls-cert", f.serverCert, "--tls-key", f.serverKey,
		"--tls-client-ca", f.ca, "--auth-file", f.authFile)
	plain := s.shell(t)
	asDeploy := s.shell(t, "FENCEKV_TLS_CA="+f.ca, "FENCEKV_TLS_CERT="+f.deployCert, "FENCEKV_TLS_KEY="+f.deployKey)
	asOps := s.shell(t, "FENCEKV_TLS_CA="+f.ca, "FENCEKV_TLS_CERT="+f.deployCert, "FENCEKV_TLS_KEY="+f.deployKey,
		"FENCEKV_USER=ops", "FENCEKV_SECRET_FILE="+f.opsSecret)

	// A plain client: refused, told why, logged by the server.
	r := plain.fails(exitUsage, "ping")
	wantContains(t, "plain client's error", r.stderr, "the server requires TLS")
	waitFor(t, 5*time.Second, "the server's refusal line", func() bool {
		return strings.Contains(s.log.String(), "TLS handshake failed") && strings.Contains(s.log.String(), "does not look like a TLS handshake")
	})
	// A client that does not trust the server's certificate is told how
	// to make it, not asked whether a server runs there.
	r = s.shell(t).fails(exitUsage, "ping", "--tls")
	wantContains(t, "untrusting client's error", r.stderr, "set --tls-ca")
	// A client certificate from another CA: refused.
	asIntruder := s.shell(t, "FENCEKV_TLS_CA="+f.ca, "FENCEKV_TLS_CERT="+f.intruderCert, "FENCEKV_TLS_KEY="+f.intrKey)
	asIntruder.fails(exitUsage, "put", "deploy/x", "1")

	// The certificate's common name is the principal: deploy may write
	// deploy/ and use lock deploy, nothing else.
	asDeploy.ok("put", "deploy/v", "1")
	tok := parseToken(t, asDeploy.ok("lock", "acquire", "deploy"))
	asDeploy.ok("put", "deploy/v", "2", "--token", strconv.FormatUint(tok, 10), "--lock", "deploy")
	r = asDeploy.fails(exitDenied, "put", "other", "1")
	wantContains(t, "stderr", r.stderr, "permission_denied")
	asDeploy.fails(exitDenied, "status")
	asDeploy.fails(exitDenied, "lock", "acquire", "jobs")
	asDeploy.fails(exitDenied, "get", "secret/x")

	// ops (a secret): reads everything, status, no writes.
	wantContains(t, "scan by ops", asOps.ok("scan"), "deploy/v")
	asOps.ok("status")
	asOps.fails(exitDenied, "put", "deploy/v", "3")
	// A wrong secret, and a user without one.
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("nope"), 0o600)
	r = asOps.fails(exitUnauthenticated, "ping", "--secret-file", bad)
	wantContains(t, "wrong secret's error", r.stderr, "wrong name or secret")
	asDeploy.fails(exitUsage, "ping", "--user", "ops")
	r = asOps.fails(exitUsage, "ping", "--secret-file", os.DevNull) // an empty file is not a wrong secret
	wantContains(t, "empty secret file's error", r.stderr, "holds no secret")
	waitFor(t, 5*time.Second, "the failed attempt's log line", func() bool {
		return strings.Contains(s.log.String(), `msg="authentication failed"`) && strings.Contains(s.log.String(), "name=ops")
	})
	// The secret comes from FENCEKV_SECRET too.
	s.shell(t, "FENCEKV_TLS_CA="+f.ca, "FENCEKV_TLS_CERT="+f.deployCert, "FENCEKV_TLS_KEY="+f.deployKey,
		"FENCEKV_USER=ops", "FENCEKV_SECRET=ops secret").ok("status")

	// run-locked hands the TLS files (not a secret) to the command, whose
	// own fencekv calls reach the server the same way.
	rl := s.shell(t, "FENCEKV_BIN="+bin)
	rl.ok("run-locked", "deploy", "--tls-ca", f.ca, "--tls-cert", f.deployCert, "--tls-key", f.deployKey, "--",
		"sh", "-c", `"$FENCEKV_BIN" put deploy/run-locked done --token "$FENCEKV_TOKEN" --lock "$FENCEKV_LOCK"`)
	wantEqual(t, "the child's write", strings.TrimSpace(asOps.ok("get", "deploy/run-locked")), "done")
	asDeploy.fails(exitDenied, "run-locked", "jobs", "--", "true")

	// verify and bench, as a principal limited to their prefixes.
	asVerify := s.shell(t, "FENCEKV_TLS_CA="+f.ca, "FENCEKV_USER=verify", "FENCEKV_SECRET_FILE="+f.verifySecret,
		"FENCEKV_TLS_CERT="+f.deployCert, "FENCEKV_TLS_KEY="+f.deployKey)
	out := asVerify.ok("verify", "--rounds", "2", "--clients", "2", "--updates", "6", "--ttl", "300ms")
	wantContains(t, "verify", out, "PASS")
	out = asVerify.ok("bench", "--workload", "fenced-put", "--clients", "2", "--duration", "200ms", "--warmup", "0s",
		"--prefix", "bench/", "--quiet")
	wantContains(t, "bench", out, "0 errors")
}

// TestAuthReloadOnSIGHUP: SIGHUP rereads the auth file. A connection that
// stays open gets the new rights on its next request; a file that does
// not parse leaves the old one in force.
func TestAuthReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "auth")
	h, err := auth.Hash([]byte("alice secret"), 4)
	if err != nil {
		t.Fatal(err)
	}
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("alice " + h + " write:a/ lock:a\n")
	s := startServer(t, t.TempDir(), "--auth-file", path)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := wire.DialWith(ctx, s.addr, &wire.DialOptions{User: "alice", Secret: []byte("alice secret")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Put(ctx, []byte("a/1"), []byte("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}

	// A broken file: logged, and the rights stay.
	write("alice " + h + " write:a/ bogus\n")
	s.signal(t, syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the failed reload's log line", func() bool {
		return strings.Contains(s.log.String(), "auth file not reloaded")
	})
	if _, err := c.Put(ctx, []byte("a/2"), []byte("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}

	// The write right removed: the same connection is refused, and stays
	// open for what it may still do.
	write("alice " + h + " read:a/\n")
	s.signal(t, syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the write right to go", func() bool {
		_, err := c.Put(ctx, []byte("a/3"), []byte("v"), fencekv.WriteOptions{})
		return errors.Is(err, fencekv.ErrPermissionDenied)
	})
	if e, err := c.Get(ctx, []byte("a/1")); err != nil || string(e.Value) != "v" {
		t.Fatalf("a read on the same connection after the reload: %v, %v", e, err)
	}
	// The new rights take effect before the reload is logged.
	waitFor(t, 10*time.Second, "the reload's log line", func() bool {
		return strings.Contains(s.log.String(), `msg="auth file reloaded"`)
	})

	// alice removed: unauthenticated on the same connection.
	write("bob " + h + " read:\n")
	s.signal(t, syscall.SIGHUP)
	waitFor(t, 10*time.Second, "alice to be unknown", func() bool {
		_, err := c.Get(ctx, []byte("a/1"))
		return errors.Is(err, fencekv.ErrUnauthenticated)
	})
	if _, err := c.Ping(ctx); err != nil {
		t.Fatalf("the connection was dropped: %v", err)
	}
	s.stop(t)
}

// TestAuthHash: `fencekv auth hash` reads one line and prints a hash that
// checks; it refuses an empty or over-long secret and an argument.
func TestAuthHash(t *testing.T) {
	t.Parallel()
	sh := &shell{t: t, stdin: "s3cret\n"}
	h := strings.TrimSpace(sh.ok("auth", "hash", "--cost", "4"))
	f, err := auth.Parse(strings.NewReader("x " + h + " read:\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.Authenticate("x", []byte("s3cret")) == nil {
		t.Error("the printed hash does not check against its secret")
	}
	if f.Authenticate("x", []byte("s3cret\n")) != nil {
		t.Error("the line ending was hashed")
	}
	(&shell{t: t, stdin: "\n"}).fails(exitUsage, "auth", "hash")
	(&shell{t: t, stdin: strings.Repeat("x", 73)}).fails(exitUsage, "auth", "hash")
	(&shell{t: t}).fails(exitUsage, "auth", "hash", "s3cret")
}

// TestServeSecurityUsage: flags that cannot work are refused at start.
func TestServeSecurityUsage(t *testing.T) {
	t.Parallel()
	f := makeSecureFiles(t)
	dir := t.TempDir()
	ca := fencekvtest.NewCA(t, "spaced CA")
	spacedCA := ca.WriteFile(t, dir, "spaced-ca.crt")
	spacedCert, spacedKey := ca.Issue(t, "fencekv server", nil).WriteFiles(t, dir, "spaced")
	key := base64.StdEncoding.EncodeToString(make([]byte, 32))
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", f.serverCert}, "--tls-cert and --tls-key go together"},
		{[]string{"--tls-client-ca", f.ca}, "--tls-client-ca needs --tls-cert"},
		{[]string{"--gossip-key", "AAAA"}, "--gossip-key needs --node"},
		{[]string{"--auth-file", filepath.Join(dir, "missing")}, "auth file"},
		{[]string{"--node", "n0", "--raft", "127.0.0.1:1", "--gossip", "127.0.0.1:2", "--tls-cert", f.serverCert, "--tls-key", f.serverKey}, "needs --tls-peer-ca"},
		{[]string{"--node", "n0", "--raft", "127.0.0.1:1", "--gossip", "127.0.0.1:2", "--tls-cert", f.serverCert, "--tls-key", f.serverKey, "--tls-client-ca", f.ca}, "needs --gossip-key"},
		{[]string{"--node", "n0", "--raft", "127.0.0.1:1", "--gossip", "127.0.0.1:2", "--gossip-key", "c2hvcnQ="}, "16, 24 or 32"},
		{[]string{"--node", "n0", "--raft", "127.0.0.1:1", "--gossip", "127.0.0.1:2", "--auth-file", f.authFile}, "needs --tls-cert"},
		// A node's certificate must be a principal with every right.
		{[]string{"--node", "n0", "--raft", "127.0.0.1:1", "--gossip", "127.0.0.1:2", "--gossip-key", key, "--auth-file", f.authFile,
			"--tls-cert", f.serverCert, "--tls-key", f.serverKey, "--tls-client-ca", f.ca}, "add the line\n  server - read: write: lock: admin"},
		// ... and so one word: the README's single-server example
		// certificate once got a hint no auth file can follow.
		{[]string{"--node", "n0", "--raft", "127.0.0.1:1", "--gossip", "127.0.0.1:2", "--gossip-key", key, "--auth-file", f.authFile,
			"--tls-cert", spacedCert, "--tls-key", spacedKey, "--tls-client-ca", spacedCA}, `common name "fencekv server", which cannot be a principal`},
	} {
		r := (&shell{t: t}).fails(exitUsage, append([]string{"serve", "--data", filepath.Join(dir, "d"), "--listen", "127.0.0.1:0"}, c.args...)...)
		wantContains(t, strings.Join(c.args, " "), r.stderr, c.want)
	}
}

// TestTLSCertReloadOnSIGHUP: SIGHUP rereads --tls-cert and --tls-key. New
// connections get the renewed certificate, an open one keeps working, and
// a pair that does not load leaves the one in force.
func TestTLSCertReloadOnSIGHUP(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	ca := fencekvtest.NewCA(t, "test CA")
	caPath := ca.WriteFile(t, dir, "ca.crt")
	first, renewed := ca.Issue(t, "first", nil), ca.Issue(t, "renewed", nil)
	certPath, keyPath := first.WriteFiles(t, dir, "server")
	s := startServer(t, t.TempDir(), "--tls-cert", certPath, "--tls-key", keyPath)

	pool := x509.NewCertPool()
	pem, err := os.ReadFile(caPath)
	if err != nil {
		t.Fatal(err)
	}
	pool.AppendCertsFromPEM(pem)
	// presented returns the common name of the certificate a new
	// connection gets.
	presented := func() string {
		t.Helper()
		c, err := tls.Dial("tcp", s.addr, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			t.Fatalf("TLS dial: %v", err)
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	if cn := presented(); cn != "first" {
		t.Fatalf("the server presents %q; want first", cn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	open, err := wire.DialWith(ctx, s.addr, &wire.DialOptions{TLS: &tls.Config{RootCAs: pool}})
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if _, err := open.Put(ctx, []byte("k"), []byte("v"), fencekv.WriteOptions{}); err != nil {
		t.Fatal(err)
	}

	// The renewed certificate with the old key: does not load, the old
	// pair stays.
	if err := os.WriteFile(certPath, renewed.CertPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	s.signal(t, syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the failed reload's log line", func() bool {
		return strings.Contains(s.log.String(), "TLS certificate not reloaded")
	})
	if cn := presented(); cn != "first" {
		t.Fatalf("after a failed reload the server presents %q; want first", cn)
	}

	// Its key too: new connections get it; the open one goes on.
	if err := os.WriteFile(keyPath, renewed.KeyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	s.signal(t, syscall.SIGHUP)
	waitFor(t, 10*time.Second, "the reload's log line", func() bool {
		return strings.Contains(s.log.String(), `msg="TLS certificate reloaded" certificate=renewed`)
	})
	if cn := presented(); cn != "renewed" {
		t.Fatalf("after the reload the server presents %q; want renewed", cn)
	}
	if e, err := open.Get(ctx, []byte("k")); err != nil || string(e.Value) != "v" {
		t.Fatalf("the connection opened before the reload: %v, %v", e, err)
	}
	s.stop(t)
}
