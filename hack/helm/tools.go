//go:build tools

// Package helm exists only to build the helm command from its Go module (for `helm lint`,
// `helm template` and the chart's install test); this import keeps it in go.mod.
package helm

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
