# Shared settings for the local control plane scripts. Sourced, not executed.
# Everything cached lives under $COXSWAIN_CACHE, outside the clone, so clean clones rebuild
# nothing that is already there.
export COXSWAIN_CACHE="${COXSWAIN_CACHE:-$HOME/.cache/coxswain}"
export GOMODCACHE="${GOMODCACHE:-$COXSWAIN_CACHE/go/mod}"
export GOCACHE="${GOCACHE:-$COXSWAIN_CACHE/go/build}"
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
# Versions: one Kubernetes release for every k8s.io module (see go.mod), and the Gateway API
# release the cluster installs and test/conformance runs. The Rust gateway-api crate (0.22) was
# generated from v1.5.1 and reads v1.6 objects as they are: v1.6 added no field to the kinds
# Coxswain serves (rules[].retry was in v1.5's experimental channel already).
export K8S_VERSION="v1.36.3"
export GATEWAY_API_VERSION="v1.6.3"
export K8S_BIN="$COXSWAIN_CACHE/k8s/$K8S_VERSION/bin"
# echo-basic comes from the conformance module of that Gateway API release, so it has a directory
# per release: checkouts on different releases share the cache without rebuilding each other's
# binary under running Pods.
export ECHO_BASIC_BIN="$K8S_BIN/gateway-api-$GATEWAY_API_VERSION/echo-basic"

# One cluster instance: its state directory and loopback ports. `make cluster-up` uses the
# defaults; tests pass their own so several instances can run side by side.
export COXSWAIN_CLUSTER_DIR="${COXSWAIN_CLUSTER_DIR:-$COXSWAIN_CACHE/clusters/default}"
export COXSWAIN_ETCD_PORT="${COXSWAIN_ETCD_PORT:-23790}"
export COXSWAIN_ETCD_PEER_PORT="${COXSWAIN_ETCD_PEER_PORT:-23791}"
export COXSWAIN_APISERVER_PORT="${COXSWAIN_APISERVER_PORT:-26443}"
export COXSWAIN_KCM_PORT="${COXSWAIN_KCM_PORT:-26457}"
# experimental is a superset of standard (adds TCPRoute, UDPRoute, X* policies and the
# experimental fields of the standard kinds).
export GATEWAY_API_CHANNEL="${GATEWAY_API_CHANNEL:-experimental}"
# Claims of network indexes (see up.sh), machine-wide: on tmpfs, so a reboot frees them.
export COXSWAIN_NET_LOCKS="${COXSWAIN_NET_LOCKS:-/run/coxswain/net}"
