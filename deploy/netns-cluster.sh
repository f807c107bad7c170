#!/usr/bin/env bash
# A multi-host 3FS-KV cluster on one machine: every "host" is a Linux network
# namespace with one address on a private bridge. The bridge lives in a
# namespace of its own that this script creates, so the hosts' subnet has no
# route to the machine's network: test traffic never leaves the namespaces.
#
#   deploy/netns-cluster.sh start          start every host and service, wait until healthy
#   deploy/netns-cluster.sh status         namespaces, services (pid, restarts), cluster status
#   deploy/netns-cluster.sh stop           stop everything; leaves no namespace, process, mount or directory
#   deploy/netns-cluster.sh exec HOST CMD… run a command inside HOST's namespace (e.g. client)
#   deploy/netns-cluster.sh kill HOST [SIG]   signal HOST's service (default KILL); its supervisor restarts it
#   deploy/netns-cluster.sh down HOST [SIG]   stop HOST's service and keep it down (default KILL)
#   deploy/netns-cluster.sh up HOST           start HOST's service again
#   deploy/netns-cluster.sh partition HOST    cut HOST's link (the bridge side goes down)
#   deploy/netns-cluster.sh heal HOST         restore HOST's link
#   deploy/netns-cluster.sh wait-healthy [SECONDS]  until every target serves and is up to date
#
# Hosts (10.77.0.0/24 by default, only inside the namespaces made here):
#   etcd1-3 .11-.13   etcd members (client :2379, peer :2380)
#   mgmtd1-2 .21-.22  mgmtd, primary/standby by a lease in etcd (:9000)
#   meta1-2  .31-.32  meta servers on etcd, registered with mgmtd (:9010)
#   stor1-4  .41-.44  storage nodes, 3 targets each, replication 3 (:9100)
#   s3       .51      S3 gateways: writer :9200, reader :9201
#   front    .52      the front (`fskv front`): S3 :9300 (read-only :9305),
#                     KV :9301 (:9306), MQ/SQS :9302 (:9307), admin :9310;
#                     it starts its reader and writer gateway processes on
#                     demand inside this host (loopback of the namespace)
#   client   .100     no service: where tests and tools run
# To add a service: add a host to HOSTS and a `service_cmd` case for it.
#
# Every service runs under a small supervisor (restart after
# FSKV_NETNS_RESTART_DELAY_S seconds, like systemd's Restart=always) so a
# storage node that exits on a lapsed lease comes back by itself.
#
# Environment: FSKV_BIN (the fskv binary; default target/debug/fskv),
# FSKV_NETNS_DIR (state: pids, logs, data; default /tmp/fskv-netns),
# FSKV_NETNS_PREFIX (namespace names; default fskvn), FSKV_NETNS_SUBNET
# (first three octets; default 10.77.0), FSKV_NETNS_T_MS (storage heartbeat
# timeout T; default 6000), FSKV_NETNS_LEASE_MS (mgmtd primary lease;
# default 1500). Needs root and iproute2.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SELF="$ROOT/deploy/netns-cluster.sh"
BIN="${FSKV_BIN:-$ROOT/target/debug/fskv}"
DIR="${FSKV_NETNS_DIR:-/tmp/fskv-netns}"
PREFIX="${FSKV_NETNS_PREFIX:-fskvn}"
NET="${FSKV_NETNS_SUBNET:-10.77.0}"
T_MS="${FSKV_NETNS_T_MS:-6000}"
LEASE_MS="${FSKV_NETNS_LEASE_MS:-1500}"
RESTART_DELAY_S="${FSKV_NETNS_RESTART_DELAY_S:-1}"
BRIDGE_NS="$PREFIX-br"
# Service identity (docs/security.md): every process authenticates its RPC
# connections with one cluster key: FSKV_CLUSTER_KEY_FILE if set, else
# $DIR/cluster.key, created by `start` (umask 077: 0600 from the first byte).
if [ -z "${FSKV_CLUSTER_KEY_FILE:-}" ]; then FSKV_CLUSTER_KEY_FILE="$DIR/cluster.key"; fi
export FSKV_CLUSTER_KEY_FILE

HOSTS="etcd1:11 etcd2:12 etcd3:13 mgmtd1:21 mgmtd2:22 meta1:31 meta2:32 stor1:41 stor2:42 stor3:43 stor4:44 s3:51 front:52 client:100"
# Start order (each group waits for the previous to be ready).
SERVICES="etcd1 etcd2 etcd3 mgmtd1 mgmtd2 stor1 stor2 stor3 stor4 meta1 meta2 s3 front"

say() { echo "netns-cluster: $*" >&2; }
die() { say "$*"; exit 1; }

addr_of() {
    local h
    for h in $HOSTS; do
        if [ "${h%%:*}" = "$1" ]; then echo "$NET.${h##*:}"; return; fi
    done
    die "unknown host $1 (hosts: $(for h in $HOSTS; do printf '%s ' "${h%%:*}"; done))"
}
ns_of() { echo "$PREFIX-$1"; }
in_ns() { local h=$1; shift; ip netns exec "$(ns_of "$h")" "$@"; }

etcd_urls() { echo "http://$(addr_of etcd1):2379,http://$(addr_of etcd2):2379,http://$(addr_of etcd3):2379"; }
engine_spec() { echo "etcd:$(etcd_urls)?prefix=fskv/&max_txn_ops=10000&max_request_bytes=11534336"; }
mgmtd_addrs() { echo "$(addr_of mgmtd1):9000,$(addr_of mgmtd2):9000"; }

# The command line of HOST's service.
service_cmd() {
    local h=$1 a
    a=$(addr_of "$h")
    case $h in
        etcd*)
            local cluster="etcd1=http://$(addr_of etcd1):2380,etcd2=http://$(addr_of etcd2):2380,etcd3=http://$(addr_of etcd3):2380"
            echo etcd --name "$h" --data-dir "$DIR/data/$h" \
                --listen-client-urls "http://$a:2379" --advertise-client-urls "http://$a:2379" \
                --listen-peer-urls "http://$a:2380" --initial-advertise-peer-urls "http://$a:2380" \
                --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token "$PREFIX" \
                --max-request-bytes 11534336 --max-txn-ops 10000 --quota-backend-bytes 8589934592 \
                --auto-compaction-mode periodic --auto-compaction-retention 5m \
                --heartbeat-interval 50 --election-timeout 500 --logger zap --log-level warn ;;
        mgmtd*)
            echo "$BIN" mgmtd --listen "$a:9000" --engine "'$(engine_spec)'" --id "$h" \
                --nodes 4 --targets-per-node 3 --replicas 3 \
                --heartbeat-timeout-ms "$T_MS" --tick-interval-ms 200 --lease-ms "$LEASE_MS" ;;
        stor*)
            local n=${h#stor}
            echo "$BIN" storage --listen "$a:9100" --node-id "$n" --data "$DIR/data/$h" --mgmtd "$(mgmtd_addrs)" \
                --heartbeat-interval-ms 300 --initial-lease-ms $((T_MS / 2)) --max-start-wait-ms 60000 ;;
        meta*)
            local n=${h#meta}
            echo "$BIN" meta --listen "$a:9010" --engine "'$(engine_spec)'" --mgmtd "$(mgmtd_addrs)" --node-id "$n" ;;
        s3)
            echo "$BIN" gateway s3 --role writer --listen "$a:9200" --mgmtd "$(mgmtd_addrs)" --credentials "$DIR/credentials.json" ;;
        s3r)
            echo "$BIN" gateway s3 --role reader --listen "$a:9201" --mgmtd "$(mgmtd_addrs)" --credentials "$DIR/credentials.json" \
                --writer-endpoint "http://$a:9200" ;;
        front)
            echo "$BIN" front --admin-listen "$a:9310" --mgmtd "$(mgmtd_addrs)" --credentials "$DIR/credentials.json" \
                --log-dir "$DIR/logs" --s3-listen "$a:9300" --s3-reader-listen "$a:9305" --kv-listen "$a:9301" \
                --kv-reader-listen "$a:9306" --mq-listen "$a:9302" --mq-reader-listen "$a:9307" ;;
        *) die "host $h runs no service" ;;
    esac
}

# Runs HOST's service until HOST.down exists, restarting it after it exits.
supervise() {
    local h=$1 cmd rc
    cmd=$(cat "$DIR/run/$h.cmd")
    trap 'kill -TERM "$(cat "$DIR/run/$h.pid" 2>/dev/null)" 2>/dev/null; exit 0' TERM
    while [ ! -e "$DIR/run/$h.down" ]; do
        eval "exec_service $cmd" >>"$DIR/logs/$h.log" 2>&1 &
        echo $! >"$DIR/run/$h.pid"
        rc=0
        wait $! || rc=$?
        echo "netns-cluster: $(date +%T.%N) $h exited with status $rc" >>"$DIR/logs/$h.log"
        echo $(( $(cat "$DIR/run/$h.restarts" 2>/dev/null || echo 0) + 1 )) >"$DIR/run/$h.restarts"
        [ -e "$DIR/run/$h.down" ] && break
        sleep "$RESTART_DELAY_S"
    done
}
exec_service() { exec "$@"; }

start_service() {
    local h=$1
    rm -f "$DIR/run/$h.down"
    service_cmd "$h" >"$DIR/run/$h.cmd"
    in_ns "$h" setsid bash "$SELF" _supervise "$h" </dev/null >/dev/null 2>&1 &
    echo $! >"$DIR/run/$h.sup"
    local i
    for i in $(seq 1 50); do [ -s "$DIR/run/$h.pid" ] && return 0; sleep 0.1; done
    die "$h did not start (see $DIR/logs/$h.log)"
}

signal_service() {
    local h=$1 sig=$2 pid
    pid=$(cat "$DIR/run/$h.pid" 2>/dev/null || true)
    [ -n "$pid" ] && kill "-$sig" "$pid" 2>/dev/null || true
}

# Waits until TCP port $2 of host $1 accepts (from the client namespace).
wait_port() {
    local h=$1 port=$2 a i
    a=$(addr_of "$h")
    for i in $(seq 1 300); do
        if in_ns client timeout 1 bash -c "exec 3<>/dev/tcp/$a/$port" 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    die "$h:$port not reachable after 30 s (see $DIR/logs/$h.log)"
}

etcd_healthy() {
    local a
    a=$(addr_of "$1")
    in_ns client timeout 2 bash -c "exec 3<>/dev/tcp/$a/2379; printf 'GET /health HTTP/1.0\r\n\r\n' >&3; cat <&3" 2>/dev/null | grep -q '"health":"true"'
}

admin_status_json() { in_ns client "$BIN" admin status --mgmtd "$(mgmtd_addrs)" --json 2>/dev/null; }

# Whether every node is alive and every target serving and up to date.
cluster_healthy() {
    admin_status_json | python3 -c '
import json, sys
s = json.load(sys.stdin)["mgmtd"]
ok = s["nodes"] and all(n["alive"] for n in s["nodes"]) and s["chains"] and all(
    t["public"] == "serving" and t["local"] == "up-to-date" for c in s["chains"] for t in c["targets"])
sys.exit(0 if ok else 1)' 2>/dev/null
}

cmd_wait_healthy() {
    local limit=${1:-120} start=$SECONDS
    while ! cluster_healthy; do
        [ $((SECONDS - start)) -ge "$limit" ] && die "cluster not healthy after $limit s; see $SELF status"
        sleep 0.1
    done
}

make_hosts() {
    ip netns add "$BRIDGE_NS"
    ip -n "$BRIDGE_NS" link set lo up
    ip -n "$BRIDGE_NS" link add br0 type bridge
    ip -n "$BRIDGE_NS" link set br0 up
    local h name last
    for h in $HOSTS; do
        name=${h%%:*}; last=${h##*:}
        ip netns add "$(ns_of "$name")"
        ip -n "$(ns_of "$name")" link set lo up
        ip -n "$BRIDGE_NS" link add "v-$name" type veth peer name eth0 netns "$(ns_of "$name")"
        ip -n "$BRIDGE_NS" link set "v-$name" master br0 up
        ip -n "$(ns_of "$name")" addr add "$NET.$last/24" dev eth0
        ip -n "$(ns_of "$name")" link set eth0 up
    done
}

cmd_start() {
    [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
    command -v ip >/dev/null || die "needs iproute2 (ip)"
    command -v etcd >/dev/null || die "needs etcd (deploy/install-deps.sh installs etcd-server)"
    [ -x "$BIN" ] || die "no fskv binary at $BIN (cargo build -p fskv, or set FSKV_BIN)"
    if ip netns list | grep -q "^$BRIDGE_NS\b"; then die "already running (namespace $BRIDGE_NS exists); $SELF stop first"; fi
    rm -rf "$DIR"
    mkdir -p "$DIR/run" "$DIR/logs" "$DIR/data"
    # A random secret, 0600 from its first byte (the gateways read it; users take it from this file).
    (umask 077 && printf '{"access_key": "NETNS%s", "secret_key": "%s"}\n' "$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')" \
        "$(od -An -tx1 -N20 /dev/urandom | tr -d ' \n')" >"$DIR/credentials.json")
    if [ ! -s "$FSKV_CLUSTER_KEY_FILE" ]; then
        (umask 077 && set -o noclobber && od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$FSKV_CLUSTER_KEY_FILE")
    fi
    make_hosts
    say "hosts up on $NET.0/24 (bridge in namespace $BRIDGE_NS); state in $DIR"
    local h
    for h in etcd1 etcd2 etcd3; do start_service "$h"; done
    local i
    for i in $(seq 1 300); do
        if etcd_healthy etcd1 && etcd_healthy etcd2 && etcd_healthy etcd3; then break; fi
        [ "$i" -eq 300 ] && die "etcd not healthy after 30 s (see $DIR/logs/etcd*.log)"
        sleep 0.1
    done
    say "etcd healthy"
    for h in mgmtd1 mgmtd2; do start_service "$h"; done
    wait_port mgmtd1 9000; wait_port mgmtd2 9000
    for h in stor1 stor2 stor3 stor4; do start_service "$h"; done
    cmd_wait_healthy 120
    say "storage serving"
    for h in meta1 meta2; do start_service "$h"; done
    wait_port meta1 9010; wait_port meta2 9010
    start_service s3
    start_service front
    wait_port s3 9200
    wait_port front 9300
    say "ready: mgmtd $(mgmtd_addrs); meta $(addr_of meta1):9010,$(addr_of meta2):9010; S3 http://$(addr_of s3):9200 (credentials $DIR/credentials.json); front: S3 http://$(addr_of front):9300, KV :9301, MQ :9302, admin :9310; engine $(etcd_urls)"
}

cmd_status() {
    echo "namespaces:"; ip netns list | grep "^$PREFIX-" | sed 's/^/  /' || echo "  none"
    [ -d "$DIR/run" ] || { echo "no state in $DIR"; return 0; }
    echo "services:"
    local h pid state
    for h in $SERVICES; do
        pid=$(cat "$DIR/run/$h.pid" 2>/dev/null || true)
        if [ -e "$DIR/run/$h.down" ]; then state=down
        elif [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then state="running pid $pid"
        else state="not running"; fi
        printf '  %-7s %-12s %s, restarts %s\n' "$h" "$(addr_of "$h")" "$state" "$(cat "$DIR/run/$h.restarts" 2>/dev/null || echo 0)"
    done
    if ip netns list | grep -q "^$PREFIX-client\b"; then
        in_ns client "$BIN" admin status --mgmtd "$(mgmtd_addrs)" 2>&1 | sed 's/^/  /' || true
    fi
}

cmd_stop() {
    local h pid ns
    if [ -d "$DIR/run" ]; then
        for h in $SERVICES; do touch "$DIR/run/$h.down"; done
        for h in $SERVICES; do signal_service "$h" TERM; done
        for _ in $(seq 1 50); do
            local alive=0
            for h in $SERVICES; do
                pid=$(cat "$DIR/run/$h.pid" 2>/dev/null || true)
                [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && alive=1
            done
            [ $alive -eq 0 ] && break
            sleep 0.2
        done
    fi
    # Whatever still runs inside our namespaces (services, supervisors, tools).
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-" || true); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
    done
    if [ -d "$DIR/run" ]; then
        for f in "$DIR"/run/*.sup; do [ -e "$f" ] && kill -KILL "$(cat "$f")" 2>/dev/null || true; done
    fi
    sleep 0.2
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-" || true); do
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "$DIR"
    local left
    left=$(ip netns list 2>/dev/null | grep -c "^$PREFIX-" || true)
    [ "$left" -eq 0 ] || die "$left namespaces left"
    say "stopped; no namespace, process or state left"
}

[ $# -ge 1 ] || { sed -n '2,20p' "$0"; exit 2; }
cmd=$1; shift
case $cmd in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    exec) h=$1; shift; in_ns "$h" "$@" ;;
    kill) signal_service "$1" "${2:-KILL}" ;;
    down) touch "$DIR/run/$1.down"; signal_service "$1" "${2:-KILL}" ;;
    up) start_service "$1" ;;
    partition) ip -n "$BRIDGE_NS" link set "v-$1" down ;;
    heal) ip -n "$BRIDGE_NS" link set "v-$1" up ;;
    wait-healthy) cmd_wait_healthy "${1:-120}" ;;
    addr) addr_of "$1" ;;
    mgmtd-addrs) mgmtd_addrs ;;
    engine-spec) engine_spec ;;
    _supervise) supervise "$1" ;;
    *) die "unknown command $cmd" ;;
esac
