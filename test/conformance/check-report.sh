#!/usr/bin/env bash
# Fails unless a conformance report shows the GATEWAY-HTTP, GATEWAY-GRPC and GATEWAY-TLS profiles,
# each with its core and extended tests passing and none of them skipped: what
# `make conformance` must hold before CI is green. A skipped test is one the report does not
# prove, core or extended alike. test/conformance/check-report_test.sh tests this script.
set -euo pipefail
report="${1:?usage: check-report.sh REPORT}"
[[ -s "$report" ]] || { echo "conformance report $report is missing or empty" >&2; exit 1; }
awk -v report="$report" -v required="GATEWAY-HTTP GATEWAY-GRPC GATEWAY-TLS" '
  # Profiles are list items under "profiles:"; their fields come sorted (core, extended, name,
  # summary), so a problem is named once the profile name is read.
  /^[A-Za-z]/ { in_profiles = ($0 ~ /^profiles:/) }
  in_profiles && /^- / { pending = "" }
  in_profiles && /^(- |  )core:/ { section = "core" }
  in_profiles && /^(- |  )extended:/ { section = "extended" }
  in_profiles && /^ *result:/ {
    results++
    if ($2 != "success") { pending = pending sprintf(" %s result %s;", section, $2) }
  }
  in_profiles && /^ *Failed:/ && $2 != 0 { pending = pending sprintf(" %s: %s failed;", section, $2) }
  in_profiles && /^ *Skipped:/ && $2 != 0 { pending = pending sprintf(" %s: %s skipped;", section, $2) }
  in_profiles && /^  name:/ {
    seen[$2] = 1
    if (pending != "") { bad = bad sprintf("%s%s ", $2, pending) }
    pending = ""
  }
  END {
    if (results == 0) { print report ": no results in the report" > "/dev/stderr"; exit 1 }
    if (pending != "") { bad = bad sprintf("unnamed profile%s ", pending) }
    n = split(required, names, " ")
    for (i = 1; i <= n; i++) {
      if (!(names[i] in seen)) { bad = bad sprintf("profile %s missing; ", names[i]) }
    }
    if (bad != "") { print report ": " bad > "/dev/stderr"; exit 1 }
  }
' "$report"
echo "conformance report $report: GATEWAY-HTTP, -GRPC and -TLS, every result success, no test skipped"
