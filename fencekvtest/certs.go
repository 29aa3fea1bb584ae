package fencekvtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority made for one test (ECDSA P-256), for
// TLS tests that need certificates without files or tools from outside.
type CA struct {
	Cert *x509.Certificate
	Key  *ecdsa.PrivateKey
	PEM  []byte // the CA certificate, PEM-encoded
	Pool *x509.CertPool
}

// NewCA makes a CA called name, valid from an hour ago for a day.
func NewCA(tb testing.TB, name string) *CA {
	tb.Helper()
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(tb),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{Cert: cert, Key: key, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), Pool: pool}
}

// CertOptions tune Issue. Zero fields take the defaults: IPs 127.0.0.1,
// DNS localhost, valid from an hour ago for a day.
type CertOptions struct {
	IPs       []net.IP
	DNS       []string
	NotBefore time.Time
	NotAfter  time.Time
}

// Cert is a certificate and its key, parsed and PEM-encoded.
type Cert struct {
	TLS     tls.Certificate
	CertPEM []byte
	KeyPEM  []byte
}

// Issue makes a certificate for common name cn, usable both by a server
// and by a client (so by a cluster node, which is both).
func (ca *CA) Issue(tb testing.TB, cn string, o *CertOptions) *Cert {
	tb.Helper()
	var opt CertOptions
	if o != nil {
		opt = *o
	}
	if opt.IPs == nil && opt.DNS == nil {
		opt.IPs, opt.DNS = []net.IP{net.IPv4(127, 0, 0, 1)}, []string{"localhost"}
	}
	if opt.NotBefore.IsZero() {
		opt.NotBefore = time.Now().Add(-time.Hour)
	}
	if opt.NotAfter.IsZero() {
		opt.NotAfter = time.Now().Add(24 * time.Hour)
	}
	key := newKey(tb)
	tmpl := &x509.Certificate{
		SerialNumber: serial(tb),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    opt.NotBefore,
		NotAfter:     opt.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  opt.IPs,
		DNSNames:     opt.DNS,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		tb.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	c := &Cert{
		CertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		KeyPEM:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}
	if c.TLS, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		tb.Fatal(err)
	}
	return c
}

// WriteFile writes the CA certificate to dir/name and returns the path.
func (ca *CA) WriteFile(tb testing.TB, dir, name string) string {
	tb.Helper()
	return writeFile(tb, filepath.Join(dir, name), ca.PEM)
}

// WriteFiles writes the certificate and key to dir/name.crt and
// dir/name.key and returns the paths.
func (c *Cert) WriteFiles(tb testing.TB, dir, name string) (certPath, keyPath string) {
	tb.Helper()
	return writeFile(tb, filepath.Join(dir, name+".crt"), c.CertPEM), writeFile(tb, filepath.Join(dir, name+".key"), c.KeyPEM)
}

func writeFile(tb testing.TB, path string, b []byte) string {
	tb.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

func newKey(tb testing.TB) *ecdsa.PrivateKey {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	return key
}

func serial(tb testing.TB) *big.Int {
	tb.Helper()
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		tb.Fatal(err)
	}
	return n
}
