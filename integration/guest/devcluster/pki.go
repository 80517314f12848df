//go:build guest

package main

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"flag"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/client-go/util/cert"
	"k8s.io/client-go/util/keyutil"
)

// A client identity of the one-node cluster: its kubeconfig file, user and groups.
// The groups are the ones Kubernetes' bootstrap RBAC and Node authorizer grant.
type identity struct{ file, user, group string }

// pki writes what the guest's one-node cluster (scripts/guest/cluster.sh)
// needs to run with authentication and authorization on, as a real cluster
// does: a CA, the API server's serving certificate (valid for the node's
// address and for the `kubernetes` Service's ClusterIP, which pods dial), a
// client certificate for the API server to reach kubelet, the service-account
// signing key, and a kubeconfig per component. envtest's certificates are
// valid for loopback only, which no pod can reach.
func pki(args []string) error {
	fs := flag.NewFlagSet("pki", flag.ExitOnError)
	dir := fs.String("dir", "", "where to write the files (required)")
	nodeIP := fs.String("node-ip", "", "the node's address, which the API server advertises (required)")
	node := fs.String("node", "", "the node's name (required)")
	serviceIP := fs.String("service-ip", "10.96.0.1", "the kubernetes Service's ClusterIP")
	_ = fs.Parse(args)
	ip, svc := net.ParseIP(*nodeIP), net.ParseIP(*serviceIP)
	if *dir == "" || ip == nil || svc == nil || *node == "" {
		return fmt.Errorf("pki: --dir, --node-ip and --node are required")
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	ca, err := cert.NewSelfSignedCACert(cert.Config{CommonName: "lvm-agent-guest-ca"}, caKey)
	if err != nil {
		return err
	}
	if err := writePair(*dir, "ca", ca, caKey); err != nil {
		return err
	}
	issue := func(name string, cfg cert.Config, usage x509.ExtKeyUsage) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
		if err != nil {
			return err
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial,
			Subject:      pkix.Name{CommonName: cfg.CommonName, Organization: cfg.Organization},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(365 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  cfg.AltNames.IPs,
			DNSNames:     cfg.AltNames.DNSNames,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return err
		}
		return writePair(*dir, name, c, key)
	}
	err = issue("apiserver", cert.Config{CommonName: "kube-apiserver", AltNames: cert.AltNames{
		IPs:      []net.IP{ip, svc, net.IPv4(127, 0, 0, 1)},
		DNSNames: []string{*node, "localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc.cluster.local"},
	}}, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return err
	}
	if err := issue("apiserver-kubelet-client", cert.Config{CommonName: "kube-apiserver-kubelet-client", Organization: []string{"system:masters"}}, x509.ExtKeyUsageClientAuth); err != nil {
		return err
	}
	saKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	// The API server reads the public half from the same file (--service-account-key-file).
	if err := writeKey(filepath.Join(*dir, "sa.key"), saKey); err != nil {
		return err
	}
	server := "https://" + net.JoinHostPort(ip.String(), "6443")
	for _, id := range []identity{
		{"admin", "kubernetes-admin", "system:masters"},
		{"kubelet", "system:node:" + *node, "system:nodes"},
		{"scheduler", "system:kube-scheduler", ""},
		{"controller-manager", "system:kube-controller-manager", ""},
		{"kube-proxy", "system:kube-proxy", ""},
	} {
		cfg := cert.Config{CommonName: id.user}
		if id.group != "" {
			cfg.Organization = []string{id.group}
		}
		if err := issue(id.file, cfg, x509.ExtKeyUsageClientAuth); err != nil {
			return err
		}
		if err := writeKubeconfig(*dir, id.file, server); err != nil {
			return err
		}
	}
	fmt.Printf("lvm-devcluster: PKI and kubeconfigs in %s (API server %s)\n", *dir, server)
	return nil
}

func writePair(dir, name string, c *x509.Certificate, key crypto.Signer) error {
	pem, err := cert.EncodeCertificates(c)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, name+".crt"), pem, 0o600); err != nil {
		return err
	}
	return writeKey(filepath.Join(dir, name+".key"), key)
}

func writeKey(file string, key crypto.Signer) error {
	pem, err := keyutil.MarshalPrivateKeyToPEM(key)
	if err != nil {
		return err
	}
	return os.WriteFile(file, pem, 0o600)
}

// writeKubeconfig writes DIR/NAME.conf: the cluster's CA and NAME's client pair, by path.
func writeKubeconfig(dir, name, server string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["guest"] = &clientcmdapi.Cluster{Server: server, CertificateAuthority: filepath.Join(abs, "ca.crt")}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificate: filepath.Join(abs, name+".crt"),
		ClientKey:         filepath.Join(abs, name+".key"),
	}
	cfg.Contexts["guest"] = &clientcmdapi.Context{Cluster: "guest", AuthInfo: name}
	cfg.CurrentContext = "guest"
	return clientcmd.WriteToFile(*cfg, filepath.Join(dir, name+".conf"))
}
