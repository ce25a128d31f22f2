#!/usr/bin/env bash
# Fails unless a conformance report shows every profile's core and extended tests passing and
# no core test skipped: what `make conformance` must hold before CI is green.
set -euo pipefail
report="${1:?usage: check-report.sh REPORT}"
[[ -s "$report" ]] || { echo "conformance report $report is missing or empty" >&2; exit 1; }
awk -v report="$report" '
  /^- core:/ || /^  core:/ { section = "core" }
  /^  extended:/ { section = "extended" }
  /^ *result:/ {
    results++
    if ($2 != "success") { bad = bad sprintf("%s result %s; ", section, $2) }
  }
  /^ *Failed:/ && $2 != 0 { bad = bad sprintf("%s: %s failed; ", section, $2) }
  /^ *Skipped:/ && section == "core" && $2 != 0 { bad = bad sprintf("core: %s skipped; ", $2) }
  END {
    if (results == 0) { print report ": no results in the report" > "/dev/stderr"; exit 1 }
    if (bad != "") { print report ": " bad > "/dev/stderr"; exit 1 }
  }
' "$report"
echo "conformance report $report: every result success, no core test skipped"
