package tlsconfig

import (
	"crypto/tls"
	"errors"
	"flag"
	"strings"
)

// ServerFlags are a listener's TLS settings as command-line flags.
type ServerFlags struct {
	Cert, Key, ClientCA, ClientSAN string
}

// Bind declares prefix+"cert", "key", "client-ca" and "client-san" on fs.
func (f *ServerFlags) Bind(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&f.Cert, prefix+"cert", f.Cert, "serve over TLS with this certificate chain PEM `file`, re-read when it changes")
	fs.StringVar(&f.Key, prefix+"key", f.Key, "the certificate's key PEM `file`")
	fs.StringVar(&f.ClientCA, prefix+"client-ca", f.ClientCA, "require client certificates signed by these CAs (PEM `file`): mutual TLS")
	fs.StringVar(&f.ClientSAN, prefix+"client-san", f.ClientSAN, "with the client CA, allow only client certificates naming one of these comma-separated `identities`")
}

// On reports whether TLS is asked for.
func (f *ServerFlags) On() bool { return f.Cert != "" || f.Key != "" }

// Check refuses settings that cannot work, naming the flags with prefix.
func (f *ServerFlags) Check(prefix string) error {
	switch {
	case (f.Cert == "") != (f.Key == ""):
		return errors.New("--" + prefix + "cert and --" + prefix + "key go together")
	case !f.On() && (f.ClientCA != "" || f.ClientSAN != ""):
		return errors.New("--" + prefix + "client-ca and --" + prefix + "client-san need --" + prefix + "cert and --" + prefix + "key")
	case f.ClientSAN != "" && f.ClientCA == "":
		return errors.New("--" + prefix + "client-san needs --" + prefix + "client-ca")
	}
	return nil
}

// Config loads the files (nil, nil when TLS is off).
func (f *ServerFlags) Config() (*tls.Config, error) {
	if !f.On() {
		return nil, nil
	}
	var sans []string
	for _, s := range strings.Split(f.ClientSAN, ",") {
		if s = strings.TrimSpace(s); s != "" {
			sans = append(sans, s)
		}
	}
	s, err := NewServer(Options{CertFile: f.Cert, KeyFile: f.Key, ClientCAFile: f.ClientCA, AllowedSANs: sans})
	if err != nil {
		return nil, err
	}
	return s.Config(), nil
}

// ClientFlags are a client's TLS settings as command-line flags.
type ClientFlags struct {
	// Force turns TLS on with no other setting (system roots).
	Force bool
	ClientOptions
}

// Bind declares prefix+"ca", "cert", "key", "server-name", "skip-verify"
// and "skip-hostname" on fs, each help naming what (the server verified).
func (f *ClientFlags) Bind(fs *flag.FlagSet, prefix, what string) {
	fs.StringVar(&f.CAFile, prefix+"ca", f.CAFile, "verify "+what+" with these CAs (PEM `file`); any "+prefix+"* flag turns TLS on")
	fs.StringVar(&f.CertFile, prefix+"cert", f.CertFile, "client certificate PEM `file`, for mutual TLS with "+what)
	fs.StringVar(&f.KeyFile, prefix+"key", f.KeyFile, "the client certificate's key PEM `file`")
	fs.StringVar(&f.ServerName, prefix+"server-name", f.ServerName, "name to check in "+what+"'s certificate")
	fs.BoolVar(&f.InsecureSkipVerify, prefix+"skip-verify", f.InsecureSkipVerify, "do not verify "+what+"'s certificate")
	fs.BoolVar(&f.SkipHostname, prefix+"skip-hostname", f.SkipHostname, "verify "+what+"'s certificate chain but not the name in it")
}

// On reports whether TLS is asked for.
func (f *ClientFlags) On() bool {
	return f.Force || f.CAFile != "" || f.CertFile != "" || f.KeyFile != "" || f.ServerName != "" || f.InsecureSkipVerify || f.SkipHostname
}

// Config loads the files (nil, nil when TLS is off).
func (f *ClientFlags) Config() (*tls.Config, error) {
	if !f.On() {
		return nil, nil
	}
	return Client(f.ClientOptions)
}
