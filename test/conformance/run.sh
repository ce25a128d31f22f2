#!/usr/bin/env bash
# `make conformance`: the Gateway API conformance suite (the release pinned in go.mod, which is
# the one hack/cluster installs) against Coxswain installed from config/default on a local
# cluster with the test node. Profiles GATEWAY-HTTP, GATEWAY-GRPC and GATEWAY-TLS; features come from the
# GatewayClass's status.supportedFeatures. Writes the report to reports/ and the full log next to it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
# shellcheck source=hack/cluster/env.sh
source hack/cluster/env.sh
# An instance of its own, beside `make cluster-up`'s.
export COXSWAIN_CLUSTER_DIR="${COXSWAIN_CONFORMANCE_CLUSTER_DIR:-$COXSWAIN_CACHE/clusters/conformance}"
# Fixed ports so a rerun finds the instance again; override to run two side by side.
export COXSWAIN_ETCD_PORT="${COXSWAIN_CONFORMANCE_ETCD_PORT:-24790}"
export COXSWAIN_ETCD_PEER_PORT="${COXSWAIN_CONFORMANCE_ETCD_PEER_PORT:-24791}"
export COXSWAIN_APISERVER_PORT="${COXSWAIN_CONFORMANCE_APISERVER_PORT:-27443}"
export COXSWAIN_KCM_PORT="${COXSWAIN_CONFORMANCE_KCM_PORT:-27457}"
target="${CARGO_TARGET_DIR:-$repo/target}"
profiles="${COXSWAIN_CONFORMANCE_PROFILES:-GATEWAY-HTTP,GATEWAY-GRPC,GATEWAY-TLS}"
version="v$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)"
# dedicated (default): every Gateway gets a proxy of its own (gatewayclass.yaml); shared: every
# Gateway is served by the shared pool (gatewayclass-shared.yaml), reported beside the first.
pool="${COXSWAIN_CONFORMANCE_POOL:-dedicated}"
case "$pool" in
  dedicated) class_file="$here/gatewayclass.yaml"; mode=default ;;
  shared) class_file="$here/gatewayclass-shared.yaml"; mode=shared-pool ;;
  *) echo "COXSWAIN_CONFORMANCE_POOL must be dedicated or shared, not $pool" >&2; exit 2 ;;
esac
report="${COXSWAIN_CONFORMANCE_REPORT:-$here/reports/$GATEWAY_API_VERSION/coxswain/${GATEWAY_API_CHANNEL}-${version}-${mode}-report.yaml}"
mkdir -p "$(dirname "$report")"

cargo build --quiet -p coxswain-operator --bin coxswain -p coxswain-testenv --bin coxswain-node
export COXSWAIN_NODE_BIN="$target/debug/coxswain-node"
export COXSWAIN_NODE_IMAGES="coxswain=$target/debug/coxswain"
kubeconfig="$(hack/cluster/up.sh)"
# GatewayStaticAddresses: the test node's LoadBalancer provider honours a requested address
# in its pool, 10.97.N.0/24 (N: this instance's network index), and refuses any other.
net="$(cat "$COXSWAIN_CLUSTER_DIR/run/net-index")"
# CI stops the cluster when done; by hand it is left running for inspection.
if [[ "${COXSWAIN_CONFORMANCE_TEARDOWN:-0}" == 1 ]]; then
  trap 'hack/cluster/down.sh >&2 || true' EXIT
fi
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$kubeconfig" "$@"; }
kubectl apply --server-side --force-conflicts -k config/default >&2
kubectl -n coxswain-system rollout status deployment/coxswain-controller --timeout 180s >&2
kubectl apply --server-side --force-conflicts -f "$class_file" >&2
kubectl wait --for condition=Accepted --timeout 120s gatewayclass/coxswain >&2

bin="$COXSWAIN_CACHE/conformance/conformance-$GATEWAY_API_VERSION.test"
mkdir -p "$(dirname "$bin")"
(cd "$here" && go test -c -o "$bin" .)
started=$(date +%s)
set +e
KUBECONFIG="$kubeconfig" "$bin" -test.run TestConformance -test.v -test.timeout 90m \
  --gateway-class=coxswain \
  --conformance-profiles="$profiles" \
  --organization=coxswain-labs --project=coxswain \
  --url=https://github.com/coxswain-labs/coxswain --version="$version" \
  --contact=https://github.com/coxswain-labs/coxswain/issues \
  --report-output="$report" \
  --usable-address="10.97.$net.250" --unusable-address="192.0.2.250" \
  ${COXSWAIN_CONFORMANCE_ARGS:-} 2>&1 | tee "$COXSWAIN_CLUSTER_DIR/logs/conformance.log"
status=${PIPESTATUS[0]}
set -e
# The report records only tests within the profiles (and, up to v1.5, provisional ones); a
# claimed feature outside them (GRPCRouteNamedRouteRule in v1.6) is proven by the names of the
# tests that passed, kept beside the report for operator/tests/supported_features.rs.
sed -n 's|^    --- PASS: TestConformance/\([^/ ]*\) .*|\1|p' "$COXSWAIN_CLUSTER_DIR/logs/conformance.log" \
  | sort > "${report%-report.yaml}-passed-tests.txt"
echo "conformance: exit $status after $(( $(date +%s) - started ))s; report $report; log $COXSWAIN_CLUSTER_DIR/logs/conformance.log" >&2
if [[ "${COXSWAIN_CONFORMANCE_TEARDOWN:-0}" != 1 ]]; then
  echo "conformance: the cluster is left running; stop it with COXSWAIN_CLUSTER_DIR=$COXSWAIN_CLUSTER_DIR hack/cluster/down.sh" >&2
fi
(( status == 0 )) || exit "$status"
"$here/check-report.sh" "$report"
