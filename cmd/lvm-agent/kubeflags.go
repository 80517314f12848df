package main

import (
	"flag"
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeFlags are kubectl's usual connection flags for "lvm-agent volume",
// resolved by client-go's own loading rules: --kubeconfig, else
// $KUBECONFIG (a colon-separated list, merged), else ~/.kube/config, else
// the in-cluster config.
type kubeFlags struct {
	kubeconfig, context, namespace string
}

func (k *kubeFlags) addFlags(fs *flag.FlagSet, withNamespace bool) {
	fs.StringVar(&k.kubeconfig, "kubeconfig", "", "kubeconfig file (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)")
	fs.StringVar(&k.context, "context", "", "kubeconfig context (default: the current context)")
	if withNamespace {
		const usage = "PVC namespace (default: the context's namespace, else \"default\")"
		fs.StringVar(&k.namespace, "namespace", "", usage)
		fs.StringVar(&k.namespace, "n", "", usage)
	}
}

func (k kubeFlags) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = k.kubeconfig
	overrides := &clientcmd.ConfigOverrides{CurrentContext: k.context}
	overrides.Context.Namespace = k.namespace
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, overrides)
}

func (k kubeFlags) restConfig() (*rest.Config, error) {
	cfg, err := k.clientConfig().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	return cfg, nil
}

// ns is the namespace to use: -n, else the context's, else "default".
func (k kubeFlags) ns() (string, error) {
	ns, _, err := k.clientConfig().Namespace()
	if err != nil {
		return "", fmt.Errorf("kubernetes client config: %w", err)
	}
	return ns, nil
}
