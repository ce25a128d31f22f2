#!/usr/bin/env bash
# make bench-proxy: wrk against coxswain, nginx and HAProxy, each a reverse proxy to the same
# backend with the same number of workers (1 and 2), keep-alive on both sides, small
# responses. Prints requests/s and p99 per proxy and the ratios to coxswain.
#
# Everything runs on loopback. On a 2-core machine wrk, the proxy and the backend share the
# cores, so absolute numbers are noise; the ratios within one run are the result.
# CPU per request is the proxy's own CPU time (every process of it, from /proc) over the run,
# divided by the requests wrk completed.
# A last coxswain run at 1 worker serves a route with Basic authentication and a rate limit
# that never triggers (every request carries the right password): its CPU per request next to
# the plain route's is the cost of those checks.
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
    # Any answer will do (the auth scenario answers 401 without credentials).
    curl -sS -o /dev/null "http://127.0.0.1:$1/" 2>/dev/null && return 0
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

# Every request carries credentials, so the auth scenario is the only difference between runs.
auth_header="Authorization: Basic $(printf 'bench:correct horse' | base64)"

# CPU time (clock ticks) of a process and its children: nginx and HAProxy work in workers.
cpu_ticks() {
  local total=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    [[ -r /proc/$p/stat ]] || continue
    # Fields 14 and 15: user and system time; the name (field 2) may hold spaces.
    total=$(( total + $(sed 's/^.*) //' "/proc/$p/stat" | awk '{print $12 + $13}') ))
  done
  echo "$total"
}
clk_tck=$(getconf CLK_TCK)

run_wrk() { # name workers pid
  wrk -t2 -c"$connections" -d2s -H "$auth_header" "http://127.0.0.1:$proxy_port/" >/dev/null 2>&1 # warm-up
  local out rps p99 requests before after cpu_us
  before=$(cpu_ticks "$3")
  out=$(wrk -t2 -c"$connections" -d"${seconds}s" --latency -H "$auth_header" "http://127.0.0.1:$proxy_port/")
  after=$(cpu_ticks "$3")
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  cpu_us=$(awk -v t=$((after - before)) -v hz="$clk_tck" -v n="$requests" \
    'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print "n/a" }')
  local errors
  errors=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$rps" "$p99" "$cpu_us" "$errors" >> "$work/results.tsv"
}

stop_last() { kill "${pids[-1]}" 2>/dev/null || true; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; sleep 0.5; }

# coxswain: standalone, on a snapshot compiled from manifests. $1: workers; $2: the row's name;
# $3: empty for an HTTPRoute, else the annotations of an Ingress serving the same backend (the
# auth scenario: Basic auth from a Secret, and a rate limit).
run_coxswain() {
  local workers=$1 name=$2 annotations=$3 route
  if [[ -z "$annotations" ]]; then
    route="apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bench, namespace: bench}
spec:
  parentRefs: [{name: bench}]
  rules: [{backendRefs: [{name: backend, port: 80}]}]"
  else
    route="apiVersion: v1
kind: Secret
metadata: {name: users, namespace: bench}
type: Opaque
stringData: {auth: 'bench:\$apr1\$r31Jzq3U\$oriiaS31APatLwvTBKE3D.'}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: coxswain}
spec: {controller: coxswain-labs.dev/gateway-controller}
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: bench
  namespace: bench
  annotations: {$annotations}
spec:
  ingressClassName: coxswain
  rules:
  - http:
      paths: [{path: /, pathType: Prefix, backend: {service: {name: backend, port: {number: 80}}}}]"
  fi
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
$route
YAML
  # An Ingress is served on the shared pool's HTTP port: the measured one here.
  "$coxswain" snapshot compile -f "$work/app.yaml" -o json --ingress-http-port "$proxy_port" \
    > "$work/snapshot.json"
  COXSWAIN_LOG=warn "$coxswain" serve proxy --snapshot-file "$work/snapshot.json" \
    --bind-address 127.0.0.1 --threads "$workers" --health-addr "127.0.0.1:$(free_port)" &
  pids+=($!)
  wait_port "$proxy_port"
  run_wrk "$name" "$workers" "${pids[-1]}"
  stop_last
}

for workers in 1 2; do
  run_coxswain "$workers" coxswain ""

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
  run_wrk nginx "$workers" "${pids[-1]}"
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
  run_wrk haproxy "$workers" "${pids[-1]}"
  stop_last
done

# The same Ingress annotations a user would write: Basic auth from the Secret, and a rate
# limit no client of this run reaches.
run_coxswain 1 coxswain+auth \
  'ingress.coxswain-labs.dev/auth-type: basic, ingress.coxswain-labs.dev/auth-secret: users, ingress.coxswain-labs.dev/rate-limit-rps: "1000000"'

echo
echo "wrk -t2 -c$connections -d${seconds}s, keep-alive, 3-byte body, backend: nginx (1 worker);"
echo "every proxy sets X-Forwarded-For/-Proto/-Host/-Port and X-Real-IP"
printf '%-14s %7s %12s %10s %14s %18s %s\n' proxy workers "req/s" p99 "CPU us/req" "coxswain/this" notes
while IFS=$'\t' read -r name workers rps p99 cpu notes; do
  base=$(awk -F'\t' -v w="$workers" '$1=="coxswain" && $2==w {print $3}' "$work/results.tsv")
  ratio=$(awk -v a="$base" -v b="$rps" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
  printf '%-14s %7s %12s %10s %14s %18s %s\n' "$name" "$workers" "$rps" "$p99" "$cpu" "$ratio" "$notes"
done < "$work/results.tsv"
cpu_of() { awk -F'\t' -v n="$1" '$1==n && $2==1 {print $5}' "$work/results.tsv"; }
awk -v a="$(cpu_of coxswain+auth)" -v b="$(cpu_of coxswain)" 'BEGIN {
  if (b > 0) printf "\nCPU per request with Basic auth and a rate limit / without (1 worker): %.2f\n", a / b }'
