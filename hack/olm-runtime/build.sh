#!/usr/bin/env bash
# Builds OLM v0's two operators (olm, catalog), its packageserver and opm from their Go modules (this directory's
# go.mod) into a cache outside the clone, keyed by their versions and go.sum, and the e2e's
# traffic client (./traffic); reuses binaries already there. Prints the bin directory on stdout; progress goes to stderr.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/olm-runtime/env.sh
source "$here/env.sh"

mkdir -p "$OLM_BIN"
cd "$here"
stamp="$OLM_BIN/.built-$(sha256sum go.sum | cut -c1-16)"
for b in olm catalog package-server opm; do
  [[ -x "$OLM_BIN/$b" ]] || rm -f "$stamp"
done
if [[ ! -f "$stamp" ]]; then
  start=$(date +%s)
  echo "building OLM $OLM_VERSION (olm, catalog, package-server) and opm $OPM_VERSION into $OLM_BIN (cold: several minutes)" >&2
  # Static, no cgo: json1 is the SQLite feature the registry code asks for by tag, and
  # containers_image_openpgp replaces gpgme (a C library) for image signatures we never verify.
  flags=(-trimpath -ldflags="-s -w" -tags "json1,containers_image_openpgp")
  CGO_ENABLED=0 go build "${flags[@]}" -o "$OLM_BIN/olm" \
    github.com/operator-framework/operator-lifecycle-manager/cmd/olm
  CGO_ENABLED=0 go build "${flags[@]}" -o "$OLM_BIN/catalog" \
    github.com/operator-framework/operator-lifecycle-manager/cmd/catalog
  CGO_ENABLED=0 go build "${flags[@]}" -o "$OLM_BIN/package-server" \
    github.com/operator-framework/operator-lifecycle-manager/cmd/package-server
  CGO_ENABLED=0 go build "${flags[@]}" -o "$OLM_BIN/opm" \
    github.com/operator-framework/operator-registry/cmd/opm
  rm -f "$OLM_BIN"/.built-*
  touch "$stamp"
  echo "built in $(( $(date +%s) - start ))s" >&2
fi
# The e2e's traffic client (standard library only), rebuilt when its source changes.
traffic_stamp="$OLM_BIN/.traffic-$(cat traffic/*.go | sha256sum | cut -c1-16)"
if [[ ! -f "$traffic_stamp" || ! -x "$OLM_BIN/traffic" ]]; then
  CGO_ENABLED=0 go build -trimpath -o "$OLM_BIN/traffic" ./traffic
  rm -f "$OLM_BIN"/.traffic-*
  touch "$traffic_stamp"
fi
echo "$OLM_BIN"
