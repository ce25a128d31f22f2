//go:build tools

// Package cluster exists only to build the local control plane's binaries from their
// Go modules; these imports keep the commands in go.mod.
package cluster

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kubectl"
)
