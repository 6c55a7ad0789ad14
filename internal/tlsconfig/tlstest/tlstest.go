// Package tlstest makes certificates for tests: a CA, and server and client
// certificates it signs, written as PEM files. For tests only.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

var serial atomic.Int64

// CA is a certificate authority of a test.
type CA struct {
	Cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate's PEM file.
	File string
}

// NewCA makes a CA named name and writes its certificate in dir.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := template(name)
	tmpl.IsCA = true
	tmpl.BasicConstraintsValid = true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &CA{Cert: cert, key: key, File: filepath.Join(dir, name+".pem")}
	writePEM(t, ca.File, "CERTIFICATE", der)
	return ca
}

// Issue makes a certificate for name (its common name and a DNS SAN), with
// the extra SANs given (IP addresses are recognised), usable by servers and
// clients, and writes name.crt and name.key in dir.
func (ca *CA) Issue(t testing.TB, dir, name string, sans ...string) (certFile, keyFile string) {
	t.Helper()
	key := newKey(t)
	tmpl := template(name)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	tmpl.DNSNames = []string{name}
	for _, s := range sans {
		if ip := net.ParseIP(s); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, s)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kb)
	return certFile, keyFile
}

// Mutual is what a test of mutual TLS needs: a CA, a certificate for a
// server and one for a client, all written in Dir.
type Mutual struct {
	Dir string
	CA  *CA
	// ServerName is the server certificate's name.
	ServerName string
	// CertFile and KeyFile are the server's certificate, valid for
	// ServerName and 127.0.0.1.
	CertFile, KeyFile string
	// ClientCertFile and ClientKeyFile are the client's certificate.
	ClientCertFile, ClientKeyFile string
}

// NewMutual makes, in a new temporary directory of t, a CA named "ca", a
// certificate for server (valid at 127.0.0.1 too) and one for client.
func NewMutual(t testing.TB, server, client string) *Mutual {
	t.Helper()
	m := &Mutual{Dir: t.TempDir(), ServerName: server}
	m.CA = NewCA(t, m.Dir, "ca")
	m.CertFile, m.KeyFile = m.CA.Issue(t, m.Dir, server, "127.0.0.1")
	m.ClientCertFile, m.ClientKeyFile = m.CA.Issue(t, m.Dir, client)
	return m
}

// template is what every certificate of a test has: a new serial number,
// the common name, and a day's validity that began an hour ago.
func template(name string) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: big.NewInt(serial.Add(1)),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return key
}

// writePEM writes the file through a rename, as a certificate rotation
// does, so that a reader never sees half a file.
func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}
