#!/usr/bin/env bash
# Builds hack/promql (Prometheus' PromQL parser and engine, from their Go modules) into the
# cache outside the clone, once per source and go.sum, and prints the binary's path on stdout.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/cluster/env.sh
source "$here/../cluster/env.sh"

bin="$COXSWAIN_CACHE/promql/promql-$(cat "$here/go.sum" "$here"/*.go | sha256sum | cut -c1-16)"
if [[ ! -x "$bin" ]]; then
  echo "building hack/promql into $bin (cold: a few minutes)" >&2
  mkdir -p "$(dirname "$bin")"
  (cd "$here" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$bin.tmp" .)
  mv "$bin.tmp" "$bin"
fi
echo "$bin"
