#!/usr/bin/env bash
# Builds helm from its Go module (this directory's go.mod pins the version) into the cache
# outside the clone, once per go.sum, and prints the binary's path on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/cluster/env.sh
source "$here/../cluster/env.sh"

bin="$COXSWAIN_CACHE/helm/helm-$(sha256sum "$here/go.sum" | cut -c1-16)"
if [[ ! -x "$bin" ]]; then
  echo "building helm into $bin (cold: a few minutes)" >&2
  mkdir -p "$(dirname "$bin")"
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bin.tmp" helm.sh/helm/v4/cmd/helm)
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
