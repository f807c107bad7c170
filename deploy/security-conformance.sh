#!/usr/bin/env bash
# The security conformance suite (conformance/security: attacks on the public ports) against
# a fresh `fskv up`. Uses target/debug/fskv (built if missing).
# Prints `security conformance: N passed, M failed, K skipped`; exits non-zero on failures.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh
[ -x target/debug/fskv ] || cargo build -p fskv
work=$(mktemp -d /tmp/fskv-secconf.XXXXXX)
pid=""
cleanup() {
    fskv_stop_pid "$pid"
    rm -rf "$work"
}
trap cleanup EXIT
base=$(fskv_free_base_port 17600)
./target/debug/fskv up --data "$work/data" --base-port "$base" >"$work/up.log" 2>&1 &
pid=$!
if ! fskv_wait_up "$pid" "$work/up.log"; then
    echo "security-conformance: fskv up did not become ready (log above)"
    echo "security conformance: 0 passed, 1 failed, 0 skipped"
    exit 1
fi
./conformance/security/run.sh "$work/data/endpoints.json"
