#!/usr/bin/env bash
# Publishes Coxswain's bundles as a file-based catalog on the local cluster's OLM:
#   hack/olm-runtime/catalog.sh KUBECONFIG BUNDLE_DIR...
# Each BUNDLE_DIR is a registry+v1 bundle (`make bundle` writes bundle/; `coxswain bundle
# --version ... --out-dir ...` writes others). `opm render` turns each into an olm.bundle whose
# manifests travel inline (olm.bundle.object properties), so OLM installs from the catalog
# alone and never starts a bundle-unpack Job (which would need an image filesystem). The
# script adds the olm.package and olm.channel entries (the channel lists the bundles in the
# order given, each replacing its CSV's spec.replaces), runs `opm validate`, and serves the
# catalog with `opm serve` in a Pod (its content from a ConfigMap) behind Service
# olm/coxswain-catalog, which CatalogSource olm/coxswain-catalog names by address. Running it
# again with more bundles publishes a new catalog version: the Pod is replaced, OLM's
# connection to it becomes READY again, and OLM resolves every Subscription anew.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/olm-runtime/env.sh
source "$here/env.sh"
log() { echo "olm-catalog: $*" >&2; }
die() { log "error: $*"; exit 1; }
(( $# >= 2 )) || die "usage: $0 KUBECONFIG BUNDLE_DIR..."
kubeconfig="$1"; shift
kubectl() { "$K8S_BIN/kubectl" --kubeconfig "$kubeconfig" "$@"; }
olm_bin="$("$here/build.sh")"
opm() { "$olm_bin/opm" "$@"; }

annotation() { # bundle-dir key
  sed -n "s/^  $2: //p" "$1/metadata/annotations.yaml"
}
csv_field() { # bundle-dir sed-expression: one field of the CSV's YAML
  sed -n "$2" "$1"/manifests/*.clusterserviceversion.yaml | head -1
}

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/catalog"
package="" channel=""
entries=""
for dir in "$@"; do
  [[ -f "$dir/metadata/annotations.yaml" ]] || die "$dir is not a bundle directory"
  p="$(annotation "$dir" operators.operatorframework.io.bundle.package.v1)"
  c="$(annotation "$dir" operators.operatorframework.io.bundle.channel.default.v1)"
  [[ -z "$package" || "$package" == "$p" ]] || die "$dir is package $p, not $package"
  [[ -z "$channel" || "$channel" == "$c" ]] || die "$dir is channel $c, not $channel"
  package="$p" channel="$c"
  name="$(csv_field "$dir" 's/^  name: //p')"
  replaces="$(csv_field "$dir" 's/^  replaces: //p')"
  entries+="- name: $name"$'\n'
  [[ -n "$replaces" ]] && entries+="  replaces: $replaces"$'\n'
  opm render "$dir" -o yaml >> "$work/catalog/bundles.yaml"
  log "bundle $name${replaces:+ (replaces $replaces)} from $dir"
done
cat > "$work/catalog/package.yaml" <<EOF
---
schema: olm.package
name: $package
defaultChannel: $channel
---
schema: olm.channel
package: $package
name: $channel
entries:
$entries
EOF
opm validate "$work/catalog" >&2 || die "opm validate rejected the catalog"
# One file, so the ConfigMap's key is the whole catalog.
cat "$work/catalog/package.yaml" "$work/catalog/bundles.yaml" > "$work/catalog.yaml"
digest="$(sha256sum "$work/catalog.yaml" | cut -c1-16)"

# Publishing the catalog already served changes nothing: any READY connection reads it.
served="$(kubectl -n olm get deployment coxswain-catalog \
  -o jsonpath='{.spec.template.metadata.annotations.coxswain-labs\.dev/catalog-digest}' 2>/dev/null || true)"
if [[ "$served" == "$digest" ]]; then published=0; else published=$(date +%s); fi
kubectl -n olm create configmap coxswain-catalog --from-file=catalog.yaml="$work/catalog.yaml" \
  --dry-run=client -o yaml | kubectl apply --server-side --force-conflicts -f - >&2
sed "s/CATALOG_DIGEST/$digest/" "$here/catalog-server.yaml" \
  | kubectl apply --server-side --force-conflicts -f - >&2
kubectl -n olm rollout status deployment/coxswain-catalog --timeout 120s >&2

# The catalog operator reports the gRPC connection's state and when it last changed. READY
# since this publication means OLM reads this version of the catalog (a replaced Pod drops the
# connection first).
connected_since_publication() {
  local state at
  state="$(kubectl -n olm get catalogsource coxswain-catalog \
    -o jsonpath='{.status.connectionState.lastObservedState} {.status.connectionState.lastConnect}' 2>/dev/null)" || return 1
  at="${state#* }"; state="${state%% *}"
  [[ "$state" == READY && -n "$at" ]] && (( $(date -d "$at" +%s) >= published ))
}
deadline=$(( $(date +%s) + 180 ))
until connected_since_publication; do
  (( $(date +%s) < deadline )) || die "CatalogSource olm/coxswain-catalog is not READY: $(kubectl -n olm get catalogsource coxswain-catalog -o jsonpath='{.status}')"
  sleep 0.5
done
log "CatalogSource olm/coxswain-catalog READY: package $package, channel $channel, catalog $digest"
