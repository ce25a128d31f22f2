// Package conformance runs the Gateway API conformance suite, at the release whose CRDs the
// local cluster installs, against Coxswain. Options come from the suite's own flags (see
// run.sh); supported features are read from the GatewayClass's status.supportedFeatures.
package conformance

import (
	"testing"

	"sigs.k8s.io/gateway-api/conformance"
)

func TestConformance(t *testing.T) {
	conformance.RunConformance(t)
}
