#!/usr/bin/env bash
# Security conformance: attacks on the public HTTP ports (test_http.py) and
# the internal RPC ports (test_rpc.py) of a running `fskv up` (Python
# standard library only).
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
(cd "$HERE" && python3 -W ignore::ResourceWarning -m unittest -v test_http test_rpc) >"$log" 2>&1 || status=1
cat "$log"
passed=$(grep -c '\.\.\. ok$' "$log")
failed=$(grep -cE '\.\.\. (FAIL|ERROR)$' "$log")
skipped=$(grep -c '\.\.\. skipped' "$log")
grep '\.\.\. skipped' "$log" | sed 's/^/SKIPPED: /'
echo "security conformance: $passed passed, $failed failed, $skipped skipped"
exit $status
