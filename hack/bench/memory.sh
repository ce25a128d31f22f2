#!/usr/bin/env bash
# make bench-memory: the proxy's resident memory with 1,000, 5,000 and 20,000 HTTPRoutes and
# after 100 snapshot swaps (proxy/examples/memory.rs says what the snapshots hold), then route
# lookup time at 10 and 100,000 routes (the criterion bench `lookup`) and their ratio, read
# from criterion's estimates so the figure can be checked against target/criterion.
#
# The proxy is the release binary; the driver that writes snapshots and reads /proc runs in the
# dev profile (its speed only shows in ms/swap).
# Arguments: route counts (default 1000 5000 20000). Settings: COXSWAIN_BENCH_SWAPS (default
# 100), COXSWAIN_BENCH_THREADS (proxy worker threads; default one per CPU),
# BENCH_SKIP_LOOKUP=1 to measure memory only.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$repo/target}"
cd "$repo"

echo "building coxswain (release)" >&2
cargo build --release -q -p coxswain-operator --bin coxswain
cargo run -q -p coxswain-proxy --example memory -- "$target/release/coxswain" "$@"

[[ -n "${BENCH_SKIP_LOOKUP:-}" ]] && exit 0
echo "running the lookup benchmark (criterion)" >&2
cargo bench -q -p coxswain-proxy --bench lookup >&2
# Mean time of one iteration, in ns (an iteration asks 64 requests: proxy/benches/lookup.rs); criterion names the directory after the
# benchmark id with '/' replaced.
mean() {
  local f="$target/criterion/lookup_$1_routes/new/estimates.json"
  [[ -r "$f" ]] || { echo "no criterion estimates at $f" >&2; exit 1; }
  jq '.mean.point_estimate' "$f"
}
small=$(mean 10)
large=$(mean 100000)
awk -v a="$small" -v b="$large" 'BEGIN {
  printf "\nroute lookup (criterion mean, per request): %.1f ns at 10 routes, %.1f ns at 100,000 routes: ratio %.2f\n",
    a / 64, b / 64, b / a }'
