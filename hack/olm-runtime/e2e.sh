#!/usr/bin/env bash
# `make olm-e2e`: Coxswain installed, used, upgraded and removed by real OLM v0 on a local
# cluster of its own (etcd, kube-apiserver, kube-controller-manager, the test node), as
# docs/install.md tells a user to:
#   1. a file-based catalog with the committed bundle (bundle/) behind an address
#      CatalogSource, listed as a PackageManifest (what OperatorHub shows); Subscription ->
#      InstallPlan Complete -> CSV Succeeded; the controller and shared proxy Deployments come
#      from the CSV's install strategy and their Pods run;
#   2. CoxswainGatewayParameters, a GatewayClass with parametersRef, Gateway and HTTPRoute
#      (hack/olm-runtime/user.yaml); Accepted and Programmed with an address; 200 through it;
#   3. the same build published as the next patch version (`coxswain bundle --as-version`,
#      replacing this one) in the same channel: OLM upgrades on its own (Automatic approval)
#      while a client sends a request every 20 ms through the Gateway; every Pod is replaced
#      and no request may fail;
#   4. uninstall (delete the Subscription and the CSV): the operator's Pods, Services and RBAC
#      go; the CRDs, the user's objects and the dedicated proxy stay (and still serve).
# Prints the measured numbers; exits non-zero on the first unmet expectation.
# COXSWAIN_OLM_E2E_TEARDOWN=1 stops the cluster at the end (CI); by hand it is left running.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
# shellcheck source=hack/olm-runtime/env.sh
source "$here/env.sh"
# An instance of its own, beside `make cluster-up`'s and conformance's; started afresh, since
# a previous run leaves Coxswain installed or removed.
export COXSWAIN_CLUSTER_DIR="${COXSWAIN_OLM_E2E_CLUSTER_DIR:-$COXSWAIN_CACHE/clusters/olm-e2e}"
export COXSWAIN_ETCD_PORT="${COXSWAIN_OLM_E2E_ETCD_PORT:-25790}"
export COXSWAIN_ETCD_PEER_PORT="${COXSWAIN_OLM_E2E_ETCD_PEER_PORT:-25791}"
export COXSWAIN_APISERVER_PORT="${COXSWAIN_OLM_E2E_APISERVER_PORT:-28443}"
export COXSWAIN_KCM_PORT="${COXSWAIN_OLM_E2E_KCM_PORT:-28457}"
target="${CARGO_TARGET_DIR:-$repo/target}"

started=$(date +%s)
phase_started=$started
step() { phase_started=$(date +%s); printf '\n== %s (+%ss)\n' "$*" "$(( phase_started - started ))" >&2; }
log() { echo "olm-e2e: $*" >&2; }
fail() { log "FAILED: $*"; exit 1; }
elapsed() { echo "$(( $(date +%s) - phase_started ))s"; }
# wait_until WHAT SECONDS COMMAND...: polls COMMAND until it succeeds.
wait_until() {
  local what=$1 secs=$2; shift 2
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    (( $(date +%s) < deadline )) || fail "$what: not within ${secs}s"
    sleep 0.5
  done
}

step "building coxswain, the test node, OLM and opm"
cargo build --quiet -p coxswain-operator --bin coxswain -p coxswain-testenv --bin coxswain-node
coxswain="$target/debug/coxswain"
olm_bin="$("$here/build.sh")"
export COXSWAIN_NODE_BIN="$target/debug/coxswain-node"
export COXSWAIN_NODE_IMAGES="coxswain=$coxswain"

step "the bundles: committed bundle/ and the same build as the next patch version"
"$coxswain" bundle --check
package="$(sed -n 's/^  operators.operatorframework.io.bundle.package.v1: //p' bundle/metadata/annotations.yaml)"
channel="$(sed -n 's/^  operators.operatorframework.io.bundle.channel.default.v1: //p' bundle/metadata/annotations.yaml)"
version="$(sed -n 's/^  version: //p' bundle/manifests/*.clusterserviceversion.yaml)"
next="${version%.*}.$(( ${version##*.} + 1 ))"
old_csv="$package.v$version" new_csv="$package.v$next"
work="$(mktemp -d)"
traffic_pid=""
cleanup() {
  if [[ -n "$traffic_pid" ]]; then kill "$traffic_pid" 2>/dev/null || true; fi
  rm -rf "$work"
  if [[ "${COXSWAIN_OLM_E2E_TEARDOWN:-0}" == 1 ]]; then
    hack/cluster/down.sh >&2 || true
  else
    log "the cluster is left running: $K8S_BIN/kubectl --kubeconfig $COXSWAIN_CLUSTER_DIR/kubeconfig; stop it with COXSWAIN_CLUSTER_DIR=$COXSWAIN_CLUSTER_DIR hack/cluster/down.sh"
  fi
}
trap cleanup EXIT
"$coxswain" bundle --as-version "$next" --replaces "$old_csv" --out-dir "$work/next"
hack/olm/validate.sh "$work/next/bundle" >&2
log "package $package, channel $channel: $old_csv, then $new_csv (replaces $old_csv)"

step "a fresh cluster with OLM $OLM_VERSION (make olm-up)"
hack/cluster/down.sh >/dev/null 2>&1 || true
kubeconfig="$("$here/up.sh" | tail -n 1)"
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$kubeconfig" "$@"; }
jp() { kubectl get "$@" 2>/dev/null; } # jp [-n NS] KIND/NAME -o jsonpath=...
log "cluster and OLM up in $(elapsed)"

# ---------------------------------------------------------------------------------------
step "1. install: catalog with $old_csv, Subscription (docs/install.md), CSV Succeeded"
"$here/catalog.sh" "$kubeconfig" bundle
log "CatalogSource olm/coxswain-catalog: $(jp -n olm catalogsource/coxswain-catalog -o jsonpath='{.status.connectionState.lastObservedState}')"
# What OperatorHub lists: the PackageManifest that OLM's packageserver makes of the catalog.
package_offers() { # CSV: the channel's head is CSV
  [[ "$(jp -n olm packagemanifest/"$package" -o jsonpath="{.status.channels[?(@.name==\"$channel\")].currentCSV}")" == "$1" ]]
}
wait_until "PackageManifest $package offering $old_csv" 60 package_offers "$old_csv"
kubectl -n olm get packagemanifest "$package" \
  -o jsonpath='{"PackageManifest "}{.metadata.name}{": catalog "}{.status.catalogSource}{", default channel "}{.status.defaultChannel}{", head "}{.status.channels[0].currentCSV}{" ("}{.status.channels[0].currentCSVDesc.displayName}{")\n"}' >&2
subscribed=$(date +%s)
kubectl apply --server-side -f - >&2 <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: coxswain-system}
---
apiVersion: operators.coreos.com/v1
kind: OperatorGroup
metadata: {name: coxswain, namespace: coxswain-system}
spec: {}
---
apiVersion: operators.coreos.com/v1alpha1
kind: Subscription
metadata: {name: coxswain, namespace: coxswain-system}
spec: {name: $package, channel: $channel, source: coxswain-catalog, sourceNamespace: olm, installPlanApproval: Automatic}
EOF
ns=(-n coxswain-system)
installplan_of() { jp "${ns[@]}" subscription/coxswain -o jsonpath='{.status.installPlanRef.name}'; }
installplan_for() { # CSV: the Subscription's InstallPlan once it installs CSV
  local ip; ip="$(installplan_of)"
  [[ -n "$ip" ]] && jp "${ns[@]}" installplan/"$ip" -o jsonpath='{.spec.clusterServiceVersionNames}' | grep -q "\"$1\""
}
phase_is() { [[ "$(jp "${ns[@]}" "$1" -o jsonpath='{.status.phase}')" == "$2" ]]; }
wait_until "an InstallPlan for $old_csv" 120 installplan_for "$old_csv"
ip="$(installplan_of)"
wait_until "InstallPlan $ip Complete" 180 phase_is "installplan/$ip" Complete
log "Subscription -> InstallPlan $ip Complete after $(( $(date +%s) - subscribed ))s"
wait_until "CSV $old_csv Succeeded" 300 phase_is "csv/$old_csv" Succeeded
log "CSV $old_csv Succeeded $(( $(date +%s) - subscribed ))s after the Subscription"
for d in coxswain-controller coxswain-proxy; do
  owner="$(jp "${ns[@]}" deployment/$d -o jsonpath='{.metadata.labels.olm\.owner}')"
  [[ "$owner" == "$old_csv" ]] || fail "Deployment $d is not from the CSV's install strategy (olm.owner=$owner)"
  kubectl "${ns[@]}" rollout status deployment/$d --timeout 180s >&2
done
kubectl "${ns[@]}" get deployments,pods -o wide >&2
kubectl "${ns[@]}" get subscription coxswain -o jsonpath='{"Subscription state: "}{.status.state}{", installed: "}{.status.installedCSV}{"\n"}' >&2

# ---------------------------------------------------------------------------------------
step "2. a GatewayClass with parametersRef, a Gateway and an HTTPRoute (docs/install.md)"
kubectl apply --server-side -f "$here/user.yaml" >&2
kubectl wait --for condition=Accepted --timeout 120s gatewayclass/coxswain >&2
kubectl -n demo wait --for condition=Accepted --timeout 120s gateway/web >&2
kubectl -n demo wait --for condition=Programmed --timeout 180s gateway/web >&2
address="$(jp -n demo gateway/web -o jsonpath='{.status.addresses[0].value}')"
[[ -n "$address" ]] || fail "Gateway demo/web is Programmed without an address"
echo "--- kubectl get gateway -n demo web -o yaml" >&2
kubectl -n demo get gateway web -o yaml >&2
kubectl -n demo rollout status deployment/app --timeout 120s >&2
# The HorizontalPodAutoscaler of the parameters (minReplicas 2) sizes the dedicated proxy.
two_ready() { [[ "$(jp -n demo deployment/web-coxswain -o jsonpath='{.status.readyReplicas}')" == 2 ]]; }
wait_until "2 ready replicas of the dedicated proxy demo/web-coxswain" 120 two_ready
url="http://$address/"
code=""
for _ in $(seq 60); do
  code="$(curl -s -o "$work/body" -w '%{http_code}' --max-time 2 -H 'Host: app.example.com' "$url" || true)"
  [[ "$code" == 200 ]] && break
  sleep 0.5
done
[[ "$code" == 200 ]] || fail "GET $url (Host: app.example.com) answered ${code:-nothing}, not 200"
grep -q '"namespace": "demo"' "$work/body" || fail "the answer did not come from the echo backend: $(head -c 300 "$work/body")"
log "GET $url (Host: app.example.com): 200 from $(sed -n 's/^ "pod": "\(.*\)",\?$/\1/p' "$work/body") through the dedicated proxy"

# ---------------------------------------------------------------------------------------
step "3. upgrade to $new_csv through the channel, a request every 20 ms through the Gateway"
pods_uids() { kubectl get pods -n coxswain-system -l app.kubernetes.io/name=coxswain -o jsonpath='{.items[*].metadata.uid}'; kubectl get pods -n demo -l "gateway.networking.k8s.io/gateway-name=web" -o jsonpath=' {.items[*].metadata.uid}'; }
before_uids="$(pods_uids)"
(( $(wc -w <<< "$before_uids") >= 6 )) || fail "expected controller, shared and dedicated proxy Pods, found: $before_uids"
"$olm_bin/traffic" -url "$url" -host app.example.com -interval 20ms -timeout 2s -max-duration 15m \
  -ready-file "$work/traffic.ready" > "$work/traffic.out" 2>&1 &
traffic_pid=$!
wait_until "the traffic client's first 200" 30 test -f "$work/traffic.ready"
upgrade_started=$(date +%s)
"$here/catalog.sh" "$kubeconfig" bundle "$work/next/bundle"
wait_until "PackageManifest $package offering $new_csv" 60 package_offers "$new_csv"
wait_until "an InstallPlan for $new_csv" 300 installplan_for "$new_csv"
ip="$(installplan_of)"
wait_until "InstallPlan $ip Complete" 300 phase_is "installplan/$ip" Complete
wait_until "CSV $new_csv Succeeded" 300 phase_is "csv/$new_csv" Succeeded
log "CSV $new_csv Succeeded $(( $(date +%s) - upgrade_started ))s after the catalog update (InstallPlan $ip, approval $(jp "${ns[@]}" installplan/"$ip" -o jsonpath='{.spec.approval}'))"
old_gone() { ! kubectl "${ns[@]}" get csv "$old_csv" >/dev/null 2>&1; }
wait_until "CSV $old_csv replaced and removed" 300 old_gone
new_image="$(jp "${ns[@]}" csv/"$new_csv" -o jsonpath='{.metadata.annotations.containerImage}')"
deployment_on() { # NS DEPLOYMENT: rolled out with the new image, no old Pod left
  [[ "$(jp -n "$1" deployment/"$2" -o jsonpath='{.spec.template.spec.containers[0].image}')" == "$new_image" ]] &&
    kubectl -n "$1" rollout status deployment/"$2" --timeout 1s
}
for d in coxswain-controller coxswain-proxy; do wait_until "Deployment $d on $new_image" 300 deployment_on coxswain-system $d; done
# The dedicated proxy runs the controller's image; the new controller rolls it.
wait_until "Deployment demo/web-coxswain on $new_image" 300 deployment_on demo web-coxswain
no_terminating() {
  ! kubectl get pods -n coxswain-system -o jsonpath='{.items[*].metadata.deletionTimestamp}' | grep -q . &&
    ! kubectl get pods -n demo -o jsonpath='{.items[*].metadata.deletionTimestamp}' | grep -q .
}
wait_until "every old Pod drained and gone" 120 no_terminating
log "upgrade rolled out $(( $(date +%s) - upgrade_started ))s after the catalog update"
kill -TERM "$traffic_pid"
wait "$traffic_pid" || true
traffic_pid=""
cat "$work/traffic.out" >&2
after_uids="$(pods_uids)"
for uid in $before_uids; do
  grep -qw -- "$uid" <<< "$after_uids" && fail "Pod $uid was not replaced by the upgrade"
done
log "all $(wc -w <<< "$before_uids") controller and proxy Pods were replaced"
kubectl "${ns[@]}" get csv,deployments,pods >&2
failed="$(sed -n 's/^traffic: .* \([0-9][0-9]*\) failed$/\1/p' "$work/traffic.out")"
requests="$(sed -n 's/^traffic: \([0-9][0-9]*\) requests .*/\1/p' "$work/traffic.out")"
[[ -n "$failed" && -n "$requests" ]] || fail "no summary from the traffic client"
(( requests > 0 )) || fail "the traffic client sent no request"
echo "olm-e2e: upgrade $old_csv -> $new_csv under traffic: $requests requests, $failed failed" >&2
(( failed == 0 )) || fail "$failed of $requests requests failed during the upgrade"

# ---------------------------------------------------------------------------------------
step "4. uninstall (docs/install.md): delete the Subscription and the CSV"
owned_rbac() {
  kubectl get clusterroles,clusterrolebindings -l "olm.owner=$new_csv" -o name
  kubectl "${ns[@]}" get roles,rolebindings -l "olm.owner=$new_csv" -o name
}
rbac_before="$(owned_rbac | wc -l)"
(( rbac_before > 0 )) || fail "no RBAC labelled olm.owner=$new_csv before the uninstall"
kubectl "${ns[@]}" get serviceaccount coxswain-controller coxswain-proxy >/dev/null
kubectl "${ns[@]}" delete subscription coxswain >&2
kubectl "${ns[@]}" delete csv "$new_csv" >&2
operator_gone() {
  [[ -z "$(kubectl "${ns[@]}" get deployments,pods,services,poddisruptionbudgets -l app.kubernetes.io/name=coxswain -o name)" ]] &&
    [[ -z "$(owned_rbac)" ]] &&
    ! kubectl "${ns[@]}" get role "$new_csv" >/dev/null 2>&1 &&
    ! kubectl "${ns[@]}" get serviceaccount coxswain-controller >/dev/null 2>&1 &&
    ! kubectl "${ns[@]}" get serviceaccount coxswain-proxy >/dev/null 2>&1 &&
    [[ -z "$(kubectl get csv -A --field-selector "metadata.name=$new_csv" -o name)" ]]
}
wait_until "the operator's Deployments, Pods, Services, ServiceAccounts and RBAC removed" 180 operator_gone
log "removed in $(elapsed): Deployments, Pods, Services, the PodDisruptionBudget, both ServiceAccounts, $rbac_before RBAC objects and every copied CSV"
for kept in crd/coxswaingatewayparameters.gateway.coxswain-labs.dev \
  crd/coxswainingressclassparameters.ingress.coxswain-labs.dev \
  crd/coxswainbackendpolicies.gateway.coxswain-labs.dev \
  crd/coxswainaccesspolicies.gateway.coxswain-labs.dev gatewayclass/coxswain; do
  kubectl get "$kept" >/dev/null || fail "$kept was removed by the uninstall"
done
kubectl -n coxswain-system get coxswaingatewayparameters/edge secret/coxswain-discovery-ca \
  configmap/coxswain-discovery-trust >/dev/null || fail "objects in coxswain-system were removed"
kubectl -n demo get gateway/web httproute/app deployment/web-coxswain >/dev/null || fail "the user's objects were removed"
code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 -H 'Host: app.example.com' "$url" || true)"
[[ "$code" == 200 ]] || fail "the dedicated proxy stopped serving after the uninstall (${code:-no answer})"
log "kept: the three CRDs, GatewayClass, CoxswainGatewayParameters, Gateway, HTTPRoute, CA Secret and trust ConfigMap; the dedicated proxy still answers 200 without the controller"

echo "olm-e2e: passed in $(( $(date +%s) - started ))s; upgrade under traffic: $requests requests, $failed failed" >&2
