#!/usr/bin/env bash
# A 3-member etcd cluster on loopback for development and benchmarks
# (tests start their own through fskv_kv::etcd::testkit).
#
#   deploy/etcd-local.sh start   members on 127.0.0.1:23791-23793 (peers 23801-23803); prints the engine spec
#   deploy/etcd-local.sh spec    the engine spec: etcd:http://127.0.0.1:23791,...?max_txn_ops=10000&max_request_bytes=11534336
#   deploy/etcd-local.sh stop    stops the members and removes their data
#
# FSKV_ETCD_DIR (default /tmp/fskv-etcd-local) holds data, logs and pids.
# Limits as in deploy/config/etcd.env.example; default heartbeat/election.
set -euo pipefail
DIR="${FSKV_ETCD_DIR:-/tmp/fskv-etcd-local}"
CLUSTER="m1=http://127.0.0.1:23801,m2=http://127.0.0.1:23802,m3=http://127.0.0.1:23803"
spec() { echo "etcd:http://127.0.0.1:23791,http://127.0.0.1:23792,http://127.0.0.1:23793?max_txn_ops=10000&max_request_bytes=11534336"; }

healthy() {
    bash -c "exec 3<>/dev/tcp/127.0.0.1/$1; printf 'GET /health HTTP/1.0\r\n\r\n' >&3; cat <&3" 2>/dev/null | grep -q '"health":"true"'
}

case "${1:-}" in
    start)
        command -v etcd >/dev/null || { echo "etcd-local: no etcd (deploy/install-deps.sh installs etcd-server)" >&2; exit 1; }
        [ -e "$DIR/m1.pid" ] && kill -0 "$(cat "$DIR/m1.pid")" 2>/dev/null && { echo "etcd-local: already running in $DIR" >&2; exit 1; }
        rm -rf "$DIR"; mkdir -p "$DIR"
        for i in 1 2 3; do
            etcd --name "m$i" --data-dir "$DIR/m$i" \
                --listen-client-urls "http://127.0.0.1:2379$i" --advertise-client-urls "http://127.0.0.1:2379$i" \
                --listen-peer-urls "http://127.0.0.1:2380$i" --initial-advertise-peer-urls "http://127.0.0.1:2380$i" \
                --initial-cluster "$CLUSTER" --initial-cluster-state new --initial-cluster-token fskv-local \
                --max-request-bytes 11534336 --max-txn-ops 10000 --quota-backend-bytes 8589934592 \
                --auto-compaction-mode periodic --auto-compaction-retention 5m --logger zap --log-level warn \
                >"$DIR/m$i.log" 2>&1 &
            echo $! >"$DIR/m$i.pid"
        done
        for _ in $(seq 1 300); do
            if healthy 23791 && healthy 23792 && healthy 23793; then spec; exit 0; fi
            sleep 0.1
        done
        echo "etcd-local: not healthy after 30 s (logs in $DIR)" >&2; exit 1 ;;
    spec) spec ;;
    stop)
        for i in 1 2 3; do
            [ -e "$DIR/m$i.pid" ] && kill "$(cat "$DIR/m$i.pid")" 2>/dev/null || true
        done
        sleep 1
        for i in 1 2 3; do
            [ -e "$DIR/m$i.pid" ] && kill -9 "$(cat "$DIR/m$i.pid")" 2>/dev/null || true
        done
        rm -rf "$DIR" ;;
    *) sed -n '2,10p' "$0"; exit 2 ;;
esac
