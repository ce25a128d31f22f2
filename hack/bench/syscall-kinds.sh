#!/usr/bin/env bash
# Which system calls coxswain makes, by kind, over 4 s of load (exploratory, not part of
# make test): a nginx backend on CPU 0, coxswain with one worker on CPU 1, then perf counts
# each system call kind of the proxy while h2load (keep-alive, RPS per connection, 50
# connections) or, with NEW=1, wrk with one request per connection drives it.
#   hack/bench/syscall-kinds.sh clear|tls     BIN=<coxswain binary> (default: /tmp/coxswain-rel)
#   STRACE=1 to count (the name is historical: perf does the counting), RPS (default 400).
# Divide each count by the requests the load line prints.
set -euo pipefail
bin=${BIN:-/tmp/coxswain-rel}
w=$(mktemp -d)
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
bp=$(free_port); pp=$(free_port)
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=bench.example -addext subjectAltName=DNS:bench.example,IP:127.0.0.1 -keyout $w/key.pem -out $w/cert.pem 2>/dev/null
mkdir -p $w/backend
cat > $w/backend/nginx.conf <<CONF
worker_processes 1; pid $w/backend/nginx.pid; error_log $w/backend/error.log warn;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:$bp; location / { return 200 "ok\n"; } } }
CONF
taskset -c 0 nginx -c $w/backend/nginx.conf -p $w/backend -g 'daemon off;' & bpid=$!
trap 'kill $bpid ${ppid:-} 2>/dev/null; rm -rf $w' EXIT
mode=$1  # clear|tls
if [[ $mode == tls ]]; then listener="{name: https, port: $pp, protocol: HTTPS, tls: {certificateRefs: [{name: bench-tls}]}}"; scheme=https; else listener="{name: http, port: $pp, protocol: HTTP}"; scheme=http; fi
cat > $w/app.yaml <<YAML
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: coxswain}
spec: {controllerName: coxswain-labs.dev/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: bench, namespace: bench}
spec: {gatewayClassName: coxswain, listeners: [$listener]}
---
apiVersion: v1
kind: Secret
metadata: {name: bench-tls, namespace: bench}
type: kubernetes.io/tls
data: {tls.crt: $(base64 -w0 $w/cert.pem), tls.key: $(base64 -w0 $w/key.pem)}
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
ports: [{port: $bp}]
endpoints: [{addresses: [127.0.0.1]}]
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bench, namespace: bench}
spec:
  parentRefs: [{name: bench}]
  rules: [{backendRefs: [{name: backend, port: 80}]}]
YAML
$bin snapshot compile -f $w/app.yaml -o json > $w/snap.json
COXSWAIN_LOG=warn taskset -c 1 $bin serve proxy --snapshot-file $w/snap.json --bind-address 127.0.0.1 --threads 1 --health-addr 127.0.0.1:$(free_port) & ppid=$!
for i in $(seq 100); do curl -ksS -o /dev/null $scheme://127.0.0.1:$pp/ 2>/dev/null && break; sleep 0.1; done
taskset -c 0 h2load --h1 -c50 -t1 --rps=800 -D2 $scheme://127.0.0.1:$pp/ >/dev/null 2>&1
if [[ ${STRACE:-0} == 1 ]]; then
  ev=""; for s in epoll_wait futex read write writev recvfrom sendto epoll_ctl accept4 close shutdown setsockopt getsockopt getsockname getpeername ioctl fcntl socket connect; do ev="$ev,syscalls:sys_enter_$s"; done
  perf stat -e raw_syscalls:sys_enter${ev} -p $ppid -o $w/strace.txt & spid=$!
  sleep 0.2
fi
if [[ ${NEW:-0} == 1 ]]; then taskset -c 0 wrk -t1 -c50 -d4 -H 'Connection: close' $scheme://127.0.0.1:$pp/ | grep -E "requests in|Requests/sec"; else
taskset -c 0 h2load --h1 -c50 -t1 --rps=${RPS:-400} -D4 --log-file=$w/log $scheme://127.0.0.1:$pp/ 2>&1 | grep -E "requests:|time for request"; fi
if [[ ${STRACE:-0} == 1 ]]; then kill -INT $spid; sleep 1; grep -E 'sys_enter' $w/strace.txt; fi
awk '{print $3}' $w/log | sort -n | awk '{v[NR]=$1} END {printf "p50 %.3f ms p99 %.3f ms n=%d\n", v[int(NR*0.5)]/1000, v[int(NR*0.99)]/1000, NR}'
