#!/usr/bin/env bash
# Profiles the S3 gateway of a fresh `fskv up --replicas 1` while s5cmd
# uploads 4 x 64 MiB objects in a loop (multipart, 50 MB parts), with
# `perf record` for 8 s; prints the top symbols and the gateway's and the
# front's CPU (top) in that window.
#
#   benches/s3/profile_put.sh FSKV_BIN OUT_PREFIX [BASE_PORT]
#
# Needs perf and the conformance venv (s5cmd). Loopback only; stops the
# cluster and removes its data at the end.
set -euo pipefail
BIN=${1:?fskv binary}; OUT=${2:?output prefix}; BASE=${3:-37200}
HERE="$(cd "$(dirname "$0")" && pwd)"; REPO="$(cd "$HERE/../.." && pwd)"
W="$(mktemp -d "$REPO/target/s3prof.XXXXXX")"
UP=""
cleanup() { [ -n "$UP" ] && { kill -TERM "$UP" 2>/dev/null || true; wait "$UP" 2>/dev/null || true; }; rm -rf "$W"; }
trap cleanup EXIT
trap 'exit 1' TERM INT
mkdir -p "$W/in"
for i in 0 1 2 3; do head -c $((64 << 20)) /dev/urandom > "$W/in/big$i"; done
"$BIN" up --data "$W/data" --base-port "$BASE" --replicas 1 > "$W/up.log" 2>&1 &
UP=$!
for _ in $(seq 1 1500); do
    grep -q "fskv up: serving" "$W/up.log" 2>/dev/null && [ -f "$W/data/endpoints.json" ] && break
    kill -0 "$UP" 2>/dev/null || { echo "fskv up exited:"; tail -5 "$W/up.log"; exit 1; }
    sleep 0.2
done
read -r EP AK SK < <(python3 -c "import json;e=json.load(open('$W/data/endpoints.json'));print(e['s3'],e['access_key'],e['secret_key'])")
S5="$REPO/conformance/.venv/bin/s5cmd --endpoint-url $EP --numworkers 32"
export AWS_ACCESS_KEY_ID=$AK AWS_SECRET_ACCESS_KEY=$SK AWS_REGION=us-east-1
$S5 mb s3://prof > /dev/null
$S5 cp "$W/in/big0" s3://prof/warm > /dev/null   # the front starts a gateway process on demand
GW=$(ps -eo pid,args | grep "gateway s3" | grep "$W" | grep -v grep | awk '{print $1}' | head -1)
FRONT=$(ps -eo pid,args | grep " front" | grep "$W" | grep -v grep | awk '{print $1}' | head -1)
echo "gateway pid $GW, front pid $FRONT, endpoint $EP"
# Uploads until the profile is taken (each round 256 MiB; at most 3 rounds).
( for r in 1 2 3; do [ -e "$W/stop" ] && break; $S5 cp "$W/in/*" "s3://prof/r$r/" > /dev/null; done ) &
LOOP=$!
sleep 1
top -b -d 8 -n 2 -p "$GW,$FRONT" > "$OUT.top" 2>/dev/null &
TOP=$!
perf record -F 499 -g -p "$GW" -o "$OUT.data" -- sleep 8 2>/dev/null || true
wait "$TOP" || true
touch "$W/stop"
wait "$LOOP" || true
perf report -i "$OUT.data" --no-children --sort symbol --stdio 2>/dev/null | grep -E "^ +[0-9]" | head -30 > "$OUT.txt" || true
cat "$OUT.txt"
tail -4 "$OUT.top"
