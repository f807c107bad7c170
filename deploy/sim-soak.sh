#!/usr/bin/env bash
# The simulation soak: the turmoil simulation of mgmtd + storage + writers
# under random faults (core-fs/sim/tests/sim.rs), run for a number of
# simulated cluster-hours, one shard per core, each on its own seeds
# (shard k of n takes seeds first+k, first+k+n, ...).
#
#   deploy/sim-soak.sh [--cluster-hours H] [--shards N] [--first-seed S] [--release]
#
#   --cluster-hours H  simulated cluster-hours in all (default 50; split over the shards)
#   --shards N         processes (default: the number of cores)
#   --first-seed S     the first seed (default 1: CI runs the same seeds every
#                      time; a longer soak by hand should start elsewhere,
#                      e.g. --first-seed $(date +%s))
#   --release          build the simulation optimized (faster per seed, a
#                      longer build; CI uses the debug build it already has)
#
# Prints every failing seed with the command that replays it exactly, and a
# closing line: cluster-hours of the passing seeds, seeds, failures, wall
# time, cluster-hours per minute. Exits 1 if a seed failed that
# conformance/sim/known-failing-seeds.txt does not list (each listed seed is
# an open bug, reported on every run), or a shard crashed.
set -euo pipefail
cd "$(dirname "$0")/.."

hours=50
shards=$(nproc)
first=1
profile=()
while [ $# -gt 0 ]; do
    case "$1" in
        --cluster-hours) hours="$2"; shift 2 ;;
        --shards) shards="$2"; shift 2 ;;
        --first-seed) first="$2"; shift 2 ;;
        --release) profile=(--release); shift ;;
        -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
        *) echo "sim-soak: unknown argument $1" >&2; exit 2 ;;
    esac
done
case "$shards" in ''|*[!0-9]*|0) echo "sim-soak: --shards must be a positive integer" >&2; exit 2 ;; esac
case "$first" in ''|*[!0-9]*) echo "sim-soak: --first-seed must be a non-negative integer" >&2; exit 2 ;; esac
per_shard=$(python3 -c "import sys; h=float(sys.argv[1]); assert h > 0; print(h / int(sys.argv[2]))" "$hours" "$shards" 2>/dev/null) \
    || { echo "sim-soak: --cluster-hours must be a positive number" >&2; exit 2; }

export CARGO_TERM_COLOR=never
cargo test -q "${profile[@]}" -p fskv-sim --test sim --no-run
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
start=$(date +%s)
pids=()
for k in $(seq 0 $((shards - 1))); do
    FSKV_SIM_FIRST_SEED="$first" FSKV_SIM_SHARD="$k/$shards" FSKV_SIM_HOURS="$per_shard" \
        cargo test -q "${profile[@]}" -p fskv-sim --test sim simulated_cluster_survives_random_faults -- --nocapture \
        >"$logs/shard-$k.log" 2>&1 &
    pids+=("$!")
done
for p in "${pids[@]}"; do
    # A shard exits 1 when any of its seeds failed; the totals below
    # decide (known failures are allowed, a shard without a summary is not).
    wait "$p" || true
done
wall=$(( $(date +%s) - start ))

# Each failing seed: its summary, the violated properties, the replay
# command (the fault list and exits are in the seed's replay); then the
# totals over the shards against the known failures.
awk '/^FAILED/{p=1} p && !/^  (faults|exits):/ && !/^ *[0-9]+ms /{print} /replay:/{p=0}' "$logs"/shard-*.log | cut -c1-400 || true
python3 - "$wall" conformance/sim/known-failing-seeds.txt "$logs"/shard-*.log <<'PY'
import re, sys
wall, known_path, paths = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
known = set()
for line in open(known_path):
    line = line.split("#", 1)[0].strip()
    if line:
        known.add(int(line))
hours = 0.0
seeds = 0
failed, passed = set(), set()
broken = 0
for path in paths:
    text = open(path, errors="replace").read()
    m = re.search(r"passing seeds: ([0-9.]+) cluster-hours over (\d+) seeds \((\d+) failed\)", text)
    if not m:
        broken += 1
        print(f"sim-soak: {path}: no summary (the shard crashed?); its last lines:")
        print("\n".join(text.splitlines()[-15:]))
        continue
    hours += float(m.group(1)); seeds += int(m.group(2))
    failed |= {int(s) for s in re.findall(r"^FAILED seed (\d+):", text, re.M)}
    passed |= {int(s) for s in re.findall(r"^seed (\d+):", text, re.M)}
new = sorted(failed - known)
now_passing = sorted(known & passed)
per_min = hours / (wall / 60.0) if wall > 0 else 0.0
print(f"sim-soak: {hours:.2f} cluster-hours over {seeds} seeds in {wall} s on {len(paths)} shards "
      f"({per_min:.2f} cluster-hours per minute); {len(failed)} failed: {len(failed & known)} known "
      f"({known_path}), {len(new)} new")
if now_passing:
    print(f"sim-soak: known failing seeds that now pass (remove them from {known_path}): {now_passing}")
if new:
    print(f"sim-soak: NEW failing seeds: {new}")
sys.exit(1 if new or broken else 0)
PY
