package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
)

// DefaultCheckInterval is the default of Options.CheckInterval.
const DefaultCheckInterval = time.Second

// ErrNoCertificate is returned for a server configuration without both a
// certificate and a key file.
var ErrNoCertificate = errors.New("tlsconfig: a certificate file and a key file are both required")

// ErrSANNotAllowed is returned by the verification of a client whose
// certificate names none of the allowed identities.
var ErrSANNotAllowed = errors.New("tlsconfig: client certificate not allowed")

// Options configure a server's TLS. CertFile and KeyFile are required.
type Options struct {
	// CertFile and KeyFile are the server's PEM certificate chain and key.
	CertFile, KeyFile string
	// ClientCAFile, when set, turns on client-certificate verification
	// against the PEM CA bundle it names (mutual TLS): a client without a
	// certificate it signed is refused during the handshake.
	ClientCAFile string
	// AllowedSANs, with ClientCAFile, restricts clients to certificates
	// naming one of these identities (a DNS name, URI, email or IP
	// address SAN, or the subject's common name); empty allows any client
	// the CA signed.
	AllowedSANs []string
	// CheckInterval is the least time between two checks of the files;
	// 0 means DefaultCheckInterval.
	CheckInterval time.Duration
	// Now is the clock of the checks; nil means time.Now.
	Now func() time.Time
}

// Server is a server TLS configuration whose certificate and client CA
// follow their files. Safe for concurrent use; create it with NewServer.
type Server struct {
	opts Options

	mu      sync.Mutex
	checked time.Time
	stamp   [3]fileStamp
	cert    *tls.Certificate
	pool    *x509.CertPool
	err     error // the last failed reload, nil after a good one
}

type fileStamp struct {
	size int64
	mod  time.Time
}

// NewServer loads the files once (an error names the file at fault) and
// returns the reloading configuration.
func NewServer(opts Options) (*Server, error) {
	if opts.CertFile == "" || opts.KeyFile == "" {
		return nil, ErrNoCertificate
	}
	if len(opts.AllowedSANs) > 0 && opts.ClientCAFile == "" {
		return nil, errors.New("tlsconfig: allowed client SANs need a client CA file")
	}
	if opts.CheckInterval <= 0 {
		opts.CheckInterval = DefaultCheckInterval
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Server{opts: opts}
	if err := s.load(); err != nil {
		return nil, err
	}
	s.checked = opts.Now()
	return s, nil
}

func (s *Server) files() [3]string {
	return [3]string{s.opts.CertFile, s.opts.KeyFile, s.opts.ClientCAFile}
}

// load reads every file; on success it replaces the certificate and pool.
// mu is held, or s is not shared yet.
func (s *Server) load() error {
	var stamp [3]fileStamp
	for i, f := range s.files() {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return fmt.Errorf("tlsconfig: %w", err)
		}
		stamp[i] = fileStamp{fi.Size(), fi.ModTime()}
	}
	cert, err := tls.LoadX509KeyPair(s.opts.CertFile, s.opts.KeyFile)
	if err != nil {
		return fmt.Errorf("tlsconfig: certificate %s, key %s: %w", s.opts.CertFile, s.opts.KeyFile, err)
	}
	var pool *x509.CertPool
	if s.opts.ClientCAFile != "" {
		if pool, err = LoadPool(s.opts.ClientCAFile); err != nil {
			return err
		}
	}
	s.cert, s.pool, s.stamp, s.err = &cert, pool, stamp, nil
	return nil
}

// refresh reloads the files if the check interval has passed and a file
// changed. It keeps the last good state when the reload fails.
func (s *Server) refresh() (*tls.Certificate, *x509.CertPool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opts.Now()
	if now.Sub(s.checked) < s.opts.CheckInterval {
		return s.cert, s.pool
	}
	s.checked = now
	changed := false
	for i, f := range s.files() {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			s.err = fmt.Errorf("tlsconfig: %w", err)
			return s.cert, s.pool
		}
		if (fileStamp{fi.Size(), fi.ModTime()}) != s.stamp[i] {
			changed = true
		}
	}
	if changed {
		if err := s.load(); err != nil {
			s.err = err
		}
	}
	return s.cert, s.pool
}

// Err is the last reload's error (nil when the files in use are the
// current ones).
func (s *Server) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Config returns the tls.Config of a listener: TLS 1.2 or later, the
// current certificate at every handshake, and with a client CA the
// verification of client certificates (and of their SANs).
//
// Handshakes use the config GetConfigForClient builds, with the files'
// current contents. The returned config's own ClientAuth, ClientCAs and
// VerifyPeerCertificate say the same as that one's (ClientCAs as loaded when
// Config was called), so that a caller can tell that it verifies clients.
func (s *Server) Config() *tls.Config {
	top := &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cert, pool := s.refresh()
			c := &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*cert},
				NextProtos:   []string{"h2", "http/1.1"},
			}
			if pool != nil {
				c.ClientAuth = tls.RequireAndVerifyClientCert
				c.ClientCAs = pool
				if len(s.opts.AllowedSANs) > 0 {
					c.VerifyPeerCertificate = s.verifySAN
				}
			}
			return c, nil
		},
	}
	if s.opts.ClientCAFile != "" {
		s.mu.Lock()
		top.ClientAuth, top.ClientCAs = tls.RequireAndVerifyClientCert, s.pool
		s.mu.Unlock()
		if len(s.opts.AllowedSANs) > 0 {
			top.VerifyPeerCertificate = s.verifySAN
		}
	}
	return top
}

// verifySAN runs after the chain was verified against the client CA.
func (s *Server) verifySAN(_ [][]byte, chains [][]*x509.Certificate) error {
	if len(chains) == 0 || len(chains[0]) == 0 {
		return ErrSANNotAllowed
	}
	for _, id := range Identities(chains[0][0]) {
		if slices.Contains(s.opts.AllowedSANs, id) {
			return nil
		}
	}
	return fmt.Errorf("%w: %v", ErrSANNotAllowed, Identities(chains[0][0]))
}

// Identities are the names a certificate vouches for: its DNS, URI, email
// and IP address SANs, then its subject's common name.
func Identities(c *x509.Certificate) []string {
	var ids []string
	ids = append(ids, c.DNSNames...)
	for _, u := range c.URIs {
		ids = append(ids, u.String())
	}
	ids = append(ids, c.EmailAddresses...)
	for _, ip := range c.IPAddresses {
		ids = append(ids, ip.String())
	}
	if c.Subject.CommonName != "" {
		ids = append(ids, c.Subject.CommonName)
	}
	return ids
}

// LoadPool reads a PEM CA bundle.
func LoadPool(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("tlsconfig: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("tlsconfig: %s: no PEM certificate", file)
	}
	return pool, nil
}

// ClientOptions configure a client's TLS: all optional.
type ClientOptions struct {
	// CAFile is a PEM bundle of the CAs that sign the server's
	// certificate; empty means the system's roots.
	CAFile string
	// CertFile and KeyFile are a client certificate for mutual TLS (both
	// or neither).
	CertFile, KeyFile string
	// ServerName overrides the name checked in the server's certificate.
	ServerName string
	// InsecureSkipVerify checks no server certificate (tests only).
	InsecureSkipVerify bool
	// SkipHostname verifies the server's certificate chain against the CAs
	// but not the name in it (envoyproxy/ratelimit's
	// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION).
	SkipHostname bool
}

// Client returns the tls.Config of a client (TLS 1.2 or later).
func Client(o ClientOptions) (*tls.Config, error) {
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName, InsecureSkipVerify: o.InsecureSkipVerify}
	if o.CAFile != "" {
		pool, err := LoadPool(o.CAFile)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	if (o.CertFile == "") != (o.KeyFile == "") {
		return nil, errors.New("tlsconfig: a client certificate needs both its certificate and key files")
	}
	if o.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tlsconfig: client certificate %s, key %s: %w", o.CertFile, o.KeyFile, err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	if o.SkipHostname && !o.InsecureSkipVerify {
		// Go checks the chain and the name together; skip both, then check
		// the chain alone, on every handshake (resumed ones too).
		c.InsecureSkipVerify = true
		roots := c.RootCAs
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			return verifyChain(cs.PeerCertificates, roots)
		}
	}
	return c, nil
}

// verifyChain verifies certs (the leaf first, then intermediates) against
// roots (nil: the system's), for a server, naming no host.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool) error {
	if len(certs) == 0 {
		return errors.New("tlsconfig: the server sent no certificate")
	}
	opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, c := range certs[1:] {
		opts.Intermediates.AddCert(c)
	}
	if _, err := certs[0].Verify(opts); err != nil {
		return fmt.Errorf("tlsconfig: server certificate: %w", err)
	}
	return nil
}
