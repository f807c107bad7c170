#!/bin/bash
# What the kernel's two newer FUSE paths would buy (issue 21): FUSE over
# io_uring (CONFIG_FUSE_IO_URING, requests and replies through an io_uring
# instead of read(2)/writev(2) on /dev/fuse) and passthrough
# (CONFIG_FUSE_PASSTHROUGH, the kernel reads and writes a backing file itself).
# fuser 0.18, which the mount is built on, has neither transport, so they are
# measured on libfuse's passthrough_hp example (libfuse >= 3.18 built with
# liburing), a filesystem that does nothing but forward to a directory on
# tmpfs: the difference between its modes is the transport's alone. Our
# mount over `fskv up --replicas 1` runs the same jobs in the same rounds, so
# a per-request saving can be set against what one of our requests costs.
#
#   benches/fs/fuse-transport.sh --libfuse BUILD_DIR [--fskv PATH|none] [--rounds 3]
#                                [--seconds 4] [--creates 5000] [--base-port 22400] [--dir PARENT]
#   --libfuse  a libfuse build directory holding example/passthrough_hp, e.g.
#              git clone https://github.com/libfuse/libfuse && cd libfuse &&
#              apt-get install -y meson ninja-build liburing-dev &&
#              meson setup build -Dexamples=true && ninja -C build   (meson must print "io_uring support: True")
#   --fskv     our binary (default target/release/fskv); "none" leaves our mount out
# Modes, one mount each per round, in this order:
#   dev          passthrough_hp --nopassthrough        (/dev/fuse read/writev, what fuser does)
#   uring        passthrough_hp --nopassthrough -o io_uring   (sets /sys/module/fuse/parameters/enable_uring
#                for the run and puts the old value back)
#   passthrough  passthrough_hp                         (reads and writes passed through to the tmpfs file)
#   fskv         fskv mount
# Jobs per mount: 4 KiB random O_DIRECT reads of a 256 MiB file (1 job: IOPS and mean
# latency; 4 jobs: IOPS), 1 MiB sequential O_DIRECT reads (MiB/s), and creates of empty
# files by a bash loop (files/s). O_DIRECT sends every read to the filesystem, so the
# page cache cannot hide the transport. Needs root and fio.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../../deploy/lib.sh
. "$REPO/deploy/lib.sh"
FSKV=${CARGO_TARGET_DIR:-$REPO/target}/release/fskv
LIBFUSE=
ROUNDS=3
SECS=4
CREATES=5000
P=22400
PARENT=${TMPDIR:-/tmp}
while [ $# -gt 0 ]; do
    case "$1" in
        --libfuse) LIBFUSE=$2; shift 2 ;;
        --fskv) FSKV=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --seconds) SECS=$2; shift 2 ;;
        --creates) CREATES=$2; shift 2 ;;
        --base-port) P=$2; shift 2 ;;
        --dir) PARENT=$2; shift 2 ;;
        *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
done
HP=$LIBFUSE/example/passthrough_hp
[ -x "$HP" ] || { echo "no passthrough_hp under --libfuse '$LIBFUSE' (see the header of $0)" >&2; exit 1; }
command -v fio >/dev/null || { echo "fio is needed (apt-get install fio)" >&2; exit 1; }
URING_PARAM=/sys/module/fuse/parameters/enable_uring
[ -w "$URING_PARAM" ] || { echo "$URING_PARAM is missing or not writable: the kernel has no FUSE over io_uring, or this is not root" >&2; exit 1; }
MODES="dev uring passthrough"
[ "$FSKV" = none ] || { [ -x "$FSKV" ] || { echo "no fskv binary at $FSKV (cargo build --release -p fskv, --fskv, or --fskv none)" >&2; exit 1; }; MODES="$MODES fskv"; }

D=$(mktemp -d "$PARENT/fuse-transport.XXXXXX")
SRC=$(mktemp -d /dev/shm/fuse-transport-src.XXXXXX)
MNT=$D/mnt
mkdir -p "$MNT" "$D/fskv-mnt"
URING_OLD=$(cat "$URING_PARAM")
UP=
cleanup() {
    fskv_unmount "$MNT"
    fskv_unmount "$D/fskv-mnt"
    fskv_stop_pid "$UP"
    echo "$URING_OLD" > "$URING_PARAM"
    rm -rf "$D" "$SRC"
}
trap cleanup EXIT
dd if=/dev/urandom of="$SRC/f" bs=1M count=256 status=none

if [ "$FSKV" != none ]; then
    P=$(fskv_free_base_port "$P")
    "$FSKV" up --data "$D/data" --base-port "$P" --replicas 1 --mount "$D/fskv-mnt" > "$D/up.log" 2>&1 &
    UP=$!
    fskv_wait_up "$UP" "$D/up.log" || { echo "fskv up did not come up (log above)" >&2; exit 1; }
    cp "$SRC/f" "$D/fskv-mnt/f"
    sync
fi

# Mounts mode $1 at $MNT (passthrough_hp daemonizes once mounted) and prints the directory to use.
mount_mode() {
    case "$1" in
        dev) "$HP" --nopassthrough "$SRC" "$MNT" > "$D/hp.log" 2>&1 ;;
        uring) echo Y > "$URING_PARAM"; "$HP" --nopassthrough -o io_uring "$SRC" "$MNT" > "$D/hp.log" 2>&1 ;;
        passthrough) "$HP" "$SRC" "$MNT" > "$D/hp.log" 2>&1 ;;
        fskv) echo "$D/fskv-mnt"; return 0 ;;
    esac
    mountpoint -q "$MNT" || { echo "passthrough_hp did not mount ($1)" >&2; exit 1; }
    echo "$MNT"
}

unmount_mode() {
    [ "$1" = fskv ] && return 0
    fskv_unmount "$MNT"
    echo "$URING_OLD" > "$URING_PARAM"
    for _ in $(seq 50); do pgrep -f "$HP" > /dev/null || return 0; sleep 0.1; done
}

fio_job() { # dir rw bs numjobs -> fio's JSON on stdout
    fio --name=t --filename="$1/f" --rw="$2" --bs="$3" --numjobs="$4" --size=256M --direct=1 --ioengine=psync \
        --runtime="$SECS" --time_based --group_reporting --output-format=json
}

echo "fuse transport: $(uname -r), libfuse $(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' "$LIBFUSE/meson-info/intro-projectinfo.json" 2>/dev/null || echo "of unknown version"), ${SECS} s per fio job, ${CREATES} creates"
for r in $(seq "$ROUNDS"); do
    for m in $MODES; do
        dir=$(mount_mode "$m")
        fio_job "$dir" randread 4k 1 > "$D/r1.json"
        fio_job "$dir" randread 4k 4 > "$D/r4.json"
        fio_job "$dir" read 1M 1 > "$D/seq.json"
        cdir=$dir/creates.$r
        mkdir "$cdir"
        t0=$(date +%s%N)
        for i in $(seq "$CREATES"); do : > "$cdir/f$i"; done
        t1=$(date +%s%N)
        rm -rf "$cdir"
        unmount_mode "$m"
        python3 - "$r" "$m" "$D" "$CREATES" "$t0" "$t1" <<'PY'
import json, sys
r, m, d = sys.argv[1:4]
creates, t0, t1 = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
def read(name):
    return json.load(open(f"{d}/{name}.json"))["jobs"][0]["read"]
r1, r4, seq = read("r1"), read("r4"), read("seq")
row = {"mode": m, "read4k": r1["iops"], "mean_us": r1["clat_ns"]["mean"] / 1000, "x4": r4["iops"],
       "read1m": seq["bw"] / 1024, "creates": creates / ((t1 - t0) / 1e9)}
with open(f"{d}/results.jsonl", "a") as f:
    f.write(json.dumps(row) + "\n")
with open("/proc/loadavg") as f:
    load = f.read().split()[0]
print(f"round {r} {m:<11} read4k {row['read4k']:7.0f} IOPS mean {row['mean_us']:5.1f} us | read4k x4 {row['x4']:7.0f} IOPS | "
      f"read1M {row['read1m']:6.0f} MiB/s | creates {row['creates']:6.0f} /s (load {load})")
PY
    done
done
python3 - "$D/results.jsonl" <<'PY'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    row = json.loads(line)
    rows.setdefault(row.pop("mode"), []).append(row)
med = {m: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for m, rs in rows.items()}
base = med["dev"]
print("medians, and ratio to dev:")
for m, v in med.items():
    print(f"  {m:<11} read4k {v['read4k']:7.0f} IOPS ({v['read4k'] / base['read4k']:.2f}) mean {v['mean_us']:5.1f} us "
          f"({v['mean_us'] - base['mean_us']:+.1f} us) | x4 {v['x4']:7.0f} ({v['x4'] / base['x4']:.2f}) | "
          f"read1M {v['read1m']:6.0f} MiB/s ({v['read1m'] / base['read1m']:.2f}) | creates {v['creates']:6.0f} /s ({v['creates'] / base['creates']:.2f})")
PY
