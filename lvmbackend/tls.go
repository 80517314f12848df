package lvmbackend

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// LoadClientTLS builds a client TLS configuration for google/lvmd's optional
// mutual TLS: certFile and keyFile (both or neither) are the client's
// certificate and key, caFile (optional; the system roots otherwise) verifies
// the server.
func LoadClientTLS(certFile, keyFile, caFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("client TLS: certificate %q and key %q must be given together", certFile, keyFile)
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("client TLS: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("client TLS: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("client TLS: no PEM certificate in %s", caFile)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}
