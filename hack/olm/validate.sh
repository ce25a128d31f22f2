#!/usr/bin/env bash
# Runs operator-framework's bundle validators (this directory's Go program) on a bundle
# directory. The program is built once per go.sum into the cache outside the clone.
# Usage: hack/olm/validate.sh [BUNDLE_DIR]   (default: bundle)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=hack/cluster/env.sh
source "$repo/hack/cluster/env.sh"
bundle="$(cd "${1:-$repo/bundle}" && pwd)"

bin="$COXSWAIN_CACHE/olm/olm-validate-$(cat "$here/go.sum" "$here"/*.go | sha256sum | cut -c1-16)"
if [[ ! -x "$bin" ]]; then
  echo "building the OLM bundle validator (operator-framework/api) into $bin" >&2
  mkdir -p "$(dirname "$bin")"
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -o "$bin.tmp" .)
  mv "$bin.tmp" "$bin"
fi
"$bin" "$bundle"
