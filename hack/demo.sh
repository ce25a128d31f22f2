#!/usr/bin/env bash
# `make demo`: Coxswain for real on a local cluster. Starts the local control plane with the
# test node (Pods run as processes in network namespaces), installs Coxswain exactly as a user
# would without OLM (`kubectl apply -k config/default`: the controller and the shared proxy
# pool as Pods), deploys hack/demo/app.yaml, then sends real HTTP through the shared pool (an
# HTTPRoute and an Ingress) and through a Gateway's dedicated proxy, and shows the Gateway's
# status. Leaves everything running; `make cluster-down` stops it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cd "$repo"
# shellcheck source=hack/cluster/env.sh
source hack/cluster/env.sh
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "building coxswain and the test node"
target="${CARGO_TARGET_DIR:-$repo/target}"
cargo build --quiet -p coxswain-operator --bin coxswain -p coxswain-testenv --bin coxswain-node
export COXSWAIN_NODE_BIN="$target/debug/coxswain-node"
export COXSWAIN_NODE_IMAGES="coxswain=$target/debug/coxswain"

step "starting the local cluster (etcd, kube-apiserver, kube-controller-manager, test node)"
kubeconfig="$(hack/cluster/up.sh)"
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$kubeconfig" "$@"; }

step "installing Coxswain: kubectl apply -k config/default"
kubectl apply --server-side --force-conflicts -k config/default
kubectl -n coxswain-system rollout status deployment/coxswain-controller --timeout 180s
kubectl -n coxswain-system rollout status deployment/coxswain-proxy --timeout 180s
kubectl -n coxswain-system get pods -o wide

step "deploying the demo application (hack/demo/app.yaml)"
kubectl apply --server-side --force-conflicts -f hack/demo/app.yaml
kubectl -n demo rollout status deployment/echo --timeout 120s
kubectl -n demo wait --for condition=Programmed --timeout 180s gateway/shared gateway/dedicated

# Prints the first non-empty value of a jsonpath on an object, polled for up to 2 minutes.
poll_field() { # what namespace kind/name jsonpath
  local value=""
  for _ in $(seq 120); do
    value="$(kubectl -n "$2" get "$3" -o jsonpath="$4" 2>/dev/null || true)"
    [[ -n "$value" ]] && break
    sleep 1
  done
  [[ -n "$value" ]] || { echo "demo: no $1 for $2/$3" >&2; exit 1; }
  echo "$value"
}
lb() { # namespace service
  poll_field "LoadBalancer address" "$1" "service/$2" '{.status.loadBalancer.ingress[0].ip}'
}
# The Gateway on the shared pool has a Service (an address) of its own, which its status
# reports; Ingresses are served on the pool's Service.
gateway_ip() { # namespace gateway
  poll_field "address in its status" "$1" "gateway/$2" '{.status.addresses[0].value}'
}
pool_ip="$(lb coxswain-system coxswain-proxy)"
shared_ip="$(gateway_ip demo shared)"
dedicated_ip="$(lb demo dedicated-coxswain)"
kubectl -n demo rollout status deployment/dedicated-coxswain --timeout 180s

curl_retry() { # url host
  for _ in $(seq 60); do
    if curl -fsS --max-time 3 -H "Host: $2" "$1"; then return 0; fi
    sleep 1
  done
  echo "demo: no answer from $1 (Host: $2)" >&2
  return 1
}
step "HTTPRoute through the shared pool, at the Gateway's own address: curl -H 'Host: gateway.demo.example' http://$shared_ip/hello"
curl_retry "http://$shared_ip/hello" gateway.demo.example
step "Ingress through the shared pool: curl -H 'Host: ingress.demo.example' http://$pool_ip/ingress"
curl_retry "http://$pool_ip/ingress" ingress.demo.example
step "the dedicated proxy of Gateway demo/dedicated: curl http://$dedicated_ip:8080/dedicated"
curl_retry "http://$dedicated_ip:8080/dedicated" dedicated.demo.example

step "kubectl -n demo get gateway shared -o yaml"
kubectl -n demo get gateway shared -o yaml

cat <<DONE

Coxswain is running on the local cluster.
  kubectl:  $K8S_BIN/kubectl --kubeconfig $kubeconfig
  pods:     kubectl get pods -A -o wide   (container output: $COXSWAIN_CLUSTER_DIR/node/pods/)
  stop:     make cluster-down
DONE
