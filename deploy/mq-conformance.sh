#!/usr/bin/env bash
# The MQ conformance suite (conformance/mq) against a fresh `fskv up`: the
# native API, the SQS facade with boto3 (and differential runs against moto
# when available), then the kill -9 durability test (last: it kills a storage
# node and the MQ writer gateway of that cluster, by pid). Uses the binary
# that `cargo test` built (target/debug/fskv), building it if missing.
# Prints `mq conformance: N passed, M failed, K skipped`; exits non-zero on failures.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
. deploy/lib.sh
[ -x target/debug/fskv ] || cargo build -p fskv
VENV="$PWD/conformance/.venv-mq"
REQ="conformance/mq/requirements.txt"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
marker="$VENV/.conformance-requirements"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$marker" 2>/dev/null)" != "$want" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ" >"$VENV.install.log" 2>&1 \
        || { echo "mq-conformance: pip install failed, see $VENV.install.log" >&2; exit 2; }
    echo "$want" >"$marker"
fi
work=$(mktemp -d /tmp/fskv-mqconf.XXXXXX)
pid=""
cleanup() {
    fskv_stop_pid "$pid"
    rm -rf "$work"
}
trap cleanup EXIT
base=$(fskv_free_base_port 17300)
FSKV_LOG=info ./target/debug/fskv up --data "$work/data" --base-port "$base" >"$work/up.log" 2>&1 &
pid=$!
if ! fskv_wait_up "$pid" "$work/up.log"; then
    echo "mq-conformance: fskv up did not become ready (log above)"
    echo "mq conformance: 0 passed, 1 failed, 0 skipped"
    exit 1
fi
echo "mq-conformance: fskv up on base port $base"
set +e
(cd conformance/mq && MQ_ENDPOINTS="$work/data/endpoints.json" MQ_UP_LOG="$work/up.log" MQ_FSKV_BIN="$root/target/debug/fskv" \
    "$VENV/bin/python" -m pytest -q -rs -p no:cacheprovider "$@" test_native.py $(ls test_sqs*.py 2>/dev/null) test_durability.py) \
    | tee "$work/pytest.log"
status=${PIPESTATUS[0]}
set -e
line=$(grep -E "^[0-9]+ (passed|failed)|^=+ .*(passed|failed)" "$work/pytest.log" | tail -1)
count() { echo "$line" | grep -oE "[0-9]+ $1" | grep -oE "[0-9]+" || echo 0; }
echo "mq conformance: $(count passed) passed, $(count failed) failed, $(count skipped) skipped"
exit $status
