#!/usr/bin/env bash
# Filesystem benchmark (issue #7): the same fio jobs on
#   * our FUSE mount (`fskv up --mount`, replication 1 and/or 3),
#   * bindfs (a pass-through FUSE filesystem) over a directory on the same disk,
#   * that disk directly,
# all in one run, with ratios. Jobs (one thread, psync, buffered):
#   seqwrite   1 MiB blocks, --size MiB, --end_fsync=1 (the fsync is inside fio's time)
#   seqwrite4k 4 KiB blocks, --size4k MiB (default 256), --end_fsync=1, bounded by --max-seconds
#   seqread    1 MiB blocks over that file, after `sync; echo 3 > drop_caches` (root only)
#   randread   4 KiB random reads over that file, --direct=0, time-based, warm caches
#              (right after seqread, no drop; fio --invalidate=0). fio's random map reads
#              each block once per pass, so a mount that drops its page cache at open (ours)
#              misses the kernel cache on every read and goes to its server's cache
#   randread_cold  the same after dropping all caches (every side reads from the disk)
#   creates    a bash loop creating --creates empty files in one new directory
#              (open(O_CREAT)+close each), timed; bounded by --max-seconds
#   lsl        `ls -l` of that directory after dropping caches, in entries/s
#   tar        `tar -xf` of a real source tree (--tar-src, repacked into a tarball in the work dir
#              once; default: the Rust toolchain's rust-src if installed, else the largest
#              librocksdb-sys source in ~/.cargo/registry/src) into a new directory, timed
#              (no sync: what a user waits for), in files/s; the seconds are in the log
#
# Rounds: every round runs every target once, in an order rotated by one per round
# (local, bindfs, fskv-r1, fskv-r3; then bindfs, fskv-r1, ...), each fskv target on a
# fresh `fskv up`; the table shows per-target medians over the rounds, ratios are
# of medians, and every round's figures are printed and in the JSON.
#
# Usage: benches/fs/bench.sh [--replicas "1 3"] [--rounds 3] [--size-mib 1024] [--size4k-mib 256] [--seconds 10]
#          [--creates 5000] [--max-seconds 120] [--dir PARENT] [--base-port P]
#          [--fskv PATH] [--fskv-base PATH] [--jobs "LIST"] [--tar-src DIR] [--json FILE]
#   --base-port the first base port to try (each fskv target takes the first free range from there)
#   --dir       where temp dirs go (default ${TMPDIR:-/tmp}); must be a real disk, not tmpfs
#   --off       also run each fskv target with write-behind and relaxed metadata off
#               (fskv-rN-off: FSKV_MOUNT_WRITE_BUFFER_BYTES=0 FSKV_MOUNT_SYNCED_METADATA=true),
#               the behaviour before issue 21, side by side in the same run
#   --fskv      binary to use; default $CARGO_TARGET_DIR/release/fskv (or <repo>/target/...),
#               built with `cargo build --release -p fskv` when missing or older than the sources
#   --fskv-base another fskv binary (e.g. main's) run as extra targets fskvbase-rN in the same rounds,
#               so a change is measured as a same-run ratio (printed as "against fskvbase")
#   --jobs      the jobs to run, default all: "seqwrite4k seqwrite seqread randread randread_cold creates lsl tar"
#               (the read jobs write their file first, unrecorded, when seqwrite is not selected)
# Needs root (or sudo) to install fio/bindfs, to mount, and to drop caches.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
# shellcheck source=../../deploy/lib.sh
. "$REPO/deploy/lib.sh"
REPLICAS="1 3"
ROUNDS=3
SIZE_MIB=1024
SIZE4K_MIB=256
OFF=""
RR_SECONDS=10
CREATES=5000
MAX_SECONDS=120
PARENT=${TMPDIR:-/tmp}
BASE_PORT=""
FSKV=""
FSKV_BASE=""
JOBS="seqwrite4k seqwrite seqread randread randread_cold creates lsl tar"
TAR_SRC=""
JSON=""

while [ $# -gt 0 ]; do
    case "$1" in
        --replicas) REPLICAS=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --size-mib) SIZE_MIB=$2; shift 2 ;;
        --size4k-mib) SIZE4K_MIB=$2; shift 2 ;;
        --off) OFF=1; shift ;;
        --seconds) RR_SECONDS=$2; shift 2 ;;
        --creates) CREATES=$2; shift 2 ;;
        --max-seconds) MAX_SECONDS=$2; shift 2 ;;
        --dir) PARENT=$2; shift 2 ;;
        --base-port) BASE_PORT=$2; shift 2 ;;
        --fskv) FSKV=$2; shift 2 ;;
        --fskv-base) FSKV_BASE=$2; shift 2 ;;
        --jobs) JOBS=$2; shift 2 ;;
        --tar-src) TAR_SRC=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
        *) echo "bench-fs: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
for r in $REPLICAS; do
    case "$r" in 1|2|3) ;; *) echo "bench-fs: --replicas takes values 1..3" >&2; exit 2 ;; esac
done
for j in $JOBS; do
    case "$j" in seqwrite4k|seqwrite|seqread|randread|randread_cold|creates|lsl|tar) ;;
        *) echo "bench-fs: unknown job $j in --jobs" >&2; exit 2 ;;
    esac
done
want() { case " $JOBS " in *" $1 "*) return 0 ;; esac; return 1; }

say() { echo "bench-fs: $*" >&2; }
die() { say "$*"; exit 1; }

# ---- tools -----------------------------------------------------------------
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
missing=()
command -v fio >/dev/null || missing+=(fio)
command -v bindfs >/dev/null || missing+=(bindfs)
command -v fusermount >/dev/null || command -v fusermount3 >/dev/null || missing+=(fuse3)
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]} with apt-get"
    [ -z "$SUDO" ] || command -v sudo >/dev/null || die "need root or sudo to install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v python3 >/dev/null || die "python3 is needed to read fio's JSON"
FUSERMOUNT=$(command -v fusermount3 || command -v fusermount)

# ---- the fskv binary ---------------------------------------------------------
if [ -z "$FSKV" ]; then
    FSKV=${CARGO_TARGET_DIR:-$REPO/target}/release/fskv
    stale=""
    if [ ! -x "$FSKV" ]; then
        stale="missing"
    elif [ -n "$(find "$REPO" -path "$REPO/target" -prune -o \( -name '*.rs' -o -name Cargo.toml -o -name Cargo.lock \) -newer "$FSKV" -print -quit)" ]; then
        stale="older than the sources"
    fi
    if [ -n "$stale" ]; then
        say "$FSKV is $stale: cargo build --release -p fskv"
        (cd "$REPO" && cargo build --release -p fskv)
    fi
else
    say "using --fskv $FSKV as given (no staleness check)"
fi
[ -x "$FSKV" ] || die "no fskv binary at $FSKV"
[ -z "$FSKV_BASE" ] || [ -x "$FSKV_BASE" ] || die "no fskv binary at --fskv-base $FSKV_BASE"

# ---- space, temp dirs, cleanup --------------------------------------------------
mkdir -p "$PARENT"
fstype=$(df --output=fstype "$PARENT" | tail -1 | tr -d ' ')
[ "$fstype" != tmpfs ] || die "--dir $PARENT is on tmpfs; give a directory on the disk"
avail=$(df -B1 --output=avail "$PARENT" | tail -1 | tr -d ' ')
need=$((5 * 1024 * 1024 * 1024))
[ $((4 * SIZE_MIB * 1024 * 1024)) -le "$need" ] || need=$((4 * SIZE_MIB * 1024 * 1024))
[ "$avail" -ge "$need" ] || die "only $((avail / 1048576)) MiB free under $PARENT; need $((need / 1048576)) MiB (>= 5 GiB and 4x --size-mib)"

WORK=$(mktemp -d "$PARENT/fsbench.XXXXXX")
FSKV_PID=""
FSKV_MNT=""
BINDFS_MNT=""
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    if [ -n "$FSKV_PID" ] && kill -0 "$FSKV_PID" 2>/dev/null; then
        say "stopping fskv up (pid $FSKV_PID) with SIGTERM"
        kill -TERM "$FSKV_PID" 2>/dev/null || true
        for _ in $(seq 1 600); do kill -0 "$FSKV_PID" 2>/dev/null || break; sleep 0.1; done
        if kill -0 "$FSKV_PID" 2>/dev/null; then
            say "fskv up did not stop in 60 s: SIGKILL"
            kill -KILL "$FSKV_PID" 2>/dev/null || true
        fi
        wait "$FSKV_PID" 2>/dev/null || true
    fi
    if [ -n "$FSKV_MNT" ] && mountpoint -q "$FSKV_MNT" 2>/dev/null; then
        say "our mount still there: umount -l $FSKV_MNT"
        $SUDO umount -l "$FSKV_MNT" || true
    fi
    if [ -n "$BINDFS_MNT" ] && mountpoint -q "$BINDFS_MNT" 2>/dev/null; then
        "$FUSERMOUNT" -u "$BINDFS_MNT" 2>/dev/null || $SUDO umount -l "$BINDFS_MNT" || true
    fi
    if [ -n "${KEEP_LOGS:-}" ]; then
        say "logs kept in $WORK (KEEP_LOGS set)"
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

TARBALL=$WORK/src.tar
TAR_NAME="" TAR_FILES=0 TAR_BYTES=0
if want tar; then
    if [ -z "$TAR_SRC" ]; then
        sysroot=$(rustc --print sysroot 2>/dev/null || true)
        if [ -n "$sysroot" ] && [ -d "$sysroot/lib/rustlib/src/rust/library" ]; then
            TAR_SRC=$sysroot/lib/rustlib/src/rust/library
        else
            TAR_SRC=$(find "${CARGO_HOME:-$HOME/.cargo}"/registry/src -maxdepth 2 -type d -name 'librocksdb-sys-*' 2>/dev/null \
                | while read -r d; do echo "$(du -s "$d" | cut -f1) $d"; done | sort -n | tail -1 | cut -d' ' -f2-)
        fi
    fi
    [ -n "$TAR_SRC" ] && [ -d "$TAR_SRC" ] || die "no source tree for the tar job (give --tar-src DIR or leave tar out of --jobs)"
    tar -cf "$TARBALL" -C "$(dirname "$TAR_SRC")" "$(basename "$TAR_SRC")"
    TAR_NAME=$(basename "$TAR_SRC")
    TAR_FILES=$(tar -tf "$TARBALL" | wc -l)
    TAR_BYTES=$(stat -c %s "$TARBALL")
    say "tar job: $TAR_SRC repacked into $TARBALL ($TAR_FILES entries, $((TAR_BYTES / 1048576)) MiB)"
fi

RESULTS=$WORK/results.tsv   # round  target  job  value  unit  load1
ROUND=0
: > "$RESULTS"
DROP="no (not root: page cache NOT dropped before seqread)"
[ -w /proc/sys/vm/drop_caches ] && DROP="yes (sync; echo 3 > /proc/sys/vm/drop_caches before seqread)"

load1() { cut -d' ' -f1 /proc/loadavg; }

record() { # target job value unit
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$ROUND" "$1" "$2" "$3" "$4" "$(load1)" >> "$RESULTS"
    printf '  round %s %-10s %-9s %12s %s   (load %s)\n' "$ROUND" "$1" "$2" "$3" "$4" "$(load1)" >&2
}

fio_value() { # json-file rw(read|write) what(bw_mib|iops)
    python3 - "$@" <<'EOF'
import json, sys
path, rw, what = sys.argv[1:]
text = open(path).read()
j = json.loads(text[text.index("{"):])   # fio may print notes before the JSON
job = j["jobs"][0]
if job.get("error"):
    sys.exit(f"fio job error {job['error']}")
s = job[rw]
print(f"{s['bw_bytes'] / 1048576:.1f}" if what == "bw_mib" else f"{s['iops']:.0f}")
EOF
}

drop_caches() {
    sync
    if [ -w /proc/sys/vm/drop_caches ]; then echo 3 > /proc/sys/vm/drop_caches; fi
}

run_jobs() { # target-name directory
    local name=$1 dir=$2 out=$WORK/fio-$1-round$ROUND f size v
    mkdir -p "$out"
    f=bench.dat
    if want seqwrite4k; then
        say "$name: seqwrite4k ${SIZE4K_MIB} MiB (4 KiB blocks, end_fsync, at most ${MAX_SECONDS} s) in $dir"
        drop_caches
        fio --name=seqwrite4k --directory="$dir" --filename=small.dat --ioengine=psync --rw=write --bs=4k \
            --size="${SIZE4K_MIB}M" --end_fsync=1 --runtime="$MAX_SECONDS" \
            --output-format=json --output="$out/seqwrite4k.json" >/dev/null
        v=$(fio_value "$out/seqwrite4k.json" write bw_mib)
        record "$name" seqwrite4k "$v" MiB/s
        rm -f "$dir/small.dat"
    fi
    if want seqwrite || want seqread || want randread || want randread_cold; then
        want seqwrite && say "$name: seqwrite ${SIZE_MIB} MiB (1 MiB blocks, end_fsync) in $dir" \
            || say "$name: writing the ${SIZE_MIB} MiB file the read jobs use (not recorded)"
        drop_caches
        fio --name=seqwrite --directory="$dir" --filename=$f --ioengine=psync --rw=write --bs=1M \
            --size="${SIZE_MIB}M" --end_fsync=1 --runtime="$MAX_SECONDS" \
            --output-format=json --output="$out/seqwrite.json" >/dev/null
        v=$(fio_value "$out/seqwrite.json" write bw_mib)
        if want seqwrite; then record "$name" seqwrite "$v" MiB/s; fi
        size=$(stat -c %s "$dir/$f")
    fi
    if want seqread; then
        say "$name: seqread $((size / 1048576)) MiB (1 MiB blocks, caches dropped: ${DROP%% *})"
        drop_caches
        fio --name=seqread --directory="$dir" --filename=$f --ioengine=psync --rw=read --bs=1M \
            --size="$size" --runtime="$MAX_SECONDS" \
            --output-format=json --output="$out/seqread.json" >/dev/null
        v=$(fio_value "$out/seqread.json" read bw_mib)
        record "$name" seqread "$v" MiB/s
    fi
    if want randread; then
        say "$name: randread 4 KiB for ${RR_SECONDS} s (buffered, warm)"
        fio --name=randread --directory="$dir" --filename=$f --ioengine=psync --rw=randread --bs=4k \
            --direct=0 --invalidate=0 --size="$size" --time_based --runtime="$RR_SECONDS" \
            --output-format=json --output="$out/randread.json" >/dev/null
        v=$(fio_value "$out/randread.json" read iops)
        record "$name" randread "$v" IOPS
    fi
    if want randread_cold; then
        say "$name: randread 4 KiB for ${RR_SECONDS} s (buffered, after dropping caches)"
        drop_caches
        fio --name=randread_cold --directory="$dir" --filename=$f --ioengine=psync --rw=randread --bs=4k \
            --direct=0 --size="$size" --time_based --runtime="$RR_SECONDS" \
            --output-format=json --output="$out/randread_cold.json" >/dev/null
        v=$(fio_value "$out/randread_cold.json" read iops)
        record "$name" randread_cold "$v" IOPS
    fi
    rm -f "$dir/$f"
    local i=0 t0 t1 deadline
    if want creates || want lsl; then
        say "$name: create up to $CREATES empty files (bounded by ${MAX_SECONDS} s)"
        local cdir=$dir/creates
        mkdir "$cdir"
        t0=$(date +%s%N)
        deadline=$((t0 + MAX_SECONDS * 1000000000))
        while [ "$i" -lt "$CREATES" ]; do
            : > "$cdir/f$i"
            i=$((i + 1))
            if [ $((i % 500)) -eq 0 ] && [ "$(date +%s%N)" -gt "$deadline" ]; then
                say "$name: creates stopped at the time bound after $i files"
                break
            fi
        done
        t1=$(date +%s%N)
        if want creates; then record "$name" creates "$(python3 -c "print(f'{$i / (($t1 - $t0) / 1e9):.0f}')")" files/s; fi
    fi
    if want lsl; then
        say "$name: ls -l of the $i files (caches dropped)"
        drop_caches
        t0=$(date +%s%N)
        ls -l "$cdir" > /dev/null
        t1=$(date +%s%N)
        record "$name" lsl "$(python3 -c "print(f'{$i / (($t1 - $t0) / 1e9):.0f}')")" entries/s
    fi
    if want tar; then
        say "$name: tar -xf of $TAR_NAME ($TAR_FILES files, $((TAR_BYTES / 1048576)) MiB; caches dropped, no sync)"
        drop_caches
        mkdir "$dir/untar"
        t0=$(date +%s%N)
        timeout "$MAX_SECONDS" tar -xf "$TARBALL" -C "$dir/untar" || die "$name: tar -xf failed or took over ${MAX_SECONDS} s"
        t1=$(date +%s%N)
        say "$name: tar -xf took $(python3 -c "print(f'{($t1 - $t0) / 1e9:.2f}')") s"
        record "$name" tar "$(python3 -c "print(f'{$TAR_FILES / (($t1 - $t0) / 1e9):.0f}')")" files/s
    fi
}

pick_base() { # the first free range of 17 ports from --base-port (default 19000) up; a cluster
    # just stopped leaves its ports in TIME_WAIT for a minute, so the next target moves on
    local b
    b=$(fskv_free_base_port "${BASE_PORT:-19000}")
    [ -n "$b" ] || die "no free range of 17 ports from ${BASE_PORT:-19000} up"
    echo "$b"
}

start_fskv() { # replicas [off] [binary]
    local r=$1 off=${2:-} bin=${3:-$FSKV} base data log
    base=$(pick_base)
    data=$WORK/fskv-r$r-data
    FSKV_MNT=$WORK/fskv-r$r-mnt
    log=$WORK/fskv-r$r.log
    mkdir -p "$FSKV_MNT"
    say "$bin up --replicas $r --base-port $base --data $data --mount $FSKV_MNT"
    if [ -n "$off" ]; then
        say "  (write-behind and relaxed metadata off)"
        FSKV_MOUNT_WRITE_BUFFER_BYTES=0 FSKV_MOUNT_SYNCED_METADATA=true FSKV_LOG=${FSKV_LOG:-warn} \
            "$bin" up --data "$data" --base-port "$base" --replicas "$r" --mount "$FSKV_MNT" > "$log" 2>&1 &
    else
        FSKV_LOG=${FSKV_LOG:-warn} "$bin" up --data "$data" --base-port "$base" --replicas "$r" \
            --mount "$FSKV_MNT" > "$log" 2>&1 &
    fi
    FSKV_PID=$!
    local i
    for i in $(seq 1 3000); do   # 300 s
        kill -0 "$FSKV_PID" 2>/dev/null || { tail -20 "$log" >&2; die "fskv up exited (log above)"; }
        if grep -q "fskv up: serving" "$log" && mountpoint -q "$FSKV_MNT"; then
            return
        fi
        sleep 0.1
    done
    tail -20 "$log" >&2
    die "fskv up not serving after 300 s"
}

stop_fskv() {
    say "stopping fskv up (SIGTERM)"
    kill -TERM "$FSKV_PID"
    local i
    for i in $(seq 1 600); do kill -0 "$FSKV_PID" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$FSKV_PID" 2>/dev/null; then die "fskv up did not stop within 60 s"; fi
    wait "$FSKV_PID" || say "fskv up exited with status $?"
    if mountpoint -q "$FSKV_MNT"; then die "$FSKV_MNT still mounted after fskv up stopped"; fi
    FSKV_PID=""
    rm -rf "$WORK"/fskv-r*-data
    sync   # the deletion's metadata writes should not land in the next target's jobs
}

# ---- run -------------------------------------------------------------------
START=$(date -u +%Y-%m-%dT%H:%M:%SZ)
say "start $START; $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg); $(fio --version); $(bindfs --version 2>&1 | head -1)"
say "work dir $WORK on $(df --output=source "$WORK" | tail -1) ($fstype, $((avail / 1073741824)) GiB free); drop caches: $DROP"

run_target() { # name
    case "$1" in
        local)
            rm -rf "$WORK/local"; mkdir -p "$WORK/local"
            run_jobs local "$WORK/local"
            rm -rf "$WORK/local" ;;
        bindfs)
            rm -rf "$WORK/bindfs-src"; mkdir -p "$WORK/bindfs-src" "$WORK/bindfs-mnt"
            bindfs "$WORK/bindfs-src" "$WORK/bindfs-mnt"
            BINDFS_MNT=$WORK/bindfs-mnt
            run_jobs bindfs "$WORK/bindfs-mnt"
            "$FUSERMOUNT" -u "$BINDFS_MNT"
            BINDFS_MNT=""
            rm -rf "$WORK/bindfs-src" ;;
        fskvbase-r*)
            start_fskv "${1#fskvbase-r}" "" "$FSKV_BASE"
            run_jobs "$1" "$FSKV_MNT"
            stop_fskv ;;
        fskv-r*-off)
            local r=${1#fskv-r}
            start_fskv "${r%-off}" off
            run_jobs "$1" "$FSKV_MNT"
            stop_fskv ;;
        fskv-r*)
            start_fskv "${1#fskv-r}"
            run_jobs "$1" "$FSKV_MNT"
            stop_fskv ;;
    esac
}

TARGETS=(local bindfs)
for r in $REPLICAS; do
    TARGETS+=("fskv-r$r")
    [ -z "$FSKV_BASE" ] || TARGETS+=("fskvbase-r$r")
    [ -z "$OFF" ] || TARGETS+=("fskv-r$r-off")
done
for ((ROUND = 1; ROUND <= ROUNDS; ROUND++)); do
    say "round $ROUND of $ROUNDS (load average $(cut -d' ' -f1-3 /proc/loadavg))"
    for ((k = 0; k < ${#TARGETS[@]}; k++)); do
        run_target "${TARGETS[$(((k + ROUND - 1) % ${#TARGETS[@]}))]}"
    done
done

# ---- report ------------------------------------------------------------------
python3 - "$RESULTS" "$JSON" "$START" "$SIZE_MIB" "$RR_SECONDS" "$CREATES" "$DROP" "$(nproc)" "$SIZE4K_MIB" <<'EOF'
import json, sys
path, json_out, start, size_mib, rr_s, creates, drop, ncpu, size4k = sys.argv[1:]
SIZE4K = int(size4k)
import statistics
rows = [l.rstrip("\n").split("\t") for l in open(path) if l.strip()]
rounds = {}   # target -> job -> [values in round order]
loads = {}
order = []
for rnd, target, job, value, unit, load in rows:
    if target not in order:
        order.append(target)
    rounds.setdefault(target, {}).setdefault(job, []).append(float(value))
    loads.setdefault(target, []).append(float(load))
res = {t: {j: statistics.median(v) for j, v in jobs_.items()} for t, jobs_ in rounds.items()}
jobs = [("seqwrite4k", "MiB/s"), ("seqwrite", "MiB/s"), ("seqread", "MiB/s"), ("randread", "IOPS"), ("randread_cold", "IOPS"), ("creates", "files/s"), ("lsl", "entries/s"), ("tar", "files/s")]
targets = [t for t in ["local", "bindfs"] if t in res] + sorted(t for t in res if t.startswith("fskv"))
n_rounds = max(len(v) for t in rounds.values() for v in t.values())
print()
print(f"fs bench {start}: seqwrite/seqread {size_mib} MiB in 1 MiB blocks (write ends with fsync), "
      f"randread 4 KiB for {rr_s} s (warm, then cold), {creates} creates; {ncpu} CPUs; drop caches: {drop}")
print(f"medians over {n_rounds} round(s):")
print(f"{'target':<11} {'seqw4k MiB/s':>13} {'seqwrite MiB/s':>15} {'seqread MiB/s':>14} {'randread IOPS':>14} {'rr cold IOPS':>13} {'creates/s':>10} {'ls -l/s':>9} {'tar files/s':>12}   load avg (1 min) min-max")
for t in targets:
    r = res[t]
    print(f"{t:<11} {r.get('seqwrite4k', 0):>13.1f} {r.get('seqwrite', 0):>15.1f} {r.get('seqread', 0):>14.1f} {r.get('randread', 0):>14.0f} {r.get('randread_cold', 0):>13.0f} {r.get('creates', 0):>10.0f} {r.get('lsl', 0):>9.0f} {r.get('tar', 0):>12.0f}   "
          + f"{min(loads[t]):.1f}-{max(loads[t]):.1f}")
print()
print("every round (in round order):")
for t in targets:
    for j, unit in jobs:
        if j in rounds[t]:
            print(f"  {t:<11} {j:<14} " + " ".join(f"{x:.0f}" if x >= 100 else f"{x:.1f}" for x in rounds[t][j]) + f" {unit}")
def ratio(a, b):
    return round(a / b, 3) if b else None
ratios = {}
print()
print("ratios of the medians (against bindfs, the issue-21 goals, and the local disk):")
print(f"{'target':<11} {'seqw4k/bindfs':>14} {'seqwrite/bindfs':>16} {'seqwrite/local':>15} {'seqread/bindfs':>15} {'seqread/local':>14} {'randread/bindfs':>16} {'randread/local':>15} {'rrcold/bindfs':>14} {'rrcold/local':>13} {'creates/local':>14} {'creates/bindfs':>15} {'lsl/bindfs':>11} {'tar/bindfs':>11}")
for t in targets:
    if t == "local":
        continue
    r, l, b = res[t], res.get("local", {}), res.get("bindfs", {})
    q = {
        "seqwrite4k/bindfs": ratio(r.get("seqwrite4k", 0), b.get("seqwrite4k", 0)),
        "seqwrite/bindfs": ratio(r.get("seqwrite", 0), b.get("seqwrite", 0)),
        "seqwrite/local": ratio(r.get("seqwrite", 0), l.get("seqwrite", 0)),
        "seqread/bindfs": ratio(r.get("seqread", 0), b.get("seqread", 0)),
        "seqread/local": ratio(r.get("seqread", 0), l.get("seqread", 0)),
        "randread/bindfs": ratio(r.get("randread", 0), b.get("randread", 0)),
        "randread/local": ratio(r.get("randread", 0), l.get("randread", 0)),
        "randread_cold/bindfs": ratio(r.get("randread_cold", 0), b.get("randread_cold", 0)),
        "randread_cold/local": ratio(r.get("randread_cold", 0), l.get("randread_cold", 0)),
        "creates/local": ratio(r.get("creates", 0), l.get("creates", 0)),
        "creates/bindfs": ratio(r.get("creates", 0), b.get("creates", 0)),
        "lsl/bindfs": ratio(r.get("lsl", 0), b.get("lsl", 0)),
        "tar/bindfs": ratio(r.get("tar", 0), b.get("tar", 0)),
    }
    ratios[t] = q
    print(f"{t:<11} " + " ".join(f"{(v if v is not None else float('nan')):>{w}.2f}" for v, w in
                                 zip(q.values(), [14, 16, 15, 15, 14, 16, 15, 14, 13, 14, 15, 11, 11])))
against_base = {}
bases = [t for t in targets if t.startswith("fskvbase-")]
if bases:
    print()
    print("against fskvbase (--fskv-base, the same replication, same rounds): ratio of the medians, per job")
    for t in bases:
        new = "fskv-" + t[len("fskvbase-"):]
        if new not in res:
            continue
        q = {j: ratio(res[new].get(j, 0), res[t].get(j, 0)) for j, _ in jobs if j in res[t]}
        against_base[new] = q
        print(f"  {new:<10} / {t:<12} " + "  ".join(f"{j} {v:.2f}" for j, v in q.items() if v is not None))
if json_out:
    doc = {"start": start, "cpus": int(ncpu), "drop_caches": drop,
           "params": {"size_mib": int(size_mib), "size4k_mib": SIZE4K, "randread_seconds": int(rr_s), "creates": int(creates)},
           "units": dict(jobs), "rounds": n_rounds, "medians": res, "per_round": rounds, "load1": loads, "ratios": ratios, "against_base": against_base}
    with open(json_out, "w") as f:
        json.dump(doc, f, indent=2)
    print(f"\nJSON written to {json_out}")
EOF
