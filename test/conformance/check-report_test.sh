#!/usr/bin/env bash
# Tests check-report.sh (`make script-test`, part of `make test`): every committed report
# passes, and copies of the newest one broken in each way the check exists for fail, naming
# the cause.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
check="$here/check-report.sh"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0

# The newest vX.Y.Z directory's first report: the one the broken copies start from.
newest="$(find "$here/reports" -mindepth 1 -maxdepth 1 -type d -name 'v*' -printf '%f\n' | sort -V | tail -1)"
[[ -n "$newest" ]] || { echo "no report directory under $here/reports" >&2; exit 1; }
base="$(find "$here/reports/$newest" -name '*.yaml' | sort | head -1)"
[[ -n "$base" ]] || { echo "no report under $here/reports/$newest" >&2; exit 1; }

# edit PROFILE ACTION [SECTION FIELD VALUE] < report > copy
#   delete: drop the profile;  set: in its SECTION (core|extended), FIELD: VALUE.
edit() {
  awk -v profile="$1" -v action="$2" -v sect="${3:-}" -v field="${4:-}" -v value="${5:-}" '
    function flush(   i, s, line) {
      if (n == 0) return
      if (name == profile && action == "delete") { n = 0; return }
      s = ""
      for (i = 1; i <= n; i++) {
        line = buf[i]
        if (line ~ /^(- |  )core:/) s = "core"
        if (line ~ /^(- |  )extended:/) s = "extended"
        if (name == profile && action == "set" && s == sect && line ~ ("^ +" field ":")) {
          sub(/:.*/, ": " value, line)
        }
        print line
      }
      n = 0
    }
    /^[A-Za-z]/ { flush(); in_profiles = ($0 ~ /^profiles:/); print; next }
    in_profiles && /^- / { flush(); name = "" }
    in_profiles { buf[++n] = $0; if ($0 ~ /^  name:/) name = $2; next }
    { print }
    END { flush() }
  '
}

pass() {
  local what="$1" report="$2"
  if "$check" "$report" >/dev/null 2>"$tmp/err"; then
    echo "ok: $what passes"
  else
    echo "FAIL: $what should pass: $(cat "$tmp/err")" >&2
    failures=$((failures + 1))
  fi
}

# expect_fail WHAT EXPECTED-MESSAGE PROFILE ACTION [SECTION FIELD VALUE]
expect_fail() {
  local what="$1" message="$2"
  shift 2
  local copy="$tmp/report.yaml"
  edit "$@" <"$base" >"$copy"
  if cmp -s "$base" "$copy"; then
    echo "FAIL: $what: the edit changed nothing, so it tests nothing" >&2
    failures=$((failures + 1))
    return
  fi
  if "$check" "$copy" >/dev/null 2>"$tmp/err"; then
    echo "FAIL: $what should fail, and passed" >&2
    failures=$((failures + 1))
  elif ! grep -qF -- "$message" "$tmp/err"; then
    echo "FAIL: $what failed without saying \"$message\": $(cat "$tmp/err")" >&2
    failures=$((failures + 1))
  else
    echo "ok: $what fails ($message)"
  fi
}

while IFS= read -r report; do
  pass "${report#"$here/"}" "$report"
done < <(find "$here/reports" -name '*.yaml' | sort)

for profile in GATEWAY-HTTP GATEWAY-GRPC GATEWAY-TLS; do
  expect_fail "$profile removed" "profile $profile missing" "$profile" delete
done
expect_fail "an extended test skipped" "GATEWAY-TLS extended: 2 skipped" \
  GATEWAY-TLS set extended Skipped 2
expect_fail "a core test skipped" "GATEWAY-HTTP core: 1 skipped" GATEWAY-HTTP set core Skipped 1
expect_fail "an extended test failed" "GATEWAY-GRPC extended: 1 failed" \
  GATEWAY-GRPC set extended Failed 1
expect_fail "an extended result not success" "GATEWAY-HTTP extended result partial" \
  GATEWAY-HTTP set extended result partial

: >"$tmp/empty.yaml"
if "$check" "$tmp/empty.yaml" >/dev/null 2>&1; then
  echo "FAIL: an empty report should fail" >&2
  failures=$((failures + 1))
else
  echo "ok: an empty report fails"
fi

if ((failures > 0)); then
  echo "check-report_test: $failures failure(s)" >&2
  exit 1
fi
echo "check-report_test: every case as expected"
