#!/usr/bin/env bash
# make bench-proxy: coxswain, nginx and HAProxy, each a reverse proxy to the same backend with
# the same number of workers, keep-alive to the backend, access logs off, measured on the
# traffic users send. Scenarios (BENCH_SCENARIOS picks some; default all):
#   http       HTTP/1.1 cleartext keep-alive (wrk), at 1 and 2 workers
#   https      HTTPS keep-alive, TLS 1.3, ECDSA P-256 certificate (wrk)
#   tls-new    one request per TLS connection: a full handshake each (wrk, Connection: close)
#   h2         HTTP/2 over TLS, 50 connections x 10 streams (h2load)
#   h2-upload  the same, each stream a POST of 256 KiB: past what coxswain's fast path reads
#              whole (64 KiB), so its uploads stream to the backend as they arrive
#   headers    a route that sets, adds and removes request fields and sets and removes
#              response fields
#   post-1k    POST with a 1 KB body
#   post-64k   POST with a 64 KB body
#   post-256k  POST with a 256 KB body (streamed to the backend as it arrives)
#   post-chunked  POST with a 64 KiB body sent chunked, 16 chunks of 4 KiB, as a client that
#              does not know its body's length sends it
#   rewrite    GET /api/items on a route that rewrites the prefix /api to /v2 and has a
#              request timeout (30 s) and a backend request timeout (10 s), as an Ingress with
#              rewrite-target and proxy timeouts, or an HTTPRoute with URLRewrite and timeouts
#   session    a route with cookie session persistence (HTTPRoute sessionPersistence, as
#              Ingress cookie affinity compiles to), clients that bring no cookie: each answer
#              names the endpoint in a Set-Cookie. HAProxy inserts its server cookie; nginx
#              (no sticky cookies in its open source build) hashes the cookie to pick the
#              server and adds the same Set-Cookie
#   retry      a route with a retry policy (503 retried twice, as the Ingress retry annotations
#              or an HTTPRoute retry compile to) whose backend answers 200: the cost of holding
#              each answer's head until its status is known. nginx proxy_next_upstream
#              http_503 with 3 tries, HAProxy retry-on 503 with 2 retries
#   latency    HTTP/1.1 cleartext keep-alive at a fixed rate every proxy sustains (BENCH_RATE,
#              default 40,000 req/s, h2load --h1 --rps): latency at equal load, which the
#              saturated scenarios' p99 cannot compare (there it mostly follows req/s). The
#              load generator's and the backend's CPU per request are printed beside it: on a
#              small machine they share a CPU, and their queueing is most of each request's time
#   latency-tls  the same over TLS 1.3
#              Both run BENCH_LATENCY_ROUNDS rounds (default 5) of BENCH_LATENCY_SECONDS
#              (default 4) per proxy, each on new connections, and print medians with the
#              p99's range: one run's percentiles move more between runs than between
#              proxies, since h2load's 50 clients each fire on their own timer, whose phase
#              is set when the client connects
#   auth       coxswain only: Basic authentication and a rate limit no client reaches; its CPU
#              per request over the plain route's is the cost of those checks
#   idle       memory per idle keep-alive client connection: BENCH_IDLE_CONNECTIONS (default
#              5,000) connections, one GET answered on each, then held; the proxy's resident
#              memory (every process of it) after, less before, over their number
#   idle-tls   the same over TLS 1.3
#   idle-h2    the same over HTTP/2 (TLS 1.3, ALPN h2): one stream answered on each
# Every scenario but http runs at 1 worker (BENCH_WORKERS overrides http's "1 2").
#
# Everything runs on loopback. Absolute numbers on a shared machine are noise; the ratios
# within one run are the result. CPU per request is the proxy's own CPU time (every process
# of it, from /proc) over the measured seconds, divided by the requests the load generator
# completed; "user" is the part of it spent outside the kernel.
# A proxy with one worker gets the last CPU to itself; the load generator and the backend
# share the others (a proxy with more workers may use every CPU). BENCH_PIN=0 lets every
# process use every CPU, as runs before 2026-12-06 did. Unpinned on two cores, the load
# generator and the backend take most of the CPU and a cheaper proxy mostly leaves more to
# them, so req/s ratios stay near 1 however cheap the proxy is. Pinned, a proxy that fills
# its CPU sets the req/s, which is what "faster at one worker" means; the "busy" column
# says whether it filled it (when it did not, the load generator set the pace).
# Settings: BENCH_SECONDS (default 10), BENCH_CONNECTIONS (default 50), COXSWAIN_BIN (a
# binary to measure instead of building this tree's), BENCH_PERF=DIR (record coxswain's CPU
# profile of each measured load with perf into DIR/<scenario>-<workers>.data and print where
# its CPU went; the sampling costs a little CPU of its own, so take figures from a run without;
# BENCH_PERF_CALL_GRAPH=dwarf gives call chains through code built without frame pointers,
# at a much larger file), BENCH_NSTAT=1 (print the TCP segments the whole machine sent per
# request, and the pure ACKs, in the notes column; the load is all on loopback), BENCH_SYSCALLS=1
# (print the system calls each proxy made per request, with the epoll waits, epoll_ctl and
# write calls among them (a connection handed between threads shows in the last two), in
# the notes column: every process and thread of it, counted by perf over the measured load).
set -euo pipefail
# The idle scenarios hold thousands of connections open, on each side.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
seconds="${BENCH_SECONDS:-10}"
connections="${BENCH_CONNECTIONS:-50}"
scenarios="${BENCH_SCENARIOS:-http https tls-new h2 h2-upload headers rewrite session retry post-1k post-64k post-256k latency latency-tls auth idle idle-tls idle-h2}"
rate="${BENCH_RATE:-40000}"
latency_rounds="${BENCH_LATENCY_ROUNDS:-5}"
latency_seconds="${BENCH_LATENCY_SECONDS:-4}"
idle_connections="${BENCH_IDLE_CONNECTIONS:-5000}"
http_workers="${BENCH_WORKERS:-1 2}"
cpus=$(nproc)
pin="${BENCH_PIN:-1}"
(( cpus < 2 )) && pin=0
# Prefixes (commands exec'd by taskset keep their pid): the load generator and the backend
# run under `on_load`, a proxy of one worker under `on_proxy`.
on_load=() on_proxy=()
if [[ $pin == 1 ]]; then
  on_load=(taskset -c "0-$((cpus - 2))")
  on_proxy=(taskset -c "$((cpus - 1))")
fi
proxy_pin() { if (( $1 == 1 )); then echo "${on_proxy[@]}"; fi; }
work="$(mktemp -d /tmp/coxswain-bench.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

missing=()
for pair in wrk:wrk nginx:nginx-light haproxy:haproxy h2load:nghttp2-client openssl:openssl; do
  command -v "${pair%%:*}" >/dev/null 2>&1 || missing+=("${pair#*:}")
done
if (( ${#missing[@]} )); then
  echo "installing ${missing[*]}" >&2
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# COXSWAIN_BIN: a coxswain binary built already (e.g. to compare two builds in one run's
# conditions); otherwise the release build of this tree.
if [[ -n ${COXSWAIN_BIN:-} ]]; then
  coxswain="$COXSWAIN_BIN"
else
  echo "building coxswain (release)" >&2
  (cd "$repo" && cargo build --release -q -p coxswain-operator --bin coxswain)
  target="${CARGO_TARGET_DIR:-$repo/target}"
  coxswain="$target/release/coxswain"
fi

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
backend_port=$(free_port)
proxy_port=$(free_port)

tls_scenario() { [[ $1 == https || $1 == tls-new || $1 == h2 || $1 == h2-upload || $1 == idle-tls || $1 == latency-tls || $1 == idle-h2 ]]; }
scheme() { if tls_scenario "$1"; then echo https; else echo http; fi; }

wait_port() { # port scheme
  for _ in $(seq 100); do
    # Any answer will do (the auth scenario answers 401 without credentials).
    curl -ksS -o /dev/null "$2://127.0.0.1:$1/" 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing answers on port $1" >&2; return 1
}

# One ECDSA P-256 certificate for every proxy.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=bench.example -addext subjectAltName=DNS:bench.example,IP:127.0.0.1 \
  -keyout "$work/key.pem" -out "$work/cert.pem" 2>/dev/null
cat "$work/cert.pem" "$work/key.pem" > "$work/haproxy.pem"

# Request bodies for the POST scenarios, sent by wrk's Lua hook.
for size in 1024 65536 262144; do
  printf 'wrk.method = "POST"\nwrk.body = string.rep("a", %d)\nwrk.headers["Content-Type"] = "application/octet-stream"\n' \
    "$size" > "$work/post-$size.lua"
done

# The chunked POST: wrk.format would add a Content-Length to a body it is given, so the head
# is formatted without one and the chunks appended (once per thread, not per request).
cat > "$work/post-chunked.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Transfer-Encoding"] = "chunked"
local chunk = string.format("%x\r\n", 4096) .. string.rep("a", 4096) .. "\r\n"
local body = string.rep(chunk, 16) .. "0\r\n\r\n"
local req
function init(args) req = wrk.format() .. body end
function request() return req end
LUA

# The HTTP/2 upload's body (h2load sends a file).
head -c 262144 /dev/zero | tr '\0' a > "$work/upload-262144.bin"

# The backend: nginx answering a small body from memory, 1 worker. It reads and drops request
# bodies, as `return` does.
mkdir -p "$work/backend"
cat > "$work/backend/nginx.conf" <<CONF
worker_processes 1;
pid $work/backend/nginx.pid;
error_log $work/backend/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  client_max_body_size 1m;
  server {
    listen 127.0.0.1:$backend_port;
    location / { return 200 "ok\n"; }
  }
}
CONF
"${on_load[@]}" nginx -c "$work/backend/nginx.conf" -p "$work/backend" -g 'daemon off;' &
pids+=($!)
backend_pid=$!
wait_port "$backend_port" http

# Every request carries credentials, so the auth scenario is the only difference between runs;
# the headers scenario's route removes X-Remove, so every request has one.
auth_header="Authorization: Basic $(printf 'bench:correct horse' | base64)"

# CPU time (clock ticks) of a process and its children: nginx and HAProxy work in workers.
# $2 = user: user-space time only.
cpu_ticks() {
  local total=0 p fields='$12 + $13'
  [[ ${2:-} == user ]] && fields='$12'
  for p in "$1" $(pgrep -P "$1" || true); do
    [[ -r /proc/$p/stat ]] || continue
    # Fields 14 and 15: user and system time; the name (field 2) may hold spaces.
    total=$(( total + $(sed 's/^.*) //' "/proc/$p/stat" | awk "{print $fields}") ))
  done
  echo "$total"
}
# Ticks over requests, in µs per request. $1 ticks, $2 requests.
per_request() {
  awk -v t="$1" -v hz="$clk_tck" -v n="$2" 'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print "n/a" }'
}
clk_tck=$(getconf CLK_TCK)

# h2load's summary and its log's percentiles. Prints "requests rps failed p50 p99 p99.9 max",
# times in ms. $1 h2load's output, $2 its --log-file.
h2load_result() {
  local requests failed rps
  requests=$(awk '/^requests:/ {print $8}' <<<"$1")
  failed=$(awk '/^requests:/ {print $10 + $12}' <<<"$1")
  rps=$(awk '/^finished in/ {sub(",", "", $4); print $4}' <<<"$1")
  # The log's third column is each request's time in microseconds.
  awk '{print $3}' "$2" | sort -n | awk -v req="${requests:-0}" -v rps="${rps:-0}" -v f="${failed:-0}" '
    { v[NR] = $1 }
    function at(q) { i = int(NR * q); if (i < 1) i = 1; return sprintf("%.2f", v[i] / 1000) }
    END {
      if (NR) printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", req, rps, f, at(0.5), at(0.99), at(0.999), at(1)
      else printf "%s\t%s\t%s\tn/a\tn/a\tn/a\tn/a\n", req, rps, f
    }'
}

# The CPU time of a subshell's children per request, in µs, from the output of `times` at its
# end: the last line holds the children's user and system time, as "0m1.234s 0m0.567s".
# $1 the output, $2 requests.
children_us_per_request() {
  tail -n 1 <<<"$1" | awk -v n="$2" '
    function secs(t) { split(t, a, "m"); sub("s", "", a[2]); return a[1] * 60 + a[2] }
    { if (n > 0) printf "%.1f", (secs($1) + secs($2)) * 1e6 / n; else print "n/a" }'
}

# The load of a scenario; prints "requests rps p99 load-CPU errors" (load-CPU: the load
# generator's µs per request). $1 scenario, $2 seconds.
load() {
  local scenario=$1 secs=$2 url out
  url="$(scheme "$scenario")://127.0.0.1:$proxy_port/"
  [[ $scenario == rewrite ]] && url+="api/items"
  local wrk_args=(-t2 -c"$connections" -d"${secs}s" --latency -H "$auth_header" -H 'X-Remove: yes')
  case $scenario in
    tls-new) wrk_args+=(-H 'Connection: close') ;;
    post-1k) wrk_args+=(-s "$work/post-1024.lua") ;;
    post-64k) wrk_args+=(-s "$work/post-65536.lua") ;;
    post-256k) wrk_args+=(-s "$work/post-262144.lua") ;;
    post-chunked) wrk_args+=(-s "$work/post-chunked.lua") ;;
  esac
  if [[ $scenario == h2 || $scenario == h2-upload ]]; then
    rm -f "$work/h2.log"
    local upload=()
    [[ $scenario == h2-upload ]] && upload=(-d "$work/upload-262144.bin")
    # 50 connections x 10 concurrent streams; one thread, as each proxy gets one worker.
    out=$("${on_load[@]}" h2load -c"$connections" -m10 -t1 -D"$secs" --log-file="$work/h2.log" \
      "${upload[@]}" -H "$auth_header" -H 'X-Remove: yes' "$url" 2>&1; times)
    local requests rps failed p99 notes=""
    IFS=$'\t' read -r requests rps failed _ p99 _ _ < <(h2load_result "$out" "$work/h2.log")
    [[ $p99 != n/a ]] && p99="${p99}ms"
    (( failed > 0 )) && notes="failed: $failed"
    # Answers other than 2xx count as done for h2load; a refused upload must not pass as one.
    local non2xx
    non2xx=$(awk '/^status codes:/ {print $5 + $7 + $9}' <<<"$out")
    (( ${non2xx:-0} > 0 )) && notes="$notes non-2xx: $non2xx"
    printf '%s\t%s\t%s\t%s\t%s\n' "$requests" "$rps" "$p99" \
      "$(children_us_per_request "$out" "${requests:-0}")" "$notes"
    return
  fi
  # `times` in the same subshell: the CPU time of its child, the load generator.
  out=$("${on_load[@]}" wrk "${wrk_args[@]}" "$url"; times)
  local requests rps p99 notes
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  requests=$(awk '/requests in/ {print $1}' <<<"$out")
  notes=$(awk '/Non-2xx|Socket errors/ {print}' <<<"$out" | tr '\n' ' ')
  printf '%s\t%s\t%s\t%s\t%s\n' "${requests:-0}" "${rps:-0}" "$p99" \
    "$(children_us_per_request "$out" "${requests:-0}")" "$notes"
}

# The latency scenarios' load: BENCH_RATE requests per second spread over the connections,
# each request's time from h2load's log. Prints "requests rps p50 p99 p99.9 max load-CPU
# notes" (ms, and the load generator's µs per request). $1 scenario, $2 seconds.
paced_load() {
  local url out log="$work/paced.log"
  url="$(scheme "$1")://127.0.0.1:$proxy_port/"
  rm -f "$log"
  # `times` in the same subshell: the CPU time of its child, the load generator.
  out=$("${on_load[@]}" h2load --h1 -c"$connections" -t1 --rps=$(( rate / connections )) -D"$2" \
    --log-file="$log" -H "$auth_header" -H 'X-Remove: yes' "$url" 2>&1; times)
  local requests rps failed p50 p99 p999 max load_us notes=""
  IFS=$'\t' read -r requests rps failed p50 p99 p999 max < <(h2load_result "$out" "$log")
  load_us=$(children_us_per_request "$out" "$requests")
  (( failed > 0 )) && notes="failed: $failed"
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$requests" "$rps" "$p50" "$p99" "$p999" "$max" "$load_us" "$notes"
}

# The middle value of its arguments (the lower middle of an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# A latency scenario: warm-up, then rounds of the paced load on new connections, with the
# proxy's CPU time around them all. $1 scenario, $2 proxy name, $3 pid.
measure_paced() {
  paced_load "$1" 2 >/dev/null
  local before after backend_before backend_after requests rps p50 p99 p999 max load_us notes
  local total=0 load_total=0 all_notes="" i
  local -a rpss=() p50s=() p99s=() p999s=() maxs=()
  before=$(cpu_ticks "$3")
  backend_before=$(cpu_ticks "$backend_pid")
  for (( i = 0; i < latency_rounds; i++ )); do
    IFS=$'\t' read -r requests rps p50 p99 p999 max load_us notes < <(paced_load "$1" "$latency_seconds")
    rpss+=("$rps") p50s+=("$p50") p99s+=("$p99") p999s+=("$p999") maxs+=("$max")
    total=$(( total + requests ))
    load_total=$(awk -v t="$load_total" -v u="$load_us" -v n="$requests" 'BEGIN { printf "%.1f", t + u * n }')
    [[ -n $notes ]] && all_notes="${all_notes:+$all_notes; }$notes"
  done
  after=$(cpu_ticks "$3")
  backend_after=$(cpu_ticks "$backend_pid")
  rps=$(median "${rpss[@]}")
  # Short of the rate: the proxy did not keep up, and its latencies are not at equal load.
  awk -v r="$rps" -v want="$rate" 'BEGIN { exit !(r < want * 0.97) }' && all_notes="${all_notes:+$all_notes; }below the rate"
  local range
  range="$(printf '%s\n' "${p99s[@]}" | sort -g | head -n 1)-$(printf '%s\n' "${p99s[@]}" | sort -g | tail -n 1)"
  load_us=$(awk -v t="$load_total" -v n="$total" 'BEGIN { if (n > 0) printf "%.1f", t / n; else print "n/a" }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$rps" "$(median "${p50s[@]}")" \
    "$(median "${p99s[@]}")" "$range" "$(median "${p999s[@]}")" "$(median "${maxs[@]}")" \
    "$(per_request $((after - before)) "$total")" "$load_us" \
    "$(per_request $((backend_after - backend_before)) "$total")" "$all_notes" >> "$work/latency.tsv"
}

# Resident memory of a process and its children, in KiB.
rss_kib() {
  local total=0 p
  for p in "$1" $(pgrep -P "$1" || true); do
    [[ -r /proc/$p/status ]] || continue
    total=$(( total + $(awk '/^VmRSS:/ {print $2}' "/proc/$p/status") ))
  done
  echo "$total"
}

# The idle scenarios: memory per held connection. $1 scenario, $2 proxy name, $3 pid.
measure_idle() {
  local before after held mode=""
  [[ $1 == idle-tls ]] && mode=tls
  [[ $1 == idle-h2 ]] && mode=h2
  before=$(rss_kib "$3")
  coproc HOLD { "${on_load[@]}" python3 "$here/hold.py" "$proxy_port" "$idle_connections" $mode; }
  read -r _ held <&"${HOLD[0]}" || held=0
  after=$(rss_kib "$3")
  exec {HOLD[1]}>&-
  wait "$HOLD_PID" || held=0
  if [[ $held != "$idle_connections" ]]; then
    echo "$2 ($1): the connections were not all held" >&2
    return
  fi
  awk -v s="$1" -v n="$2" -v b="$before" -v a="$after" -v c="$held" \
    'BEGIN { printf "%s\t%s\t%d\t%d\t%d\t%.1f\n", s, n, c, b, a, (a - b) / c }' >> "$work/idle.tsv"
}

# Warm-up, then the measured load with the proxy's CPU time around it. $1 scenario, $2 proxy
# name, $3 workers, $4 pid.
measure() {
  if [[ $1 == idle* ]]; then
    measure_idle "$1" "$2" "$4"
    return
  fi
  if [[ $1 == latency* ]]; then
    measure_paced "$1" "$2" "$4"
    return
  fi
  load "$1" 2 >/dev/null
  local before after user_before user_after requests rps p99 notes cpu_us perf_pid=""
  if [[ -n ${BENCH_PERF:-} && $2 == coxswain ]]; then
    mkdir -p "$BENCH_PERF"
    perf record -q -F 999 --call-graph "${BENCH_PERF_CALL_GRAPH:-fp}" -p "$4" -o "$BENCH_PERF/$1-$3.data" -- sleep "$seconds" 2>/dev/null &
    perf_pid=$!
  fi
  [[ -n ${BENCH_NSTAT:-} ]] && nstat -n >/dev/null
  local counting=""
  if [[ -n ${BENCH_SYSCALLS:-} ]]; then
    syscall_count_start "$4"
    counting=$!
  fi
  local load_us backend_before backend_after
  before=$(cpu_ticks "$4")
  user_before=$(cpu_ticks "$4" user)
  backend_before=$(cpu_ticks "$backend_pid")
  IFS=$'\t' read -r requests rps p99 load_us notes < <(load "$1" "$seconds")
  after=$(cpu_ticks "$4")
  user_after=$(cpu_ticks "$4" user)
  backend_after=$(cpu_ticks "$backend_pid")
  # What the other side cost per request: a proxy that makes them cheaper leaves the shared
  # CPU more requests to offer.
  notes="load us/req $load_us, backend us/req $(per_request $((backend_after - backend_before)) "$requests")${notes:+; $notes}"
  if [[ -n $counting ]]; then
    syscall_count_end "$counting"
    notes="${notes:+$notes; }$(syscalls_per_request "$requests")"
  fi
  if [[ -n ${BENCH_NSTAT:-} ]]; then
    # Every TCP segment the machine sent during the load, and the pure ACKs among those
    # received, per request: what each request cost the kernels of all three processes; and
    # the connections opened (the load generator's new ones, and a proxy's new ones upstream).
    notes="${notes:+$notes; }$(nstat 2>/dev/null | awk -v n="$requests" '
      /^TcpOutSegs / { out = $2 } /^TcpExtTCPPureAcks / { acks = $2 } /^TcpActiveOpens / { opens = $2 }
      END { if (n > 0) printf "segments/req %.2f, pure ACKs/req %.3f, connects/req %.3f", out / n, acks / n, opens / n }')"
  fi
  if [[ -n $perf_pid ]]; then
    wait "$perf_pid" || true
    echo "where coxswain's CPU went ($1, $3 worker(s)), self time:" >&2
    perf report -i "$BENCH_PERF/$1-$3.data" --no-children --stdio --sort dso,symbol \
      --percent-limit 0.7 2>/dev/null | grep -E '^ +[0-9]' | head -45 >&2 || true
  fi
  cpu_us=$(per_request $((after - before)) "$requests")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$rps" "$p99" "$cpu_us" \
    "$(per_request $((user_after - user_before)) "$requests")" "$notes" >> "$work/results.tsv"
}

# BENCH_SYSCALLS: perf counts the system calls of a proxy (its process, its children and all
# their threads) from syscall_count_start (in the background: $! is the counter) until
# syscall_count_end (not in a subshell: it waits for the counter to write its file);
# syscalls_per_request prints them. $1 pid; $1 counter; $1 requests.
syscall_count_start() {
  local procs
  procs=$(printf '%s\n' "$1" $(pgrep -P "$1" || true) | paste -sd,)
  perf stat -x, -o "$work/syscalls.csv" -p "$procs" \
    -e raw_syscalls:sys_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_enter_epoll_pwait \
    -e syscalls:sys_enter_epoll_ctl,syscalls:sys_enter_write 2>/dev/null &
  # perf attaches before it counts; a moment lets it, so the count covers the whole load.
  sleep 0.2
}
syscall_count_end() {
  kill -INT "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
}
syscalls_per_request() {
  awk -F, -v n="$1" '
    $3 ~ /raw_syscalls:sys_enter/ { all = $1 } $3 ~ /sys_enter_epoll_(p)?wait/ { epoll += $1 }
    $3 ~ /sys_enter_epoll_ctl/ { ctl = $1 } $3 ~ /sys_enter_write$/ { write = $1 }
    END { if (n > 0) printf "syscalls/req %.2f (epoll waits %.2f, epoll_ctl %.2f, write %.2f)",
      all / n, epoll / n, ctl / n, write / n }' \
    "$work/syscalls.csv"
}

stop_last() { kill "${pids[-1]}" 2>/dev/null || true; wait "${pids[-1]}" 2>/dev/null || true; unset 'pids[-1]'; sleep 0.5; }

# coxswain: standalone, on a snapshot compiled from the manifests a user would apply.
run_coxswain() { # scenario workers
  local scenario=$1 workers=$2 listener route filters=""
  if tls_scenario "$scenario"; then
    listener="{name: https, port: $proxy_port, protocol: HTTPS, tls: {certificateRefs: [{name: bench-tls}]}}"
  else
    listener="{name: http, port: $proxy_port, protocol: HTTP}"
  fi
  if [[ $scenario == headers ]]; then
    filters="filters:
    - type: RequestHeaderModifier
      requestHeaderModifier:
        set: [{name: X-Bench, value: one}]
        add: [{name: X-Tenant, value: bench}]
        remove: [X-Remove]
    - type: ResponseHeaderModifier
      responseHeaderModifier:
        set: [{name: X-Served-By, value: bench}]
        remove: [Server]"
  fi
  if [[ $scenario == session ]]; then
    filters="sessionPersistence: {sessionName: app-session, type: Cookie}"
  fi
  if [[ $scenario == retry ]]; then
    filters="retry: {codes: [503], attempts: 2}"
  fi
  if [[ $scenario == rewrite ]]; then
    filters="matches: [{path: {type: PathPrefix, value: /api}}]
    filters:
    - type: URLRewrite
      urlRewrite: {path: {type: ReplacePrefixMatch, replacePrefixMatch: /v2}}
    timeouts: {request: 30s, backendRequest: 10s}"
  fi
  if [[ $scenario != auth ]]; then
    route="apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: bench, namespace: bench}
spec:
  parentRefs: [{name: bench}]
  rules:
  - backendRefs: [{name: backend, port: 80}]
    $filters"
  else
    # The annotations a user would write: Basic auth from the Secret, and a rate limit no
    # client of this run reaches. An Ingress is served on the shared pool's HTTP port.
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
  annotations:
    ingress.coxswain-labs.dev/auth-type: basic
    ingress.coxswain-labs.dev/auth-secret: users
    ingress.coxswain-labs.dev/rate-limit-rps: '1000000'
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
  listeners: [$listener]
---
apiVersion: v1
kind: Secret
metadata: {name: bench-tls, namespace: bench}
type: kubernetes.io/tls
data:
  tls.crt: $(base64 -w0 "$work/cert.pem")
  tls.key: $(base64 -w0 "$work/key.pem")
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
  "$coxswain" snapshot compile -f "$work/app.yaml" -o json --ingress-http-port "$proxy_port" \
    > "$work/snapshot.json"
  COXSWAIN_LOG=warn $(proxy_pin "$workers") "$coxswain" serve proxy --snapshot-file "$work/snapshot.json" \
    --bind-address 127.0.0.1 --threads "$workers" --health-addr "127.0.0.1:$(free_port)" &
  pids+=($!)
  wait_port "$proxy_port" "$(scheme "$scenario")"
  measure "$scenario" coxswain "$workers" "${pids[-1]}"
  stop_last
}

run_nginx() { # scenario workers
  local scenario=$1 workers=$2 dir="$work/nginx-$1-$2" listen extra=""
  mkdir -p "$dir"
  if tls_scenario "$scenario"; then
    listen="listen 127.0.0.1:$proxy_port ssl http2;
    ssl_certificate $work/cert.pem;
    ssl_certificate_key $work/key.pem;
    ssl_protocols TLSv1.3;"
  else
    listen="listen 127.0.0.1:$proxy_port;"
  fi
  if [[ $scenario == rewrite ]]; then
    extra="rewrite ^/api(/.*)?\$ /v2\$1 break;
      proxy_connect_timeout 10s;
      proxy_send_timeout 10s;
      proxy_read_timeout 10s;"
  fi
  local balance=""
  if [[ $scenario == retry ]]; then
    extra="proxy_next_upstream error timeout http_503;
      proxy_next_upstream_tries 3;"
  fi
  if [[ $scenario == session ]]; then
    balance="hash \$cookie_app_session consistent;"
    extra="add_header Set-Cookie \"app-session=b1; Path=/; HttpOnly\" always;"
  fi
  if [[ $scenario == headers ]]; then
    extra="proxy_set_header X-Bench one;
      proxy_set_header X-Tenant bench;
      proxy_set_header X-Remove \"\";
      proxy_hide_header Server;
      add_header X-Served-By bench always;"
  fi
  cat > "$dir/nginx.conf" <<CONF
worker_processes $workers;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 16384; }
http {
  access_log off;
  keepalive_requests 1000000;
  # Bodies stream to the backend as they come, none touches the disk.
  client_max_body_size 1m;
  client_body_buffer_size 128k;
  proxy_request_buffering off;
  upstream backend { $balance server 127.0.0.1:$backend_port; keepalive 128; }
  server {
    $listen
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
      $extra
    }
  }
}
CONF
  $(proxy_pin "$workers") nginx -c "$dir/nginx.conf" -p "$dir" -g 'daemon off;' &
  pids+=($!)
  wait_port "$proxy_port" "$(scheme "$scenario")"
  measure "$scenario" nginx "$workers" "${pids[-1]}"
  stop_last
}

run_haproxy() { # scenario workers
  local scenario=$1 workers=$2 bind proto=http extra=""
  if tls_scenario "$scenario"; then
    bind="bind 127.0.0.1:$proxy_port ssl crt $work/haproxy.pem alpn h2,http/1.1 ssl-min-ver TLSv1.3"
    proto=https
  else
    bind="bind 127.0.0.1:$proxy_port"
  fi
  if [[ $scenario == rewrite ]]; then
    extra="http-request replace-path ^/api(/.*)?\$ /v2\\1
  timeout server 10s"
  fi
  local server_cookie=""
  if [[ $scenario == retry ]]; then
    extra="retries 2
  retry-on 503 conn-failure"
  fi
  if [[ $scenario == session ]]; then
    extra="cookie app-session insert indirect httponly"
    server_cookie="cookie b1"
  fi
  if [[ $scenario == headers ]]; then
    extra="http-request set-header X-Bench one
  http-request add-header X-Tenant bench
  http-request del-header X-Remove
  http-response set-header X-Served-By bench
  http-response del-header Server"
  fi
  cat > "$work/haproxy.cfg" <<CONF
global
  nbthread $workers
  # Room for the idle scenarios' connections within 20,000 descriptors (2 per connection).
  maxconn 8192
defaults
  mode http
  timeout connect 5s
  timeout client 30s
  timeout server 30s
  option http-keep-alive
frontend fe
  $bind
  default_backend be
backend be
  http-reuse always
  # The fields coxswain sets on every request, so each proxy does the same work.
  option forwardfor
  http-request set-header X-Real-IP %[src]
  http-request set-header X-Forwarded-Proto $proto
  http-request set-header X-Forwarded-Host %[req.hdr(host)]
  http-request set-header X-Forwarded-Port %[dst_port]
  $extra
  server b1 127.0.0.1:$backend_port $server_cookie
CONF
  $(proxy_pin "$workers") haproxy -f "$work/haproxy.cfg" -db &
  pids+=($!)
  wait_port "$proxy_port" "$(scheme "$scenario")"
  measure "$scenario" haproxy "$workers" "${pids[-1]}"
  stop_last
}

for scenario in $scenarios; do
  if [[ $scenario == auth ]]; then
    run_coxswain auth 1
    continue
  fi
  workers_list=1
  [[ $scenario == http ]] && workers_list=$http_workers
  for workers in $workers_list; do
    echo "scenario $scenario, $workers worker(s)" >&2
    run_coxswain "$scenario" "$workers"
    run_nginx "$scenario" "$workers"
    run_haproxy "$scenario" "$workers"
  done
done

if [[ -s $work/results.tsv ]]; then
  echo
  echo "load: wrk -t2 -c$connections (h2: h2load -c$connections -m10 -t1), ${seconds}s after a 2 s warm-up;"
  if [[ $pin == 1 ]]; then
    echo "a proxy of 1 worker on CPU $((cpus - 1)) alone; load generator and backend on CPUs 0-$((cpus - 2))"
  else
    echo "every process on every CPU (BENCH_PIN=0 or one CPU)"
  fi
  echo "backend: nginx (1 worker), 3-byte body; every proxy sets X-Forwarded-For/-Proto/-Host/-Port and X-Real-IP"
  # "busy": the proxy's CPU time over the seconds measured (req/s x CPU per request), in CPUs. A
  # pinned proxy near 1.00 set the pace; one well below it waited for the load generator.
  # "user": the part of the CPU per request spent in the proxy's own code, not the kernel's.
  printf '%-9s %-9s %7s %12s %10s %11s %5s %6s %14s %s\n' scenario proxy workers "req/s" p99 "CPU us/req" user busy "coxswain/this" notes
  while IFS=$'\t' read -r scenario name workers rps p99 cpu user notes; do
    base=$(awk -F'\t' -v s="$scenario" -v w="$workers" '$1==s && $2=="coxswain" && $3==w {print $4}' "$work/results.tsv")
    ratio=$(awk -v a="$base" -v b="$rps" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
    busy=$(awk -v r="$rps" -v c="$cpu" 'BEGIN { if (c + 0 > 0) printf "%.2f", r * c / 1e6; else print "n/a" }')
    printf '%-9s %-9s %7s %12s %10s %11s %5s %6s %14s %s\n' "$scenario" "$name" "$workers" "$rps" "$p99" "$cpu" "$user" "$busy" "$ratio" "$notes"
  done < "$work/results.tsv"
  cpu_of() { awk -F'\t' -v s="$1" '$1==s && $2=="coxswain" && $3==1 {print $6}' "$work/results.tsv"; }
  if [[ " $scenarios " == *" auth "* && " $scenarios " == *" http "* ]]; then
    awk -v a="$(cpu_of auth)" -v b="$(cpu_of http)" 'BEGIN {
      if (b > 0) printf "\nCPU per request with Basic auth and a rate limit / without (1 worker): %.2f\n", a / b }'
  fi
fi
if [[ -s $work/latency.tsv ]]; then
  echo
  echo "latency at a fixed $rate req/s (h2load --h1 -c$connections -t1 --rps=$(( rate / connections ))), in ms: medians of"
  echo "$latency_rounds rounds of ${latency_seconds}s on new connections, with the range of the rounds' p99 (1 worker):"
  # "load" and "backend": CPU per request of the load generator and of the backend, which share
  # the other CPU; a proxy that costs them more adds to every request's wait.
  printf '%-11s %-9s %10s %7s %7s %11s %7s %7s %11s %5s %8s %16s %s\n' scenario proxy "req/s" p50 p99 "p99 range" p99.9 max "CPU us/req" load backend "p99 coxswain/this" notes
  while IFS=$'\t' read -r scenario name rps p50 p99 range p999 max cpu load backend notes; do
    base=$(awk -F'\t' -v s="$scenario" '$1==s && $2=="coxswain" {print $5}' "$work/latency.tsv")
    ratio=$(awk -v a="$base" -v b="$p99" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
    printf '%-11s %-9s %10s %7s %7s %11s %7s %7s %11s %5s %8s %16s %s\n' "$scenario" "$name" "$rps" "$p50" "$p99" "$range" "$p999" "$max" "$cpu" "$load" "$backend" "$ratio" "$notes"
  done < "$work/latency.tsv"
fi
if [[ -s $work/idle.tsv ]]; then
  echo
  echo "idle keep-alive client connections, one GET answered on each (1 worker):"
  printf '%-9s %-9s %11s %14s %13s %13s %14s\n' scenario proxy connections "RSS before KiB" "RSS held KiB" "KiB per conn" "coxswain/this"
  while IFS=$'\t' read -r scenario name held before after per; do
    base=$(awk -F'\t' -v s="$scenario" '$1==s && $2=="coxswain" {print $6}' "$work/idle.tsv")
    ratio=$(awk -v a="$base" -v b="$per" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }')
    printf '%-9s %-9s %11s %14s %13s %13s %14s\n' "$scenario" "$name" "$held" "$before" "$after" "$per" "$ratio"
  done < "$work/idle.tsv"
fi
