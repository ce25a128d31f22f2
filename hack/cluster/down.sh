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
for name in watchdog kube-controller-manager kube-apiserver etcd; do
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
case "$dir" in
  ""|"/"|"$HOME") echo "cluster-down: refusing to remove $dir" >&2; exit 1 ;;
esac
rm -rf "$dir"
echo "cluster-down: stopped and removed $dir" >&2
