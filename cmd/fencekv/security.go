package main

// TLS and auth: the flags of serve and of every client command, the TLS
// configs they make, and the auth file's reload on SIGHUP. The auth
// subcommand is in auth.go.

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"unicode"

	"github.com/fencekv/fencekv/auth"
	"github.com/fencekv/fencekv/cluster"
	"github.com/fencekv/fencekv/wire"
	"github.com/urfave/cli/v2"
)

// serveSecurityFlags are serve's TLS, auth and gossip-key flags.
func serveSecurityFlags() []cli.Flag {
	env := func(name string) []string { return []string{"FENCEKV_" + name} }
	return []cli.Flag{
		&cli.StringFlag{Name: "tls-cert", EnvVars: env("TLS_CERT"), Usage: "serve TLS with this certificate `FILE` (PEM; in a cluster also raft's, and the node's own when it forwards; reread with --tls-key on SIGHUP)"},
		&cli.StringFlag{Name: "tls-key", EnvVars: env("TLS_KEY"), Usage: "the private key `FILE` of --tls-cert (PEM)"},
		&cli.StringFlag{Name: "tls-client-ca", EnvVars: env("TLS_CLIENT_CA"), Usage: "require client certificates issued by this CA `FILE` (mutual TLS)"},
		&cli.StringFlag{Name: "tls-peer-ca", EnvVars: env("TLS_PEER_CA"), Usage: "cluster: the CA `FILE` that issues the nodes' certificates (default: --tls-client-ca)"},
		&cli.StringFlag{Name: "gossip-key", EnvVars: env("GOSSIP_KEY"), Usage: "cluster: encrypt gossip with this `KEY` (base64 of 16, 24 or 32 bytes, the same on every node)"},
		&cli.StringFlag{Name: "auth-file", EnvVars: env("AUTH_FILE"), Usage: "require clients to authenticate as a principal of this `FILE` and check their rights (reread on SIGHUP)"},
	}
}

// clientSecurityFlags are the TLS and credential flags of every command
// that talks to a server.
func clientSecurityFlags() []cli.Flag {
	env := func(name string) []string { return []string{"FENCEKV_" + name} }
	return []cli.Flag{
		&cli.BoolFlag{Name: "tls", EnvVars: env("TLS"), Usage: "speak TLS, verifying the server with the system's CAs (implied by the other --tls flags)"},
		&cli.StringFlag{Name: "tls-ca", EnvVars: env("TLS_CA"), Usage: "speak TLS, verifying the server with this CA `FILE`"},
		&cli.StringFlag{Name: "tls-cert", EnvVars: env("TLS_CERT"), Usage: "client certificate `FILE` for mutual TLS"},
		&cli.StringFlag{Name: "tls-key", EnvVars: env("TLS_KEY"), Usage: "the private key `FILE` of --tls-cert"},
		&cli.StringFlag{Name: "tls-server-name", EnvVars: env("TLS_SERVER_NAME"), Usage: "the `NAME` the server's certificate must carry (default: the host of --addr)"},
		&cli.StringFlag{Name: "user", EnvVars: env("USER"), Usage: "authenticate as principal `NAME` (its secret from --secret-file or FENCEKV_SECRET)"},
		&cli.StringFlag{Name: "secret-file", EnvVars: env("SECRET_FILE"), Usage: "read --user's secret from `FILE` (one line)"},
	}
}

// clientSecurity is what the client flags say, as values, so that it can
// be passed to a child process by environment (run-locked, verify).
type clientSecurity struct {
	tls                         bool
	ca, cert, key, serverName   string
	user, secretFile, secretEnv string
}

func clientSecurityOf(c *cli.Context) clientSecurity {
	return clientSecurity{
		tls: c.Bool("tls"), ca: c.String("tls-ca"), cert: c.String("tls-cert"), key: c.String("tls-key"),
		serverName: c.String("tls-server-name"), user: c.String("user"), secretFile: c.String("secret-file"),
		secretEnv: os.Getenv("FENCEKV_SECRET"),
	}
}

// clientSecurityFromEnv reads the same settings from FENCEKV_* variables
// (a child process that parses no flags).
func clientSecurityFromEnv() clientSecurity {
	return clientSecurity{
		tls: os.Getenv("FENCEKV_TLS") == "true" || os.Getenv("FENCEKV_TLS") == "1", ca: os.Getenv("FENCEKV_TLS_CA"),
		cert: os.Getenv("FENCEKV_TLS_CERT"), key: os.Getenv("FENCEKV_TLS_KEY"), serverName: os.Getenv("FENCEKV_TLS_SERVER_NAME"),
		user: os.Getenv("FENCEKV_USER"), secretFile: os.Getenv("FENCEKV_SECRET_FILE"), secretEnv: os.Getenv("FENCEKV_SECRET"),
	}
}

// env is the settings as FENCEKV_* variables for a child process: file
// paths and the user name, never a secret read from a file.
func (s clientSecurity) env() []string {
	var out []string
	for k, v := range map[string]string{"TLS_CA": s.ca, "TLS_CERT": s.cert, "TLS_KEY": s.key,
		"TLS_SERVER_NAME": s.serverName, "USER": s.user, "SECRET_FILE": s.secretFile} {
		if v != "" {
			out = append(out, "FENCEKV_"+k+"="+v)
		}
	}
	if s.tls {
		out = append(out, "FENCEKV_TLS=true")
	}
	return out
}

// dialOptions builds the wire client's options: TLS if any TLS setting is
// given, and the credentials if a user is.
func (s clientSecurity) dialOptions() (*wire.DialOptions, error) {
	o := &wire.DialOptions{}
	if s.tls || s.ca != "" || s.cert != "" || s.key != "" || s.serverName != "" {
		cfg := &tls.Config{ServerName: s.serverName, MinVersion: tls.VersionTLS12}
		if s.ca != "" {
			pool, err := loadPool(s.ca)
			if err != nil {
				return nil, usageError{fmt.Errorf("--tls-ca: %w", err)}
			}
			cfg.RootCAs = pool
		}
		if (s.cert == "") != (s.key == "") {
			return nil, usagef("--tls-cert and --tls-key go together")
		}
		if s.cert != "" {
			cert, err := tls.LoadX509KeyPair(s.cert, s.key)
			if err != nil {
				return nil, usageError{fmt.Errorf("--tls-cert/--tls-key: %w", err)}
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		o.TLS = cfg
	}
	if s.user != "" {
		switch {
		case s.secretFile != "":
			b, err := os.ReadFile(s.secretFile)
			if err != nil {
				return nil, usageError{fmt.Errorf("--secret-file: %w", err)}
			}
			o.Secret = firstLine(b)
			if len(o.Secret) == 0 {
				return nil, usagef("--secret-file %s holds no secret (its first line is empty)", s.secretFile)
			}
		case s.secretEnv != "":
			o.Secret = []byte(s.secretEnv)
		default:
			return nil, usagef("--user %s needs its secret: --secret-file FILE or FENCEKV_SECRET", s.user)
		}
		o.User = s.user
	} else if s.secretFile != "" {
		return nil, usagef("--secret-file needs --user (or FENCEKV_USER)")
	}
	return o, nil
}

// firstLine is a secret file's content without its line ending.
func firstLine(b []byte) []byte {
	if i := bytes.IndexByte(b, '\n'); i >= 0 {
		b = b[:i]
	}
	return bytes.TrimSuffix(b, []byte("\r"))
}

func loadPool(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("%s holds no PEM certificate", path)
	}
	return pool, nil
}

// serverSecurity is what serve's flags make: the client port's TLS, the
// auth file, and for a cluster node the raft TLS, the forwarder's dial and
// the gossip key.
type serverSecurity struct {
	clientTLS *tls.Config
	store     *auth.Store
	certs     *certFiles // the node's own certificate, or nil
	raftTLS   *tls.Config
	dial      func(ctx context.Context, addr string) (*wire.Client, error)
	gossipKey []byte
}

// certFiles is the node's certificate and key, read from their files at
// start and again on SIGHUP: a renewed certificate is presented on new
// connections without a restart (those open keep theirs).
type certFiles struct {
	certFile, keyFile string
	cur               atomic.Pointer[tls.Certificate] // its Leaf parsed
}

// load reads the files; on success the certificate is the one presented
// from now on, and load returns it, parsed.
func (c *certFiles) load() (*x509.Certificate, error) {
	cert, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert/--tls-key: %w", err)
	}
	if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
		return nil, fmt.Errorf("--tls-cert: %w", err)
	}
	c.cur.Store(&cert)
	return cert.Leaf, nil
}

func (c *certFiles) leaf() *x509.Certificate { return c.cur.Load().Leaf }

// server and client are tls.Config's GetCertificate and
// GetClientCertificate.
func (c *certFiles) server(*tls.ClientHelloInfo) (*tls.Certificate, error) { return c.cur.Load(), nil }
func (c *certFiles) client(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	return c.cur.Load(), nil
}

// serverSecurityOf reads serve's security flags. cluster says --node is
// set.
func serverSecurityOf(c *cli.Context, clustered bool) (*serverSecurity, error) {
	s := &serverSecurity{}
	certFile, keyFile := c.String("tls-cert"), c.String("tls-key")
	if (certFile == "") != (keyFile == "") {
		return nil, usagef("--tls-cert and --tls-key go together")
	}
	if certFile == "" {
		for _, f := range []string{"tls-client-ca", "tls-peer-ca"} {
			if c.String(f) != "" {
				return nil, usagef("--%s needs --tls-cert and --tls-key", f)
			}
		}
	}
	if !clustered {
		for _, f := range []string{"tls-peer-ca", "gossip-key"} {
			if c.String(f) != "" {
				return nil, usagef("--%s needs --node (a cluster node's name)", f)
			}
		}
	}
	if k := c.String("gossip-key"); k != "" {
		key, err := base64.StdEncoding.DecodeString(k)
		if err != nil || (len(key) != 16 && len(key) != 24 && len(key) != 32) {
			return nil, usagef("--gossip-key: want the base64 of 16, 24 or 32 random bytes (head -c 32 /dev/urandom | base64)")
		}
		s.gossipKey = key
	}
	if certFile != "" {
		s.certs = &certFiles{certFile: certFile, keyFile: keyFile}
		if _, err := s.certs.load(); err != nil {
			return nil, usageError{err}
		}
		s.clientTLS = &tls.Config{GetCertificate: s.certs.server, MinVersion: tls.VersionTLS12, SessionTicketsDisabled: true}
		var err error
		var clientPool, peerPool *x509.CertPool
		if f := c.String("tls-client-ca"); f != "" {
			if clientPool, err = loadPool(f); err != nil {
				return nil, usageError{fmt.Errorf("--tls-client-ca: %w", err)}
			}
		}
		if clustered {
			f := c.String("tls-peer-ca")
			if f == "" {
				f = c.String("tls-client-ca")
			}
			if f == "" {
				return nil, usagef("a cluster node with --tls-cert needs --tls-peer-ca (or --tls-client-ca): the CA of the nodes' certificates, which raft peers must present")
			}
			if peerPool, err = loadPool(f); err != nil {
				return nil, usageError{fmt.Errorf("--tls-peer-ca: %w", err)}
			}
			if s.gossipKey == nil {
				return nil, usagef("a cluster node with --tls-cert needs --gossip-key: without it anyone who reaches the gossip port can join, and the leader would add it to raft")
			}
			s.raftTLS = &tls.Config{GetCertificate: s.certs.server, GetClientCertificate: s.certs.client, ClientAuth: tls.RequireAndVerifyClientCert,
				ClientCAs: peerPool, RootCAs: peerPool, MinVersion: tls.VersionTLS12}
			fwd := &wire.DialOptions{TLS: &tls.Config{GetClientCertificate: s.certs.client, RootCAs: peerPool, MinVersion: tls.VersionTLS12}}
			s.dial = func(ctx context.Context, addr string) (*wire.Client, error) { return wire.DialWith(ctx, addr, fwd) }
		}
		// The client port: mutual TLS with --tls-client-ca (the other
		// nodes' certificates are accepted too: they forward requests);
		// in a cluster without it, a certificate is optional but must
		// be a node's if given.
		switch {
		case clientPool != nil:
			if f := c.String("tls-peer-ca"); f != "" && clustered {
				b, err := os.ReadFile(f)
				if err != nil {
					return nil, usageError{fmt.Errorf("--tls-peer-ca: %w", err)}
				}
				clientPool.AppendCertsFromPEM(b)
			}
			s.clientTLS.ClientAuth, s.clientTLS.ClientCAs = tls.RequireAndVerifyClientCert, clientPool
		case peerPool != nil:
			s.clientTLS.ClientAuth, s.clientTLS.ClientCAs = tls.VerifyClientCertIfGiven, peerPool
		}
	}
	if f := c.String("auth-file"); f != "" {
		st, err := auth.Open(f)
		if err != nil {
			return nil, usageError{err}
		}
		s.store = st
		if clustered {
			if err := s.checkNodePrincipal(st.File()); err != nil {
				return nil, usageError{err}
			}
		}
	}
	return s, nil
}

// checkNodePrincipal: a cluster node forwards its clients' requests to the
// leader, which checks them like any client's, against the principal of
// the node's certificate. That principal must therefore be able to do
// everything.
func (s *serverSecurity) checkNodePrincipal(f *auth.File) error {
	if s.certs == nil {
		return errors.New("a cluster node with --auth-file needs --tls-cert and --tls-key: nodes forward requests to the leader authenticated by their certificates")
	}
	cn := s.certs.leaf().Subject.CommonName
	if cn == "" || strings.ContainsFunc(cn, unicode.IsSpace) {
		return fmt.Errorf("this node's certificate has the common name %q, which cannot be a principal of the auth file (a name is one word): give the node a certificate of its own, named for it (for example /CN=n0; see the README's TLS section)", cn)
	}
	p := f.Lookup(cn)
	if p == nil || !p.Admin() || !p.CanRead(nil) || !p.CanWrite(nil) || !p.CanLock("") {
		return fmt.Errorf("the auth file must give this node's certificate (common name %q) every right, as the leader checks the requests it forwards: add the line\n  %s - read: write: lock: admin", cn, cn)
	}
	return nil
}

// configure puts the client port's TLS and auth into the server's config,
// and logs what is on.
func (s *serverSecurity) configure(wc *wire.Config, log *slog.Logger) {
	wc.TLS = s.clientTLS
	attrs := []any{"tls", s.clientTLS != nil}
	if s.clientTLS != nil {
		certs := map[tls.ClientAuthType]string{tls.RequireAndVerifyClientCert: "required", tls.VerifyClientCertIfGiven: "nodes' or none"}[s.clientTLS.ClientAuth]
		if certs == "" {
			certs = "none"
		}
		leaf := s.certs.leaf()
		attrs = append(attrs, "client_certificates", certs, "certificate", leaf.Subject.CommonName, "expires", leaf.NotAfter.Format("2006-01-02"))
	}
	if s.store != nil {
		wc.Auth = wireAuth{s.store}
		attrs = append(attrs, "auth_file", s.store.Path(), "principals", s.store.File().Len())
	}
	if s.raftTLS != nil {
		attrs = append(attrs, "raft_tls", true)
	}
	if s.gossipKey != nil {
		attrs = append(attrs, "gossip_encrypted", true)
	}
	if s.clientTLS != nil || s.store != nil || s.gossipKey != nil {
		log.Info("security", attrs...)
	}
}

// configureCluster puts raft's TLS, the forwarder's dial and the gossip key
// into a node's config.
func (s *serverSecurity) configureCluster(cc *cluster.Config) {
	cc.RaftTLS, cc.Dial, cc.GossipKey = s.raftTLS, s.dial, s.gossipKey
}

// reloadOnHangup rereads the TLS certificate and key and the auth file on
// each SIGHUP until stop is called. A file that does not load is logged
// and what is in force stays. Without either, SIGHUP is logged and
// ignored: Go's default for it is to exit at once, without a graceful
// shutdown, and a logrotate script or an operator may well send it.
func (s *serverSecurity) reloadOnHangup(log *slog.Logger, clustered bool) (stop func()) {
	if s.store != nil {
		warnAuthFile(log, s.store)
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-hup:
			}
			if s.store == nil && s.certs == nil {
				log.Info("SIGHUP: nothing to reload (no --tls-cert, no --auth-file)")
				continue
			}
			if s.certs != nil {
				if leaf, err := s.certs.load(); err != nil {
					log.Error("TLS certificate not reloaded; the previous one stays in force", "err", err)
				} else {
					log.Info("TLS certificate reloaded", "certificate", leaf.Subject.CommonName, "expires", leaf.NotAfter.Format("2006-01-02"))
				}
			}
			if s.store == nil {
				continue
			}
			f, err := s.store.Reload()
			if err != nil {
				log.Error("auth file not reloaded; the previous one stays in force", "err", err)
				continue
			}
			if clustered {
				if err := s.checkNodePrincipal(f); err != nil {
					log.Error("the reloaded auth file stops this node forwarding", "err", err)
				}
			}
			warnAuthFile(log, s.store)
			log.Info("auth file reloaded", "path", s.store.Path(), "principals", f.Len())
		}
	}()
	return func() {
		signal.Stop(hup)
		close(done)
	}
}

// warnAuthFile warns of an auth file others may read, and of one whose
// hashes have different costs (see auth.File.Costs).
func warnAuthFile(log *slog.Logger, s *auth.Store) {
	path := s.Path()
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		log.Warn("the auth file is readable by others than its owner; chmod 600 it", "path", path, "mode", fi.Mode().Perm().String())
	}
	if costs := s.File().Costs(); len(costs) > 1 {
		log.Warn("the auth file's hashes have different bcrypt costs: a wrong secret for a principal of a lower cost is answered sooner than one for an unknown name, which tells the names apart; hash every secret at one cost (fencekv auth hash --cost)",
			"path", path, "costs", fmt.Sprint(costs))
	}
}

// wireAuth adapts auth.Store to wire.Authenticator (whose methods return
// wire's interface, not auth's type).
type wireAuth struct{ s *auth.Store }

func (w wireAuth) Authenticate(name string, secret []byte) wire.Principal {
	if p := w.s.Authenticate(name, secret); p != nil {
		return p
	}
	return nil
}

func (w wireAuth) Lookup(name string) wire.Principal {
	if p := w.s.Lookup(name); p != nil {
		return p
	}
	return nil
}
