#!/usr/bin/env bash
# Failover times on the network-namespace cluster (deploy/netns-cluster.sh):
#
#   * mgmtd takeover: kill -9 of the primary → the standby answers as primary
#     (`fskv admin status` of the standby shows it primary);
#   * back to serving after a partition heals: a storage node's link is cut
#     for T + 2 s while a 64 MiB file is written (so its chains have data to
#     re-sync), then restored → every target of every chain serving and up
#     to date.
#
#   sudo deploy/netns-bench.sh [ROUNDS]      (default 5 rounds of each)
#
# Polling runs inside the client namespace, one `fskv admin status` per
# probe: a probe takes ~10-30 ms, which bounds the resolution; the figures
# printed are "from the fault (or heal) to the first probe that saw it done".
# Uses its own namespace prefix (fskvb) and state directory; stops the
# cluster at the end (also on failure).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ROUNDS="${1:-5}"
export FSKV_BIN="${FSKV_BIN:-$ROOT/target/release/fskv}"
export FSKV_NETNS_PREFIX="${FSKV_NETNS_PREFIX:-fskvb}"
export FSKV_NETNS_DIR="${FSKV_NETNS_DIR:-/tmp/fskv-netns-bench}"
# The cluster key netns-cluster.sh creates (docs/security.md); our own fskv commands need it too.
export FSKV_CLUSTER_KEY_FILE="${FSKV_CLUSTER_KEY_FILE:-$FSKV_NETNS_DIR/cluster.key}"
export FSKV_NETNS_T_MS="${FSKV_NETNS_T_MS:-6000}"
export FSKV_NETNS_LEASE_MS="${FSKV_NETNS_LEASE_MS:-1500}"
export FSKV_LOG=warn
NC="$ROOT/deploy/netns-cluster.sh"
M1=10.77.0.21:9000
M2=10.77.0.22:9000

trap '"$NC" stop >/dev/null 2>&1 || true' EXIT
"$NC" start >/dev/null

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# is_primary ADDR ID: whether mgmtd ID (at ADDR) is the primary (admin
# status follows the lease to the primary, so the answering id is checked).
is_primary() {
    "$NC" exec client "$FSKV_BIN" admin status --mgmtd "$1" --json 2>/dev/null \
        | python3 -c 'import json,sys; m=json.load(sys.stdin)["mgmtd"]; sys.exit(0 if m["is_primary"] and m["mgmtd_id"] == sys.argv[1] else 1)' "$2" 2>/dev/null
}

median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print int((a[NR/2]+a[NR/2+1])/2)}'; }
summary() { # name values...
    local name=$1; shift
    local sorted; sorted=$(printf '%s\n' "$@" | sort -n)
    echo "$name: n=$# min=$(echo "$sorted" | head -1) median=$(printf '%s\n' "$@" | median) max=$(echo "$sorted" | tail -1) ms (all: $*)"
}

takeovers=()
for r in $(seq 1 "$ROUNDS"); do
    if is_primary "$M1" mgmtd1; then p=mgmtd1; s=$M2; sid=mgmtd2; else p=mgmtd2; s=$M1; sid=mgmtd1; fi
    t0=$(now_ms)
    "$NC" down "$p" KILL
    until is_primary "$s" "$sid"; do
        [ $(( $(now_ms) - t0 )) -gt 20000 ] && { echo "netns-bench: no takeover within 20 s" >&2; exit 1; }
        sleep 0.01
    done
    takeovers+=($(( $(now_ms) - t0 )))
    echo "round $r: kill -9 $p, standby $sid primary after ${takeovers[-1]} ms" >&2
    "$NC" up "$p"
    sleep 3
done

head -c $((64 << 20)) /dev/urandom >"$FSKV_NETNS_DIR/blob"
heals=()
for r in $(seq 1 "$ROUNDS"); do
    victim="stor$(( (r - 1) % 4 + 1 ))"
    "$NC" partition "$victim"
    "$NC" exec client "$FSKV_BIN" put --mgmtd "$M1,$M2" "$FSKV_NETNS_DIR/blob" "/bench-$r" >/dev/null 2>&1 &
    put=$!
    sleep $(( FSKV_NETNS_T_MS / 1000 + 2 ))
    t0=$(now_ms)
    "$NC" heal "$victim"
    wait "$put" || { echo "netns-bench: the write during the partition failed" >&2; exit 1; }
    "$NC" wait-healthy 120
    heals+=($(( $(now_ms) - t0 )))
    echo "round $r: $victim healed, all serving after ${heals[-1]} ms" >&2
    sleep 1
done

echo "netns-bench: T=${FSKV_NETNS_T_MS} ms, lease=${FSKV_NETNS_LEASE_MS} ms, $("$FSKV_BIN" --version)"
summary "mgmtd takeover (kill -9 primary -> standby primary)" "${takeovers[@]}"
summary "partition healed -> all targets serving (64 MiB written meanwhile)" "${heals[@]}"
