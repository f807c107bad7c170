#!/bin/bash
# What the mount's read-around (docs/fuse.md "Read-around") costs where it
# cannot pay back: cold 4 KiB random reads over a file much larger than what a
# short run touches. One `fskv up --replicas 1`, two mounts of it (read-around
# at its default and off), one file written once; then ROUNDS alternating runs
# on the two mounts, caches dropped before each: fio IOPS and mean latency,
# the disk's reads (/proc/diskstats of the disk holding /) and the storage
# nodes' mean BatchRead time.
#
#   benches/fs/read-around-cost.sh [--fskv PATH] [--size-mib 4096] [--seconds 4] [--rounds 3]
#                                  [--bs 4k] [--base-port 22000] [--dir PARENT]
#   --base-port the first base port to try (the first free range from there is used)
# Needs root (mounts, drop_caches) and fio.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../../deploy/lib.sh
. "$REPO/deploy/lib.sh"
FSKV=${CARGO_TARGET_DIR:-$REPO/target}/release/fskv
SIZE_MIB=4096
SECS=4
ROUNDS=3
BS=4k
P=22000
PARENT=${TMPDIR:-/tmp}
while [ $# -gt 0 ]; do
    case "$1" in
        --fskv) FSKV=$2; shift 2 ;;
        --size-mib) SIZE_MIB=$2; shift 2 ;;
        --seconds) SECS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --bs) BS=$2; shift 2 ;;
        --base-port) P=$2; shift 2 ;;
        --dir) PARENT=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
[ -x "$FSKV" ] || { echo "no fskv binary at $FSKV (cargo build --release -p fskv, or --fskv)" >&2; exit 1; }
command -v fio >/dev/null || { echo "fio is needed (apt-get install fio)" >&2; exit 1; }
D=$(mktemp -d "$PARENT/ra-cost.XXXXXX")
mkdir -p "$D/m-on" "$D/m-off"
P=$(fskv_free_base_port "$P")
"$FSKV" up --data "$D/data" --base-port "$P" --replicas 1 > "$D/up.log" 2>&1 &
UP=$!
cleanup() {
    fskv_unmount "$D/m-on"
    fskv_unmount "$D/m-off"
    fskv_stop_pid "$UP"
    rm -rf "$D"
}
trap cleanup EXIT
fskv_wait_up "$UP" "$D/up.log" || { echo "fskv up did not come up (log above)" >&2; exit 1; }
export FSKV_CLUSTER_KEY_FILE=$D/data/cluster.key
"$FSKV" mount --mgmtd "127.0.0.1:$((P + 11))" "$D/m-on" > "$D/on.log" 2>&1 &
"$FSKV" mount --mgmtd "127.0.0.1:$((P + 11))" --read-around-bytes 0 "$D/m-off" > "$D/off.log" 2>&1 &
for m in on off; do
    for _ in $(seq 30); do mountpoint -q "$D/m-$m" && break; sleep 1; done
    mountpoint -q "$D/m-$m" || { echo "mount $m did not come up:" >&2; cat "$D/$m.log" >&2; exit 1; }
done
fio --name=w --filename="$D/m-on/f" --rw=write --bs=1M --size="${SIZE_MIB}M" --ioengine=psync --end_fsync=1 > /dev/null
dev=$(root_disk)
batch_reads() { # sum and count of the storage nodes' BatchRead durations
    for q in 13 14 15; do curl -s "http://127.0.0.1:$((P + q))/metrics" || true; done |
        awk '/fskv_rpc_request_duration_seconds_(sum|count).*BatchRead/ { if ($1 ~ /_sum/) s += $2; else c += $2 } END { print s + 0, c + 0 }'
}
echo "read-around cost: ${SIZE_MIB} MiB file, ${BS} cold random reads for ${SECS} s, $("$FSKV" --version 2>/dev/null || echo fskv)"
for r in $(seq "$ROUNDS"); do
    for m in on off; do
        sync
        echo 3 > /proc/sys/vm/drop_caches
        s0=$(batch_reads)
        d0=$(disk_reads "$dev")
        fio --name=r --filename="$D/m-$m/f" --rw=randread --bs="$BS" --size="${SIZE_MIB}M" --runtime="$SECS" --time_based \
            --ioengine=psync --output-format=json > "$D/fio.json"
        d1=$(disk_reads "$dev")
        s1=$(batch_reads)
        python3 - "$r" "$m" "$D/fio.json" "$d0" "$d1" "$s0" "$s1" <<'PY'
import json, sys
r, m, path = sys.argv[1:4]
job = json.load(open(path))["jobs"][0]["read"]
n = max(job["total_ios"], 1)
reads0, sect0 = map(int, sys.argv[4].split()); reads1, sect1 = map(int, sys.argv[5].split())
s0, c0 = map(float, sys.argv[6].split()); s1, c1 = map(float, sys.argv[7].split())
calls = c1 - c0
batch = f"{(s1 - s0) / calls * 1e6:.0f} us" if calls > 0 else "-"
with open("/proc/loadavg") as f:
    load = f.read().split()[0]
print(f"round {r} read-around {m:>3}: {job['iops']:7.0f} IOPS, mean {job['clat_ns']['mean'] / 1000:4.0f} us; "
      f"disk {(reads1 - reads0) / n:.2f} reads / {(sect1 - sect0) / 2 / n:.1f} KiB per fio read; "
      f"storage BatchRead {calls:.0f} calls, mean {batch} (load {load})")
PY
    done
done
