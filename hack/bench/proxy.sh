#!/usr/bin/env bash
# make bench-proxy: wrk against coxswain, nginx and HAProxy, each a reverse proxy to the same
# backend with the same number of workers (1 and 2), keep-alive on both sides, small
# responses. Prints requests/s and p99 per proxy and the ratios to coxswain.
#
# Everything runs on loopback. On a 2-core machine wrk, the proxy and the backend share the
# cores, so absolute numbers are noise; the ratios within one run are the result.
# Settings: BENCH_SECONDS (default 10), BENCH_CONNECTIONS (default 50).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
seconds="${BENCH_SECONDS:-10}"
connections="${BENCH_CONNECTIONS:-50}"
work="$(mktemp -d /tmp/coxswain-bench.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

missing=()
for pair in wrk:wrk nginx:nginx-light haproxy:haproxy; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if (( ${#missing[@]} )); then
  echo "installing ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

echo "building coxswain (release)" >&2
(cd "$repo" && cargo build --release -q -p coxswain-operator --bin coxswain)
target="${CARGO_TARGET_DIR:-$repo/target}"
coxswain="$target/release/coxswain"

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
backend_port=$(free_port)
proxy_port=$(free_port)

wait_port() {
  for _ in $(seq 100); do
    curl -fsS -o /dev/null "http://127.0.0.1:$1/" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing answers on port $1" >&2; return 1
}

# The backend: nginx answering a small body from memory, 1 worker.
mkdir -p "$work/backend"
cat > "$work/backend/nginx.conf" <<CONF
worker_processes 1;
pid $work/backend/nginx.pid;
error_log $work/backend/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  server {
    listen 127.0.0.1:$backend_port;
    location / { return 200 "ok\n"; }
  }
}
CONF
nginx -c "$work/backend/nginx.conf" -p "$work/backend" -g 'daemon off;' &
pids+=($!)
wait_port "$backend_port"

run_wrk() { # name workers
  wrk -t2 -c"$connections" -d2s "http://127.0.0.1:$proxy_port/" >/dev/null 2>&1 # warm-up
  local out rps p99
  out=$(wrk -t2 -c"$connections" -d"${seconds}s" --latency "http://127.0.0.1:$proxy_port/")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  local errors
  errors=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$rps" "$p99" "$errors" >> "$work/results.tsv"
}

stop_last() { kill "${pids[-1]}" 2>/dev/null || true; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; sleep 0.5; }

for workers in 1 2; do
  # coxswain: standalone, snapshot compiled from manifests.
  cat > "$work/app.yaml" <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: coxswain}
spec: {controllerName: coxswain-labs.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: bench, namespace: bench}
spec:
  gatewayClassName: coxswain
  listeners: [{name: http, port: $proxy_port, protocol: HTTP}]
---
apiVersion: v1
kind: Service
metadata: {name: backend, namespace: bench}
spec: {ports: [{port: 80}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: backend-1, namespace: bench, labels: {kubernetes.io/service-name: backend}}
addressType: IPv4
ports: [{port: $backend_port}]
endpoints: [{addresses: [127.0.0.1]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bench, namespace: bench}
spec:
  parentRefs: [{name: bench}]
  rules: [{backendRefs: [{name: backend, port: 80}]}]
YAML
  "$coxswain" snapshot compile -f "$work/app.yaml" -o json > "$work/snapshot.json"
  COXSWAIN_LOG=warn "$coxswain" serve proxy --snapshot-file "$work/snapshot.json" \
    --bind-address 127.0.0.1 --threads "$workers" --health-addr "127.0.0.1:$(free_port)" &
  pids+=($!)
  wait_port "$proxy_port"
  run_wrk coxswain "$workers"
  stop_last

  mkdir -p "$work/nginx$workers"
  cat > "$work/nginx$workers/nginx.conf" <<CONF
worker_processes $workers;
pid $work/nginx$workers/nginx.pid;
error_log $work/nginx$workers/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  upstream backend { server 127.0.0.1:$backend_port; keepalive 128; }
  server {
    listen 127.0.0.1:$proxy_port;
    location / {
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      # The fields coxswain sets on every request, so each proxy does the same work.
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Real-IP \$remote_addr;
      proxy_set_header X-Forwarded-Proto \$scheme;
      proxy_set_header X-Forwarded-Host \$host;
      proxy_set_header X-Forwarded-Port \$server_port;
    }
  }
}
CONF
  nginx -c "$work/nginx$workers/nginx.conf" -p "$work/nginx$workers" -g 'daemon off;' &
  pids+=($!)
  wait_port "$proxy_port"
  run_wrk nginx "$workers"
  stop_last

  cat > "$work/haproxy$workers.cfg" <<CONF
global
  nbthread $workers
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend fe
  bind 127.0.0.1:$proxy_port
  default_backend be
backend be
  http-reuse always
  # The fields coxswain sets on every request, so each proxy does the same work.
  option forwardfor
  http-request set-header X-Real-IP %[src]
  http-request set-header X-Forwarded-Proto http
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  http-request set-header X-Forwarded-Port %[dst_port]
  server b1 127.0.0.1:$backend_port
CONF
  haproxy -f "$work/haproxy$workers.cfg" -db &
  pids+=($!)
  wait_port "$proxy_port"
  run_wrk haproxy "$workers"
  stop_last
done

echo
echo "wrk -t2 -c$connections -d${seconds}s, keep-alive, 3-byte body, backend: nginx (1 worker);"
echo "every proxy sets X-Forwarded-For/-Proto/-Host/-Port and X-Real-IP"
printf '%-9s %7s %12s %10s %18s %s\n' proxy workers "req/s" p99 "coxswain/this" notes
while IFS=$'\t' read -r name workers rps p99 notes; do
  base=$(awk -F'\t' -v w="$workers" '$1=="coxswain" && $2==w {print $3}' "$work/results.tsv")
  ratio=$(awk -v a="$base" -v b="$rps" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
  printf '%-9s %7s %12s %10s %18s %s\n' "$name" "$workers" "$rps" "$p99" "$ratio" "$notes"
done < "$work/results.tsv"
