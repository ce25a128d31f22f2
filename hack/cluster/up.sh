#!/usr/bin/env bash
# Starts a local Kubernetes control plane on loopback: etcd, kube-apiserver (RBAC,
# service-account issuer and keys) and kube-controller-manager, all built from their Go
# modules; then installs the Gateway API and Coxswain CRDs. Idempotent: a running, healthy
# instance is left as it is. Prints the admin kubeconfig path on stdout as its last line.
#
# Instance settings (see env.sh): COXSWAIN_CLUSTER_DIR and the COXSWAIN_*_PORT variables.
# COXSWAIN_CLUSTER_OWNER_PID: tear the instance down once that process has exited (used by
# the Rust test harness so a crashed test binary leaves nothing running).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=hack/cluster/env.sh
source "$here/env.sh"

dir="$COXSWAIN_CLUSTER_DIR"
pki="$dir/pki"
logs="$dir/logs"
run="$dir/run"
kubeconfig="$dir/kubeconfig"
log() { echo "cluster-up: $*" >&2; }
die() { log "error: $*"; exit 1; }

alive() { [[ -f "$run/$1.pid" ]] && kill -0 "$(cat "$run/$1.pid")" 2>/dev/null; }

bin="$("$here/build.sh")"
kubectl() { "$bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

# --- processes -------------------------------------------------------------------------
# Each runs in its own session so it outlives this script (`make cluster-up`), with its pid
# recorded for down.sh.
start() { # name command...
  local name=$1; shift
  setsid "$@" >"$logs/$name.log" 2>&1 < /dev/null &
  echo $! > "$run/$name.pid"
}
wait_for() { # what seconds command...
  local what=$1 secs=$2; shift 2
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if (( $(date +%s) >= deadline )); then
      log "$what not ready after ${secs}s; last log lines:"
      tail -n 30 "$logs"/*.log >&2 || true
      die "$what did not become ready"
    fi
    sleep 0.2
  done
}

install_crds() {
  local gwapi_dir
  gwapi_dir="$(cd / && go mod download -json "sigs.k8s.io/gateway-api@$GATEWAY_API_VERSION" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "$gwapi_dir/config/crd/$GATEWAY_API_CHANNEL" ]] \
    || die "Gateway API $GATEWAY_API_VERSION has no $GATEWAY_API_CHANNEL CRDs at $gwapi_dir"
  # Server-side apply: the experimental HTTPRoute CRD is larger than client-side apply's
  # last-applied annotation allows. -k applies exactly what each release's kustomization lists.
  kubectl apply --server-side --force-conflicts -k "$gwapi_dir/config/crd/$GATEWAY_API_CHANNEL" >&2
  kubectl apply --server-side --force-conflicts -k "$repo/config/crd" >&2
  kubectl wait --for condition=Established --timeout 60s crd --all >&2
}

# The test node (test/testenv, `coxswain-node`): runs Pods as processes in network namespaces.
# Started only when COXSWAIN_NODE_BIN names its binary (make cluster-up builds it); the Rust
# test harness runs the same agent in-process instead. COXSWAIN_NODE_IMAGES adds image=binary
# pairs (space-separated) to the built-in echo-basic and coredns ones.
start_node() {
  [[ -n "${COXSWAIN_NODE_BIN:-}" ]] || return 0
  alive node && return 0
  local images=(--image "echo-basic=$ECHO_BASIC_BIN" --image "coredns=$bin/coredns")
  local pair
  for pair in ${COXSWAIN_NODE_IMAGES:-}; do images+=(--image "$pair"); done
  start node "$COXSWAIN_NODE_BIN" --kubeconfig "$kubeconfig" --cluster-dir "$dir" "${images[@]}"
  wait_for "test node" 60 kubectl wait --for condition=Ready --timeout 1s node/coxswain-node
}

if alive etcd && alive kube-apiserver && alive kube-controller-manager \
  && kubectl get --raw /readyz >/dev/null 2>&1; then
  log "already running ($dir); refreshing CRDs"
  install_crds
  start_node
  echo "$kubeconfig"
  exit 0
fi
# A half-started or crashed instance: clear it so the start below is clean.
if [[ -d "$run" ]]; then
  log "clearing a stale instance in $dir"
  "$here/down.sh" >&2
fi

started_ms=$(( $(date +%s%N) / 1000000 ))
mkdir -p "$pki" "$logs" "$run" "$dir/etcd"

# --- network index ---------------------------------------------------------------------
# Each instance gets a small number N, unique on this machine, that names its address ranges
# (Services 10.96.N.0/24, Pods 10.244.N.0/24, LoadBalancers 10.97.N.0/24) and the test node's
# bridge and namespaces, so instances side by side never share an address. Claimed with an
# atomic mkdir; a claim whose owner's directory is gone is stale and taken over.
claim_net_index() {
  local n owner
  mkdir -p "$COXSWAIN_NET_LOCKS"
  for n in $(seq 1 200); do
    if mkdir "$COXSWAIN_NET_LOCKS/$n" 2>/dev/null; then
      echo "$dir" > "$COXSWAIN_NET_LOCKS/$n/owner"
      echo "$n"; return 0
    fi
    owner="$(cat "$COXSWAIN_NET_LOCKS/$n/owner" 2>/dev/null || true)"
    if [[ -n "$owner" && ! -d "$owner/run" ]]; then
      rm -rf "$COXSWAIN_NET_LOCKS/$n"
      if mkdir "$COXSWAIN_NET_LOCKS/$n" 2>/dev/null; then
        echo "$dir" > "$COXSWAIN_NET_LOCKS/$n/owner"
        echo "$n"; return 0
      fi
    fi
  done
  return 1
}
net="$(claim_net_index)" || die "no free network index under $COXSWAIN_NET_LOCKS"
echo "$net" > "$run/net-index"
service_cidr="10.96.$net.0/24"
kubernetes_service_ip="10.96.$net.1"

# --- PKI -------------------------------------------------------------------------------
# ECDSA P-256 keys: fast to generate, accepted by every component.
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
sign() { # name subject [extensions]
  local name=$1 subj=$2 ext=${3:-}
  key "$pki/$name.key"
  openssl req -new -key "$pki/$name.key" -subj "$subj" -out "$pki/$name.csr" 2>/dev/null
  printf '%s\n' "$ext" > "$pki/$name.ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" \
    -CAcreateserial -days 30 -sha256 -extfile "$pki/$name.ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$pki/$name.ext"
}
key "$pki/ca.key"
openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=coxswain-local-ca" -days 30 -sha256 \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  -out "$pki/ca.crt" 2>/dev/null
sign apiserver "/CN=kube-apiserver" "$(printf '%s\n' \
  "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature,keyEncipherment" \
  "extendedKeyUsage=serverAuth" \
  "subjectAltName=IP:127.0.0.1,IP:$kubernetes_service_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local")"
sign admin "/O=system:masters/CN=coxswain-admin" "$(printf '%s\n' \
  "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth")"
sign kcm "/CN=system:kube-controller-manager" "$(printf '%s\n' \
  "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" "extendedKeyUsage=clientAuth")"
# Service-account token signing pair: TokenRequest signs with it, TokenReview verifies.
key "$pki/sa.key"
openssl pkey -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
# API aggregation (aggregated API servers such as OLM's packageserver): kube-apiserver proxies
# to them with this client certificate, from a CA of its own that they trust for the
# X-Remote-User/-Group headers (published in kube-system/extension-apiserver-authentication).
key "$pki/front-proxy-ca.key"
openssl req -x509 -new -key "$pki/front-proxy-ca.key" -subj "/CN=coxswain-local-front-proxy-ca" \
  -days 30 -sha256 -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" -out "$pki/front-proxy-ca.crt" 2>/dev/null
key "$pki/front-proxy-client.key"
openssl req -new -key "$pki/front-proxy-client.key" -subj "/CN=front-proxy-client" 2>/dev/null \
  | openssl x509 -req -CA "$pki/front-proxy-ca.crt" -CAkey "$pki/front-proxy-ca.key" \
    -CAcreateserial -days 30 -sha256 -out "$pki/front-proxy-client.crt" \
    -extfile <(printf '%s\n' "basicConstraints=CA:FALSE" "keyUsage=critical,digitalSignature" \
      "extendedKeyUsage=clientAuth") 2>/dev/null

server="https://127.0.0.1:$COXSWAIN_APISERVER_PORT"
write_kubeconfig() { # file user
  cat > "$1" <<KCFG
apiVersion: v1
kind: Config
clusters:
- name: coxswain-local
  cluster:
    server: $server
    certificate-authority-data: $(base64 -w0 < "$pki/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 < "$pki/$2.crt")
    client-key-data: $(base64 -w0 < "$pki/$2.key")
contexts:
- name: coxswain-local
  context: {cluster: coxswain-local, user: $2}
current-context: coxswain-local
KCFG
}
write_kubeconfig "$kubeconfig" admin
write_kubeconfig "$dir/kcm.kubeconfig" kcm

start etcd "$bin/etcd" --name coxswain --data-dir "$dir/etcd" \
  --listen-client-urls "http://127.0.0.1:$COXSWAIN_ETCD_PORT" \
  --advertise-client-urls "http://127.0.0.1:$COXSWAIN_ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$COXSWAIN_ETCD_PEER_PORT" \
  --initial-advertise-peer-urls "http://127.0.0.1:$COXSWAIN_ETCD_PEER_PORT" \
  --initial-cluster "coxswain=http://127.0.0.1:$COXSWAIN_ETCD_PEER_PORT" \
  --listen-metrics-urls "" --log-level warn \
  --unsafe-no-fsync --quota-backend-bytes 2147483648
wait_for etcd 30 curl -fsS "http://127.0.0.1:$COXSWAIN_ETCD_PORT/health"

issuer="https://kubernetes.default.svc.cluster.local"
start kube-apiserver "$bin/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:$COXSWAIN_ETCD_PORT" \
  --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
  --secure-port "$COXSWAIN_APISERVER_PORT" --cert-dir "$dir/apiserver-certs" \
  --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
  --client-ca-file "$pki/ca.crt" \
  --requestheader-client-ca-file "$pki/front-proxy-ca.crt" \
  --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User \
  --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "$pki/front-proxy-client.crt" \
  --proxy-client-key-file "$pki/front-proxy-client.key" \
  --authorization-mode RBAC \
  --service-account-issuer "$issuer" \
  --service-account-key-file "$pki/sa.pub" \
  --service-account-signing-key-file "$pki/sa.key" \
  --service-cluster-ip-range "$service_cidr" \
  --endpoint-reconciler-type none \
  --allow-privileged=true \
  --kubelet-preferred-address-types InternalIP \
  --profiling=false \
  --v=1
wait_for kube-apiserver 90 kubectl get --raw /readyz

start kube-controller-manager "$bin/kube-controller-manager" \
  --kubeconfig "$dir/kcm.kubeconfig" \
  --authentication-kubeconfig "$dir/kcm.kubeconfig" \
  --authorization-kubeconfig "$dir/kcm.kubeconfig" \
  --bind-address 127.0.0.1 --secure-port "$COXSWAIN_KCM_PORT" \
  --cert-dir "$dir/kcm-certs" \
  --leader-elect=false \
  --use-service-account-credentials=true \
  --service-account-private-key-file "$pki/sa.key" \
  --root-ca-file "$pki/ca.crt" \
  --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
  --controllers '*' \
  --profiling=false \
  --v=1
wait_for kube-controller-manager 60 curl -fsSk "https://127.0.0.1:$COXSWAIN_KCM_PORT/healthz"

if [[ -n "${COXSWAIN_CLUSTER_OWNER_PID:-}" ]]; then
  # Watchdog: the owner's exit (normal or not) tears the instance down.
  setsid bash -c 'while kill -0 "$1" 2>/dev/null; do sleep 1; done; exec "$2"' \
    _ "$COXSWAIN_CLUSTER_OWNER_PID" "$here/down.sh" \
    >"$logs/watchdog.log" 2>&1 < /dev/null &
  echo $! > "$run/watchdog.pid"
fi

# --- CRDs and the test node -------------------------------------------------------------
install_crds
start_node

elapsed_ms=$(( $(date +%s%N) / 1000000 - started_ms ))
log "ready in $(( elapsed_ms / 1000 )).$(( elapsed_ms % 1000 / 100 ))s: Kubernetes $K8S_VERSION, Gateway API $GATEWAY_API_VERSION ($GATEWAY_API_CHANNEL)"
log "try: $bin/kubectl --kubeconfig $kubeconfig get crd"
echo "$kubeconfig"
