//go:build tools

// Package olmruntime exists only to build OLM v0 (the olm and catalog operators) and opm from
// their Go modules, for `make olm-up` and `make olm-e2e`; these imports keep the commands in
// go.mod. A module of its own, so hack/olm's validator keeps its pins.
package olmruntime

import (
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/catalog"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/olm"
	_ "github.com/operator-framework/operator-lifecycle-manager/cmd/package-server"
	_ "github.com/operator-framework/operator-registry/cmd/opm"
)
