# Shared by the test scripts that run a fresh `fskv up` (source it).

# Prints the first base port P >= $1 (in steps of 20, below 40000) whose
# range P..P+16 — every port `fskv up` binds (the front: S3 P/P+5, KV P+1/P+6, MQ/SQS P+2/P+7,
# Consul P+3/P+8, admin P+10; mgmtd P+11, meta P+12, storage P+13..P+15, the mount's metrics
# P+16 with --mount; gateway processes
# behind the front use ephemeral loopback ports) — is free on loopback.
fskv_free_base_port() {
    python3 - "$1" <<'PY'
import socket, sys
for base in range(int(sys.argv[1]), 40000, 20):
    socks = []
    try:
        for off in range(17):
            s = socket.socket(); s.bind(("127.0.0.1", base + off)); socks.append(s)
        print(base); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
PY
}

# Waits until the `fskv up` of pid $1 logging to $2 prints its ready line
# (up to 180 s); returns 1, with the log's tail on stdout, if it exits or
# never gets ready.
fskv_wait_up() {
    local pid=$1 log=$2
    for _ in $(seq 1 900); do
        grep -q "fskv up: serving" "$log" 2>/dev/null && return 0
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.2
    done
    grep -q "fskv up: serving" "$log" 2>/dev/null && return 0
    tail -20 "$log"
    return 1
}

# Stops process $1: SIGTERM, up to 20 s for it to exit, then SIGKILL.
fskv_stop_pid() {
    local pid=$1
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.2; done
    kill -KILL "$pid" 2>/dev/null || true
}

# Unmounts a FUSE mount left behind at $1 (a stopped `fskv up` unmounts itself).
fskv_unmount() {
    if mountpoint -q "$1" 2>/dev/null; then
        fusermount3 -u "$1" 2>/dev/null || umount -l "$1" 2>/dev/null || true
    fi
}

# Prints the block device holding / (e.g. vda), as /proc/diskstats names it.
root_disk() {
    local dev
    dev=$(lsblk -no pkname "$(findmnt -no source /)" 2>/dev/null || true)
    echo "${dev:-$(basename "$(findmnt -no source /)")}"
}

# Prints device $1's completed reads and sectors read so far (/proc/diskstats).
disk_reads() {
    awk -v d="$1" '$3 == d { print $4, $6 }' /proc/diskstats
}
