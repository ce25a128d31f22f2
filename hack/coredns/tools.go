//go:build tools

// Package tools pins CoreDNS, which the Gateway API conformance suite's base manifests deploy
// (for UDPRoute tests), so the test node can run its image as a local process.
package tools

import _ "github.com/coredns/coredns"
