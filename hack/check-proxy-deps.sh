#!/usr/bin/env bash
# Fails when the proxy crate's normal dependency graph contains kube's client or runtime:
# the data plane holds zero Kubernetes API credentials, and the crate graph enforces it.
set -euo pipefail
crate="${1:-coxswain-proxy}"
# The kube facade itself is fine (types and derives); its client and runtime are not.
forbidden='^(kube-client|kube-runtime) v'
tree="$(cargo tree -p "$crate" -e normal --prefix none --no-dedupe)"
if hits="$(grep -E "$forbidden" <<<"$tree" | sort -u)" && [[ -n "$hits" ]]; then
  echo "check-proxy-deps: $crate depends on a Kubernetes client or runtime:" >&2
  echo "$hits" >&2
  echo "check-proxy-deps: path to it:" >&2
  cargo tree -p "$crate" -e normal -i "$(head -n1 <<<"$hits" | cut -d' ' -f1)" >&2 || true
  exit 1
fi
echo "check-proxy-deps: $crate has no kube client or runtime in its graph ($(sort -u <<<"$tree" | wc -l) crates)"
