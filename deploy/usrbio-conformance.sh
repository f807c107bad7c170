#!/usr/bin/env bash
# USRBIO conformance on a FUSE mount of a fresh `fskv up`:
#   1. installs the C library, header, pkg-config file and the Python module
#      into a scratch prefix (deploy/install-usrbio.sh, so the installer is
#      tested too) and builds conformance/usrbio/usrbio_conformance.c with cc;
#   2. kill -9 of a USRBIO program with 128 requests in flight: the daemon
#      must drop its registrations, unmap its memory and remove its
#      /dev/shm files, and keep serving;
#   3. the C conformance program (every result checked against FUSE);
#   4. the Python module hf3fs_fuse.io against the same cases.
# Prints one closing line
#   usrbio: N passed, M failed
# and exits non-zero on a failure. Without /dev/fuse it prints
#   usrbio: SKIPPED (no /dev/fuse on this machine)
# and exits 0 — unless FSKV_REQUIRE_FUSE=1, then a missing /dev/fuse fails.
# Uses target/debug/fskv (or $CARGO_TARGET_DIR/debug/fskv), building it if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh
if [ ! -c /dev/fuse ]; then
    if [ "${FSKV_REQUIRE_FUSE:-0}" = 1 ]; then
        echo "usrbio: 0 passed, 1 failed (no /dev/fuse, and FSKV_REQUIRE_FUSE=1)"
        exit 1
    fi
    echo "usrbio: SKIPPED (no /dev/fuse on this machine)"
    exit 0
fi
fskv=${CARGO_TARGET_DIR:-target}/debug/fskv
[ -x "$fskv" ] || cargo build -p fskv

work=$(mktemp -d /tmp/fskv-usrbio.XXXXXX)
chmod 0755 "$work"
pid=""
holder=""
cleanup() {
    [ -n "$holder" ] && kill -KILL "$holder" 2>/dev/null || true
    fskv_stop_pid "$pid"
    fskv_unmount "$work/mnt"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok $1"; }
fail() { failed=$((failed + 1)); echo "FAIL $1"; }

# 1. Install and build.
if ! ./deploy/install-usrbio.sh --prefix "$work/prefix" --python-target "$work/py" >"$work/install.log" 2>&1; then
    cat "$work/install.log"
    echo "usrbio: 0 passed, 1 failed (install-usrbio.sh failed)"
    exit 1
fi
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
# shellcheck disable=SC2046
if ! "${CC:-cc}" -O1 -g -Wall -Werror -o "$work/usrbio_conformance" conformance/usrbio/usrbio_conformance.c \
        $(pkg-config --cflags --libs hf3fs_usrbio) 2>"$work/cc.log"; then
    cat "$work/cc.log"
    echo "usrbio: 0 passed, 1 failed (the C program did not build)"
    exit 1
fi
ok "build_with_pkg_config"

base=$(fskv_free_base_port 24100)
"$fskv" up --data "$work/data" --base-port "$base" --mount "$work/mnt" >"$work/up.log" 2>&1 &
pid=$!
ready=""
for _ in $(seq 1 900); do
    if grep -q "fskv up: serving" "$work/up.log" 2>/dev/null && mountpoint -q "$work/mnt"; then ready=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
done
if [ -z "$ready" ]; then
    echo "usrbio: fskv up --mount did not become ready:"; tail -20 "$work/up.log"
    echo "usrbio: $passed passed, $((failed + 1)) failed (no cluster)"
    exit 1
fi
mnt="$work/mnt"
mount_pid=$(cat "$work/data/pids/mount.pid")
echo "usrbio: fskv up on base port $base, mount $mnt (daemon pid $mount_pid)"
mkdir -p "$mnt/usrbio"

# 2. kill -9 of a program with 128 requests in flight.
dd if=/dev/urandom of="$mnt/usrbio/hold.bin" bs=1M count=128 status=none
"$work/usrbio_conformance" --hold "$mnt" "$mnt/usrbio/hold.bin" 128 >"$work/hold.out" 2>&1 &
holder=$!
for _ in $(seq 1 100); do grep -q READY "$work/hold.out" && break; sleep 0.1; done
if grep -q READY "$work/hold.out"; then
    links_before=$(ls "$mnt/3fs-virt/iovs" | grep -vc submit-ios || true)
    kill -KILL "$holder"
    wait "$holder" 2>/dev/null || true
    dead=$holder
    holder=""
    clean=""
    for _ in $(seq 1 150); do
        shm_left=$(ls /dev/shm | grep -c "^fskv-usrbio\.$dead\." || true)
        maps_left=$(grep -c "fskv-usrbio\.$dead\." "/proc/$mount_pid/maps" || true)
        links_left=0
        for l in "$mnt"/3fs-virt/iovs/*; do
            [ "$(basename "$l")" = submit-ios ] && continue
            case "$(readlink "$l")" in *"fskv-usrbio.$dead."*) links_left=$((links_left + 1)) ;; esac
        done
        if [ "$shm_left" = 0 ] && [ "$maps_left" = 0 ] && [ "$links_left" = 0 ]; then clean=1; break; fi
        sleep 0.1
    done
    # What the daemon saw at the death (its log line names the requests in flight).
    inflight=$(sed 's/\x1b\[[0-9;]*m//g' "$work/data/logs/mount.log" 2>/dev/null | grep "tgid=$dead " | grep -o 'requests_in_flight=[0-9]*' | tail -1 || true)
    if [ -n "$clean" ] && [ "$links_before" -ge 2 ]; then
        ok "kill9_program_with_128_in_flight_leaves_nothing (links before: $links_before; daemon at the death: ${inflight:-no log line})"
    else
        fail "kill9_program_with_128_in_flight_leaves_nothing: /dev/shm files $shm_left, daemon mappings $maps_left, links $links_left left (links before: $links_before)"
    fi
    if kill -0 "$mount_pid" 2>/dev/null && mountpoint -q "$mnt"; then ok "daemon_survives_the_kill"; else fail "daemon_survives_the_kill"; fi
else
    cat "$work/hold.out"
    fail "kill9_program_with_128_in_flight_leaves_nothing: the program did not get ready"
fi

# 3. The C program.
set +e
timeout --kill-after=10 600 "$work/usrbio_conformance" "$mnt" "$mnt/usrbio/c" >"$work/c.out" 2>&1
c_status=$?
set -e
cat "$work/c.out"
if line=$(grep -E '^usrbio-c: [0-9]+ passed, [0-9]+ failed' "$work/c.out"); then
    passed=$((passed + $(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/')))
    failed=$((failed + $(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
    [ "$c_status" -ne 0 ] && [ "$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')" = 0 ] && fail "c_program_exit_status_$c_status"
else
    fail "c_program_crashed_or_timed_out (exit $c_status)"
fi

# 4. The Python module.
set +e
PYTHONPATH="$work/py" USRBIO_MOUNT="$mnt" USRBIO_WORKDIR="$mnt/usrbio/py" timeout --kill-after=10 600 \
    python3 conformance/usrbio/test_hf3fs_fuse_io.py >"$work/py.out" 2>"$work/py.err"
py_status=$?
set -e
cat "$work/py.out"
if line=$(grep -E '^usrbio-py: [0-9]+ passed, [0-9]+ failed' "$work/py.out"); then
    passed=$((passed + $(echo "$line" | sed -E 's/.* ([0-9]+) passed.*/\1/')))
    failed=$((failed + $(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')))
    if [ "$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')" != 0 ]; then tail -40 "$work/py.err"; fi
else
    tail -40 "$work/py.err"
    fail "python_module_crashed_or_timed_out (exit $py_status)"
fi

# The daemon's log: no panic.
if grep -q "panicked" "$work/data/logs/mount.log" 2>/dev/null; then
    grep -m3 -A3 panicked "$work/data/logs/mount.log"
    fail "daemon_log_has_no_panic"
else
    ok "daemon_log_has_no_panic"
fi

echo "usrbio: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
