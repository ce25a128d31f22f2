#!/usr/bin/env bash
# `make olm-up`: OLM v0 on the local cluster. Starts the cluster (hack/cluster/up.sh) with the
# test node if needed, applies OLM's CRDs (from the pinned module, server-side: the CSV CRD is
# too large for client-side apply), then hack/olm-runtime/olm.yaml: namespaces olm and
# operators, OLM's RBAC, the olm and catalog operators as Pods, the default OperatorGroups;
# then the packageserver CSV (the PackageManifest API), and waits for its APIService.
# Idempotent. Prints the kubeconfig path on stdout as its last line.
#
# The test node runs the OLM images as the binaries build.sh made. A node that was started
# without them (e.g. by `make cluster-up`) is restarted with them; its Pods start again.
# Needs COXSWAIN_NODE_BIN (the built coxswain-node) and the coxswain image in
# COXSWAIN_NODE_IMAGES, as hack/cluster/up.sh does; `make olm-up` sets both.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=hack/olm-runtime/env.sh
source "$here/env.sh"
log() { echo "olm-up: $*" >&2; }

[[ -n "${COXSWAIN_NODE_BIN:-}" ]] || { log "error: COXSWAIN_NODE_BIN must name the coxswain-node binary"; exit 1; }
olm_bin="$("$here/build.sh")"
olm_images="olm=$olm_bin/olm catalog=$olm_bin/catalog opm=$olm_bin/opm"
olm_images+=" package-server=$olm_bin/package-server"
export COXSWAIN_NODE_IMAGES="${COXSWAIN_NODE_IMAGES:-} $olm_images"

node_pidfile="$COXSWAIN_CLUSTER_DIR/run/node.pid"
if [[ -f "$node_pidfile" ]] && kill -0 "$(cat "$node_pidfile")" 2>/dev/null; then
  pid="$(cat "$node_pidfile")"
  if ! tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF -- "package-server=$olm_bin/package-server"; then
    log "restarting the test node (pid $pid) with OLM's images"
    kill -TERM "$pid"
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && { log "error: the test node (pid $pid) did not stop"; exit 1; }
    rm -f "$node_pidfile"
  fi
fi
kubeconfig="$("$repo/hack/cluster/up.sh")"
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$kubeconfig" "$@"; }

crds="$(olm_module_dir)/deploy/chart/crds"
kubectl apply --server-side --force-conflicts -f "$crds" >&2
olm_crds=()
for f in "$crds"/*.yaml; do olm_crds+=("crd/$(sed -n 's/^  name: //p' "$f" | head -1)"); done
kubectl wait --for condition=Established --timeout 60s "${olm_crds[@]}" >&2
kubectl apply --server-side --force-conflicts -f "$here/olm.yaml" >&2
kubectl -n olm rollout status deployment/olm-operator --timeout 180s >&2
kubectl -n olm rollout status deployment/catalog-operator --timeout 180s >&2
# The PackageManifest API (what OperatorHub lists), installed by OLM itself from a CSV.
kubectl apply --server-side --force-conflicts -f "$here/packageserver.yaml" >&2
packages_served() {
  [[ "$(kubectl get apiservice v1.packages.operators.coreos.com \
    -o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>/dev/null)" == True ]]
}
deadline=$(( $(date +%s) + 180 ))
until packages_served; do
  (( $(date +%s) < deadline )) || { log "error: the packageserver API is not available: $(kubectl -n olm get csv packageserver -o jsonpath='{.status.message}')"; exit 1; }
  sleep 0.5
done
log "OLM $OLM_VERSION is running (namespace olm); operators install into namespace operators"
echo "$kubeconfig"
