#!/usr/bin/env bash
# Every dashboard panel's query returns data on the demo cluster: scrapes the /metrics of the
# controller replicas (:8083), the shared pool and the dedicated proxies (:8081) of the cluster
# `make demo` started, while a client sends requests through both proxies (some to an unknown
# host: 404s) and an HTTPRoute is touched (compiles, status writes, snapshot swaps), then
# evaluates each query of config/monitoring with Prometheus' engine (hack/promql) at the last
# scrape. Fails, naming the queries, when one returns no series. Alerts are evaluated too and
# reported as firing or quiet.
# Usage: hack/monitoring/check-queries.sh   (after `make demo`; `make demo-metrics` does both)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
# shellcheck source=hack/cluster/env.sh
source hack/cluster/env.sh
kubeconfig="$COXSWAIN_CLUSTER_DIR/kubeconfig"
[[ -f "$kubeconfig" ]] || { echo "no demo cluster at $COXSWAIN_CLUSTER_DIR: run make demo first" >&2; exit 1; }
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$kubeconfig" "$@"; }
promql="$(hack/promql/build.sh)"

# job=URL for every running Pod of a component (their IPs are reachable from this host).
targets=()
add_targets() { # job namespace|--all-namespaces component port
  local job=$1 ns=$2 component=$3 port=$4 ip scope=(--all-namespaces)
  [[ "$ns" == --all-namespaces ]] || scope=(--namespace "$ns")
  for ip in $(kubectl get pods "${scope[@]}" -l "app.kubernetes.io/component=$component" \
      --field-selector status.phase=Running -o jsonpath='{.items[*].status.podIP}'); do
    targets+=(-target "$job=http://$ip:$port/metrics")
  done
}
add_targets controller coxswain-system controller 8083
add_targets proxy coxswain-system shared-proxy 8081
add_targets proxy --all-namespaces dedicated-proxy 8081
(( ${#targets[@]} >= 6 )) || { echo "expected controller and proxy Pods, found: ${targets[*]}" >&2; exit 1; }

lb() { kubectl -n "$1" get service "$2" -o jsonpath='{.status.loadBalancer.ingress[0].ip}'; }
pool_ip="$(lb coxswain-system coxswain-proxy)"
# The shared Gateway's own address (its Service in coxswain-system), as its status reports it.
shared_ip="$(kubectl -n demo get gateway shared -o jsonpath='{.status.addresses[0].value}')"
dedicated_ip="$(lb demo dedicated-coxswain)"

# Traffic and changes while the scrapes run; bounded in time, and stopped on exit.
traffic() {
  local end=$((SECONDS + 40)) i=0
  while (( SECONDS < end )); do
    curl -s -o /dev/null --max-time 2 -H 'Host: gateway.demo.example' "http://$shared_ip/hello" || true
    curl -s -o /dev/null --max-time 2 -H 'Host: ingress.demo.example' "http://$pool_ip/ingress" || true
    curl -s -o /dev/null --max-time 2 -H 'Host: nobody.demo.example' "http://$shared_ip/missing" || true
    curl -s -o /dev/null --max-time 2 "http://$dedicated_ip:8080/dedicated" || true
    if (( i++ % 20 == 0 )); then
      kubectl -n demo annotate httproute echo --overwrite "demo.coxswain-labs.dev/touched=$i" >/dev/null
    fi
    sleep 0.1
  done
}
traffic &
traffic_pid=$!
trap 'kill "$traffic_pid" 2>/dev/null || true' EXIT
sleep 2
"$promql" eval -scrapes 5 -interval 4s "${targets[@]}" \
  config/monitoring/dashboards/*.json config/monitoring/prometheusrule.yaml
