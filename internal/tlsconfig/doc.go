// Package tlsconfig builds the TLS configurations of Charon's listeners and
// clients from PEM files: a server certificate reloaded when its files
// change (so that a cert-manager rotation needs no restart), optional
// client-certificate verification against a CA bundle (mutual TLS) with an
// optional allow-list of client identities (SANs), and client
// configurations with a private CA, a client certificate and a server name.
//
// Files are re-read lazily: a handshake checks, at most once per
// Options.CheckInterval, whether the files' size or modification time
// changed, and reloads them if so. A reload that fails (a half-written
// file) keeps the last good certificate and is retried at the next check;
// Server.Err reports it.
package tlsconfig
