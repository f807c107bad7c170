#!/usr/bin/env bash
# The S3 conformance suite (conformance/s3) against a fresh `fskv up` with a
# FUSE mount of the same cluster (so objects-are-files is checked too; without
# FUSE it runs without the mount and those tests are skipped). Uses the binary
# that `cargo test` built (target/debug/fskv), building it if missing.
# Arguments go to conformance/s3/run.sh (e.g. `-- -k versioning`).
# Prints `s3 conformance: N passed, M failed, K skipped`; exits non-zero on failures.
set -euo pipefail
cd "$(dirname "$0")/.."
. deploy/lib.sh
[ -x target/debug/fskv ] || cargo build -p fskv
work=$(mktemp -d /tmp/fskv-s3conf.XXXXXX)
pid=""
tls_pid=""
cleanup() {
    fskv_stop_pid "$pid"
    fskv_stop_pid "$tls_pid"
    fskv_unmount "$work/mnt"
    rm -rf "$work"
}
trap cleanup EXIT

base=$(fskv_free_base_port 17100)

start_up() { # $@ = extra fskv up arguments
    rm -rf "$work/data"
    ./target/debug/fskv up --data "$work/data" --base-port "$base" "$@" >"$work/up.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 900); do
        if grep -q "fskv up: serving" "$work/up.log" 2>/dev/null; then return 0; fi
        if ! kill -0 "$pid" 2>/dev/null; then break; fi
        sleep 0.2
    done
    echo "s3-conformance: fskv up $* did not become ready:"; tail -20 "$work/up.log"
    kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=""
    return 1
}

fuse_root=""
if start_up --mount "$work/mnt"; then
    fuse_root="$work/mnt/s3"
else
    if [ "${FSKV_REQUIRE_FUSE:-}" = 1 ]; then
        echo "s3 conformance: 0 passed, 1 failed (fskv up --mount failed and FSKV_REQUIRE_FUSE=1)"
        exit 1
    fi
    echo "s3-conformance: running without a FUSE mount (objects-are-files tests skipped)"
    start_up
fi
read -r s3 ak sk reader < <(python3 -c "import json;e=json.load(open('$work/data/endpoints.json'));print(e['s3'],e['access_key'],e['secret_key'],e['s3_reader'])")
echo "s3-conformance: fskv up on base port $base (S3 $s3, reader $reader${fuse_root:+, mount $fuse_root})"

# A second tenant with a user of its own (test_tenants.py: what one tenant's
# key may do to another tenant's buckets).
admin() { FSKV_CLUSTER_KEY_FILE="$work/data/cluster.key" FSKV_LOG=warn ./target/debug/fskv admin "$@" --mgmtd "127.0.0.1:$((base + 11))" --json; }
tenant2_ak="" tenant2_sk=""
# The user store is made by the first gateway process, which the front
# starts on the first request: ask once, then wait for the store (bounded).
python3 -c "import urllib.request as u
try: u.urlopen('$s3/', timeout=10)
except Exception: pass"
for _ in $(seq 1 100); do
    admin tenant create conftwo >"$work/tenant2.json" 2>"$work/tenant2.err" && break
    grep -q "no user store yet" "$work/tenant2.err" || break
    sleep 0.2
done
if [ -s "$work/tenant2.json" ] && admin user create bob --tenant conftwo >"$work/user2.json" 2>>"$work/tenant2.err"; then
    read -r tenant2_ak tenant2_sk < <(python3 -c "import json;u=json.load(open('$work/user2.json'));print(u['access_key'],u['secret_key'])")
else
    echo "s3-conformance: could not make a second tenant (test_tenants.py fails):"; cat "$work/tenant2.err"
fi
export S3_TENANT2_NAME=conftwo S3_TENANT2_USER=bob S3_TENANT2_ACCESS_KEY="$tenant2_ak" S3_TENANT2_SECRET_KEY="$tenant2_sk"

# A third gateway over HTTPS (a throw-away CA and a certificate for 127.0.0.1).
tls_url="" tls_ca=""
if command -v openssl >/dev/null; then
    (
        cd "$work"
        openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=fskv test CA" -keyout ca.key -out ca.pem 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout tls.key -out tls.csr 2>/dev/null
        printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > ext.cnf
        openssl x509 -req -in tls.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile ext.cnf -out tls.pem 2>/dev/null
    )
    # P+6 / P+8 are the KV gateway reader and its Consul API; P+9 is unused.
    tls_port=$((base + 9))
    ./target/debug/fskv gateway s3 --role writer --listen "127.0.0.1:$tls_port" --mgmtd "127.0.0.1:$((base + 11))" \
        --cluster-key-file "$work/data/cluster.key" --meta "127.0.0.1:$((base + 12))" --credentials "$work/data/credentials.json" \
        --tls-cert "$work/tls.pem" --tls-key "$work/tls.key" >"$work/tls-gateway.log" 2>&1 &
    tls_pid=$!
    for _ in $(seq 1 100); do
        if grep -q "serving on https" "$work/tls-gateway.log" 2>/dev/null; then tls_url="https://127.0.0.1:$tls_port" tls_ca="$work/ca.pem"; break; fi
        kill -0 "$tls_pid" 2>/dev/null || break
        sleep 0.2
    done
    [ -n "$tls_url" ] || { echo "s3-conformance: the HTTPS gateway did not start:"; tail -5 "$work/tls-gateway.log"; }
fi
set +e
S3_FUSE_ROOT="$fuse_root" S3_TLS_ENDPOINT="$tls_url" S3_TLS_CA="$tls_ca" conformance/s3/run.sh --endpoint "$s3" --access-key "$ak" --secret-key "$sk" --reader-endpoint "$reader" "$@"
status=$?
set -e
if [ "$status" -ne 0 ]; then
    # What the servers said while the suite ran (CI keeps no files): the
    # last warnings and errors of every process, bounded.
    for log in "$work"/data/logs/*.log "$work/up.log" "$work/tls-gateway.log"; do
        [ -f "$log" ] || continue
        lines=$(grep -E "WARN|ERROR|panicked" "$log" | tail -15 || true)
        [ -n "$lines" ] && printf 's3-conformance: server log %s:\n%s\n' "$(basename "$log")" "$lines"
    done
fi
exit $status
