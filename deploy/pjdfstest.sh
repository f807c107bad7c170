#!/usr/bin/env bash
# pjdfstest (the POSIX file system test suite, Rust rewrite, crate 0.2.2) on a
# FUSE mount of a fresh `fskv up`. Installs pjdfstest into target/pjdfstest if
# missing; uses target/debug/fskv (or $CARGO_TARGET_DIR/debug/fskv), building
# it if missing. Compares the results with the committed baseline
# conformance/pjdfstest/expected-failures.txt and prints
#   pjdfstest: N passed, M failed (K expected, J unexpected), S skipped
# Exits non-zero only on unexpected failures (or if the run could not happen);
# listed tests that now pass are reported, not fatal. Without /dev/fuse it
# prints a "skipped" line and exits 0 (as the FUSE tests of the workspace do).
# Environment: PJDFSTEST_TIMEOUT (seconds, default 900) bounds the run;
# PJDFSTEST_ROOT (default target/pjdfstest) is the install cache;
# PJDFSTEST_PATTERNS (optional) filters tests (pjdfstest's own patterns).
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh
version=0.2.2
if [ ! -c /dev/fuse ]; then
    # Like the FUSE tests of the workspace: no FUSE here, nothing to test —
    # unless FSKV_REQUIRE_FUSE=1 (CI), where that is a failure.
    if [ "${FSKV_REQUIRE_FUSE:-}" = 1 ]; then
        echo "pjdfstest: 0 passed, 1 failed (no /dev/fuse and FSKV_REQUIRE_FUSE=1)"
        exit 1
    fi
    echo "pjdfstest: skipped (no /dev/fuse on this machine)"
    exit 0
fi
root=${PJDFSTEST_ROOT:-target/pjdfstest}
expected_file=conformance/pjdfstest/expected-failures.txt
timeout_s=${PJDFSTEST_TIMEOUT:-900}
fskv=${CARGO_TARGET_DIR:-target}/debug/fskv

if ! "$root/bin/pjdfstest" --version 2>/dev/null | grep -q " $version\$"; then
    echo "pjdfstest: installing pjdfstest $version into $root"
    # Its own temporary target dir (not the workspace's).
    env -u CARGO_TARGET_DIR cargo install --quiet --locked "pjdfstest@$version" --root "$root" --force
fi
pjd=$(cd "$root/bin" && pwd)/pjdfstest
[ -x "$fskv" ] || cargo build -p fskv

work=$(mktemp -d /tmp/fskv-pjdfstest.XXXXXX)
chmod 0755 "$work" # the user-switching tests walk the path as nobody / daemon
pid=""
cleanup() {
    fskv_stop_pid "$pid"
    fskv_unmount "$work/mnt"
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

base=$(fskv_free_base_port 23100)

"$fskv" up --data "$work/data" --base-port "$base" --mount "$work/mnt" >"$work/up.log" 2>&1 &
pid=$!
ready=""
for _ in $(seq 1 900); do
    if grep -q "fskv up: serving" "$work/up.log" 2>/dev/null && mountpoint -q "$work/mnt"; then ready=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
done
if [ -z "$ready" ]; then
    echo "pjdfstest: fskv up --mount did not become ready:"; tail -20 "$work/up.log"
    echo "pjdfstest: 0 passed, 0 failed (0 expected, 0 unexpected), 0 skipped (not run)"
    exit 1
fi
echo "pjdfstest: fskv up on base port $base, mount $work/mnt"

# Users for the user-switching tests: pjdfstest's default wants a `tests`
# user; use two that every Debian/Ubuntu system has instead.
group_of() { id -gn "$1"; }
cat >"$work/pjdfstest.toml" <<EOF
[features]
utimensat = {}
utime_now = {}
rename_ctime = {}

[settings]
naptime = 0.01
allow_remount = false

[dummy_auth]
entries = [
  ["nobody", "$(group_of nobody)"],
  ["daemon", "$(group_of daemon)"],
]
EOF

mkdir -p "$work/mnt/pjdfstest"
chmod 0755 "$work/mnt/pjdfstest"
log="$work/pjdfstest.log"
set +e
# shellcheck disable=SC2086
NO_COLOR=1 timeout --kill-after=15 "$timeout_s" "$pjd" -c "$work/pjdfstest.toml" -p "$work/mnt/pjdfstest" \
    ${PJDFSTEST_PATTERNS:-} >"$log" 2>&1
run_status=$?
set -e
mkdir -p "$root"
sed 's/\x1b\[[0-9;]*m//g' "$log" >"$root/last-run.log"
timed_out=""
if [ "$run_status" -eq 124 ] || [ "$run_status" -eq 137 ]; then
    timed_out=1
    echo "pjdfstest: the run timed out after ${timeout_s} s (last lines:)"; tail -5 "$root/last-run.log"
fi

# Per-test results: "NAME   ok|FAILED|skipped".
python3 - "$root/last-run.log" "$expected_file" "${timed_out:-0}" <<'PY'
import re, sys
log, expected_file, timed_out = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
results, reasons, cur = {}, {}, None
for line in open(log, errors="replace"):
    m = re.match(r"^(\S+::\S+)\s+(ok|FAILED|skipped)\s*$", line)
    if m:
        cur = m.group(1)
        results[cur] = m.group(2)
        continue
    if cur and line.startswith("\t") and results.get(cur) == "FAILED" and cur not in reasons:
        reasons[cur] = line.strip()
# A group whose reason starts with "flaky:" may pass or fail.
expected, flaky, in_comment, group_flaky = set(), set(), False, False
for raw in open(expected_file):
    raw = raw.strip()
    if raw.startswith("#"):
        if not in_comment:
            group_flaky = raw.lstrip("# ").startswith("flaky:")
        in_comment = True
        continue
    in_comment = False
    name = raw.split("#", 1)[0].strip()
    if name:
        expected.add(name)
        if group_flaky:
            flaky.add(name)
passed = sorted(t for t, r in results.items() if r == "ok")
failed = sorted(t for t, r in results.items() if r == "FAILED")
skipped = [t for t, r in results.items() if r == "skipped"]
unexpected = [t for t in failed if t not in expected]
now_passing = [t for t in passed if t in expected and t not in flaky]
for t in unexpected:
    print(f"pjdfstest: UNEXPECTED failure: {t}: {reasons.get(t, '')}")
for t in now_passing:
    print(f"pjdfstest: now passing, remove from the list: {t}")
status = 0
if unexpected:
    status = 1
if not results:
    print("pjdfstest: no test results were parsed (see the log)")
    status = 1
if timed_out:
    status = 1
print(f"pjdfstest: {len(passed)} passed, {len(failed)} failed "
      f"({len(failed) - len(unexpected)} expected, {len(unexpected)} unexpected), {len(skipped)} skipped"
      + (" (timed out)" if timed_out else ""))
sys.exit(status)
PY
