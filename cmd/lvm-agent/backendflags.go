package main

import "flag"

// backendFlags choose and reach lvmd: the agent's flags, and "volume
// status"'s (which adds the dialect "none").
type backendFlags struct {
	backend, lvmdSocket, lvmdAddress string
	tlsCert, tlsKey, tlsCA           string
}

// addFlags declares the flags; dialects is --backend's list of values.
func (b *backendFlags) addFlags(fs *flag.FlagSet, dialects string) {
	fs.StringVar(&b.backend, "backend", "topolvm", "lvmd dialect: "+dialects)
	fs.StringVar(&b.lvmdSocket, "lvmd-socket", "/run/topolvm/lvmd.sock", "topolvm lvmd's unix socket")
	fs.StringVar(&b.lvmdAddress, "lvmd-address", "127.0.0.1:1234", "google/lvmd's host:port")
	fs.StringVar(&b.tlsCert, "lvmd-tls-cert", "", "google/lvmd: client certificate for mTLS")
	fs.StringVar(&b.tlsKey, "lvmd-tls-key", "", "google/lvmd: client key for mTLS")
	fs.StringVar(&b.tlsCA, "lvmd-tls-ca", "", "google/lvmd: CA that signed the server's certificate")
}
