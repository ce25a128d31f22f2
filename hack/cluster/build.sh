#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver, kube-controller-manager, kubectl) and
# the binaries the test node runs for images (echo-basic, CoreDNS) from their Go modules into a
# cache outside the clone, and reuses binaries already there.
# Prints the bin directory on stdout; progress goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/cluster/env.sh
source "$here/env.sh"

mkdir -p "$K8S_BIN"
cd "$here"
# Static, stripped, no VCS stamping: the binaries are test tooling, not releases. The
# Kubernetes ones carry their release in the version the API server reports (/version), as
# release builds do: clients such as OLM compare it with an operator's minKubeVersion.
k8s_minor="${K8S_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
version_pkg=k8s.io/component-base/version
k8s_ldflags="-s -w -X $version_pkg.gitVersion=$K8S_VERSION -X $version_pkg.gitMajor=1"
k8s_ldflags+=" -X $version_pkg.gitMinor=$k8s_minor -X $version_pkg.gitTreeState=clean"
# One stamp per go.sum and flags: a change of pinned versions or flags rebuilds everything.
stamp="$K8S_BIN/.built-$( (cat go.sum; echo "$k8s_ldflags") | sha256sum | cut -c1-16)"
if [[ -f "$stamp" ]]; then
  for b in etcd kube-apiserver kube-controller-manager kubectl; do
    [[ -x "$K8S_BIN/$b" ]] || { rm -f "$stamp"; break; }
  done
fi
if [[ ! -f "$stamp" ]]; then
  start=$(date +%s)
  echo "building Kubernetes $K8S_VERSION and etcd into $K8S_BIN (cold: several minutes)" >&2
  CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$K8S_BIN/etcd" ./cmd/etcd
  for cmd in kube-apiserver kube-controller-manager kubectl; do
    CGO_ENABLED=0 go build -trimpath -ldflags="$k8s_ldflags" -o "$K8S_BIN/$cmd" "k8s.io/kubernetes/cmd/$cmd"
  done
  rm -f "$K8S_BIN"/.built-*
  touch "$stamp"
  echo "built in $(( $(date +%s) - start ))s" >&2
fi
# Images the test node runs as local binaries, each from a Go module of its own (and stamp), so
# their dependency sets never move Kubernetes' versions: echo-basic (the conformance backends)
# and CoreDNS (the conformance suite's UDP backend).
build_tool() { # output module-dir package
  local out=$1 dir=$2 pkg=$3 name tool_stamp
  name="$(basename "$out")"
  tool_stamp="$(dirname "$out")/.$name-$(sha256sum "$dir/go.sum" | cut -c1-16)"
  if [[ ! -f "$tool_stamp" || ! -x "$out" ]]; then
    echo "building $name into $(dirname "$out")" >&2
    mkdir -p "$(dirname "$out")"
    (cd "$dir" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$out" "$pkg")
    rm -f "$(dirname "$out")/.$name-"*
    touch "$tool_stamp"
  fi
}
build_tool "$ECHO_BASIC_BIN" ../echo-basic sigs.k8s.io/gateway-api/conformance/echo-basic
build_tool "$K8S_BIN/coredns" ../coredns github.com/coredns/coredns
echo "$K8S_BIN"
