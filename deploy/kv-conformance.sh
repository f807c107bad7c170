#!/usr/bin/env bash
# The KV conformance suite (conformance/kv: Python client, py-consul) against
# a fresh `fskv up`. Uses target/debug/fskv (built if missing).
# Prints `kv conformance: N passed, M failed, K skipped`; exits non-zero on failures.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh
[ -x target/debug/fskv ] || cargo build -p fskv
work=$(mktemp -d /tmp/fskv-kvconf.XXXXXX)
pid=""
cleanup() {
    fskv_stop_pid "$pid"
    rm -rf "$work"
}
trap cleanup EXIT
base=$(fskv_free_base_port 17300)
./target/debug/fskv up --data "$work/data" --base-port "$base" >"$work/up.log" 2>&1 &
pid=$!
if ! fskv_wait_up "$pid" "$work/up.log"; then
    echo "kv-conformance: fskv up did not become ready (log above)"
    echo "kv conformance: 0 passed, 1 failed, 0 skipped"
    exit 1
fi
./conformance/kv/run.sh "$work/data/endpoints.json"
