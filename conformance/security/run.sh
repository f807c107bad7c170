#!/usr/bin/env bash
# Security conformance: attacks on the public HTTP ports of a running
# `fskv up` (test_http.py; Python standard library only).
#
#   run.sh ENDPOINTS_JSON      (the endpoints.json of an `fskv up`)
#
# Prints "security conformance: N passed, M failed, K skipped" and exits
# non-zero when anything failed.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export FSKV_ENDPOINTS="${1:?usage: run.sh ENDPOINTS_JSON}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
(cd "$HERE" && python3 -W ignore::ResourceWarning -m unittest -v test_http) >"$log" 2>&1 || status=1
cat "$log"
passed=$(grep -c '\.\.\. ok$' "$log")
failed=$(grep -cE '\.\.\. (FAIL|ERROR)$' "$log")
skipped=$(grep -c '\.\.\. skipped' "$log")
grep '\.\.\. skipped' "$log" | sed 's/^/SKIPPED: /'
echo "security conformance: $passed passed, $failed failed, $skipped skipped"
exit $status
