//go:build tools

// Package tools pins the Gateway API conformance echo server, the backend the conformance
// suite deploys, so the test node can run its image as a local process.
package tools

import _ "sigs.k8s.io/gateway-api/conformance/echo-basic"
