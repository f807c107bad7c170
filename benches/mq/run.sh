#!/usr/bin/env bash
# The MQ benchmark of docs/BENCHMARKS.md: `fskv bench mq` (release build)
# against a fresh `fskv up --replicas 1`, with the baselines (NATS JetStream
# with sync_interval: always and its default, Redis streams with appendfsync
# always) in the same run, then against a fresh `fskv up --replicas 3`.
#   benches/mq/run.sh [extra fskv bench mq arguments, e.g. --seconds 10 --clients 8]
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/lib.sh
VENV=benches/mq/.venv
if [ ! -x "$VENV/bin/nats-server" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --disable-pip-version-check -r benches/mq/requirements.txt
fi
[ -x target/release/fskv ] || cargo build --release -p fskv
work=$(mktemp -d "${TMPDIR:-/tmp}/fskv-mqbench.XXXXXX")
pid=""
cleanup() { fskv_stop_pid "$pid"; rm -rf "$work"; }
trap cleanup EXIT
base=$(fskv_free_base_port 17500)
for r in 1 3; do
    rm -rf "$work/data"
    ./target/release/fskv up --data "$work/data" --base-port "$base" --replicas "$r" >"$work/up.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 900); do grep -q "fskv up: serving" "$work/up.log" 2>/dev/null && break; kill -0 "$pid" || break; sleep 0.2; done
    grep -q "fskv up: serving" "$work/up.log" || { tail -20 "$work/up.log"; exit 1; }
    extra=()
    [ "$r" = 1 ] || extra=(--no-baselines)
    ./target/release/fskv bench mq --data "$work/data" --label "r$r" --nats-server "$VENV/bin/nats-server" "${extra[@]}" "$@"
    fskv_stop_pid "$pid"; pid=""
done
