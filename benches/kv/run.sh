#!/usr/bin/env bash
# `fskv bench kv-gateway` against two fresh release-build clusters
# (replication 3 and 1) on free loopback ports; extra arguments go to the
# bench (e.g. --seconds 3 --json out.json). Build first:
#   cargo build --release -p fskv
set -euo pipefail
cd "$(dirname "$0")/../.."
. deploy/lib.sh
BIN=./target/release/fskv
[ -x "$BIN" ] || { echo "build it first: cargo build --release -p fskv" >&2; exit 2; }
work=$(mktemp -d /tmp/fskv-kvbench.XXXXXX)
b3=$(fskv_free_base_port 32000)
$BIN up --data $work/r3 --base-port $b3 --replicas 3 > $work/r3.log 2>&1 &
p3=$!
b1=$(fskv_free_base_port $((b3 + 20)))
$BIN up --data $work/r1 --base-port $b1 --replicas 1 > $work/r1.log 2>&1 &
p1=$!
trap 'kill -TERM $p3 $p1 2>/dev/null; wait $p3 $p1 2>/dev/null; rm -rf $work' EXIT
for f in r3 r1; do
  for _ in $(seq 1 600); do grep -q "serving; Ctrl-C" $work/$f.log && break; sleep 0.2; done
done
grep -q "serving; Ctrl-C" $work/r3.log && grep -q "serving; Ctrl-C" $work/r1.log
uptime
$BIN bench kv-gateway --target r3=$work/r3 --target r1=$work/r1 "$@"
uptime
