#!/usr/bin/env bash
# Stops every process `up.sh` started for this instance and removes its state.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/cluster/env.sh
source "$here/env.sh"
dir="$COXSWAIN_CLUSTER_DIR"
run="$dir/run"

# A zombie (exited, not yet reaped by init) counts as stopped.
running() { [[ -r /proc/$1/stat ]] && ! awk '{exit ($3 == "Z") ? 0 : 1}' "/proc/$1/stat"; }

# Reverse start order, so no component logs errors about the ones already gone.
for name in node watchdog kube-controller-manager kube-apiserver etcd; do
  pidfile="$run/$name.pid"
  [[ -f "$pidfile" ]] || continue
  pid="$(cat "$pidfile")"
  # Never signal ourselves: the watchdog runs this script.
  if [[ "$pid" != "$$" && "$pid" != "$PPID" ]] && running "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do running "$pid" || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
done
# The test node's network: every Pod namespace (and whatever still runs in it), the bridge
# (with the Service addresses on it), per-namespace /etc files, and the index claim. Names derive
# from the index alone, so this works even when the agent died without cleaning up.
if [[ -f "$run/net-index" ]]; then
  net="$(cat "$run/net-index")"
  for ns in $(ip netns list 2>/dev/null | awk -v p="cx$net-" 'index($1, p) == 1 {print $1}'); do
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    ip netns delete "$ns" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
  done
  # Host-network Pods' processes, recorded by the agent.
  for pidfile in "$dir"/node/pids/*; do
    [[ -f "$pidfile" ]] || continue
    kill -KILL -- "-$(cat "$pidfile")" 2>/dev/null || true
  done
  ip link delete "cxbr$net" 2>/dev/null || true
  if [[ "$(cat "$COXSWAIN_NET_LOCKS/$net/owner" 2>/dev/null)" == "$dir" ]]; then
    rm -rf "${COXSWAIN_NET_LOCKS:?}/$net"
  fi
fi
case "$dir" in
  ""|"/"|"$HOME") echo "cluster-down: refusing to remove $dir" >&2; exit 1 ;;
esac
rm -rf "$dir"
echo "cluster-down: stopped and removed $dir" >&2
