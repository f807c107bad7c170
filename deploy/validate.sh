#!/usr/bin/env bash
# Checks the deploy files without a cluster:
#   * Kubernetes manifests (deploy/k8s): schema of every object (the official
#     Kubernetes Python client's models: known kinds, no unknown field, value
#     types, required fields) and cross-references (selectors, named ports,
#     volumes, ConfigMaps/Secrets, headless Services) — deploy/validate/check_k8s.py;
#   * systemd units (deploy/systemd): `systemd-analyze verify`, any warning
#     counts as a failure (it exits 0 on unknown keys);
#   * the example config (deploy/config/fskv.toml) parses and validates with
#     the fskv binary; every ETCD_* variable of etcd.env.example is an etcd flag;
#   * shell scripts: bash -n.
# Prints "deploy: N checks passed, N failed" and exits non-zero on a failure.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${FSKV_BIN:-target/debug/fskv}"
passed=0; failed=0
ok() { passed=$((passed + 1)); echo "deploy: ok   $*"; }
bad() { failed=$((failed + 1)); echo "deploy: FAIL $*"; }

# Shell scripts.
for f in deploy/*.sh; do
    if bash -n "$f"; then ok "bash -n $f"; else bad "bash -n $f"; fi
done

# Kubernetes manifests.
VENV=deploy/.venv
REQ=deploy/validate/requirements.txt
stamp="$VENV/.req-$(sha256sum "$REQ" | cut -c1-16)"
if [ ! -e "$stamp" ]; then
    rm -rf "$VENV"
    python3 -m venv "$VENV" && "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ" >"$VENV.install.log" 2>&1 \
        && touch "$stamp" || { bad "pip install -r $REQ (see $VENV.install.log)"; }
fi
if [ -e "$stamp" ]; then
    if out=$("$VENV/bin/python" deploy/validate/check_k8s.py deploy/k8s/*.yaml 2>&1); then
        ok "kubernetes manifests: $(echo "$out" | tail -1)"
    else
        echo "$out"; bad "kubernetes manifests"
    fi
fi

# systemd units.
if command -v systemd-analyze >/dev/null; then
    tmp=$(mktemp -d)
    cp deploy/systemd/*.service "$tmp/"
    real_bin=$(readlink -f "$BIN" 2>/dev/null || echo /bin/true)
    [ -x "$real_bin" ] || real_bin=/bin/true
    sed -i "s|/usr/local/bin/fskv|$real_bin|" "$tmp"/*.service
    ( cd "$tmp" && ln -s fskv-gateway-s3@.service fskv-gateway-s3@writer.service && ln -s fskv-gateway-kv@.service fskv-gateway-kv@reader.service \
        && ln -s fskv-gateway-mq@.service fskv-gateway-mq@writer.service && ln -s fskv-mount@.service fskv-mount@mnt-fskv.service )
    for unit in fskv-mgmtd.service fskv-meta.service fskv-storage.service fskv-front.service fskv-gateway-s3@writer.service \
                fskv-gateway-kv@reader.service fskv-gateway-mq@writer.service fskv-mount@mnt-fskv.service; do
        out=$(cd "$tmp" && SYSTEMD_LOG_LEVEL=notice systemd-analyze verify --man=no "./$unit" 2>&1)
        if [ $? -eq 0 ] && [ -z "$out" ]; then ok "systemd-analyze verify $unit"; else echo "$out"; bad "systemd-analyze verify $unit"; fi
    done
    rm -rf "$tmp"
else
    bad "systemd-analyze not found (apt install systemd)"
fi

# The flags the units and manifests pass exist in `fskv SUBCOMMAND --help`
# (subcommands not built yet — the front, the KV and MQ gateways — are named).
if [ -x "$BIN" ]; then
    check_flags() { # file subcommand... (flags read from the file's lines that run it)
        local file=$1; shift
        local help; help=$("$BIN" "$@" --help 2>&1) || { echo "deploy: note: \`fskv $*\` is not built yet; flags in $file not checked"; return 0; }
        local missing=""
        for flag in $(grep -E "fskv( --config[= ][^ ]+)? $*( |$)|^ *- $*$" "$file" -A30 | grep -oE -- '--[a-z][a-z0-9-]+' | sort -u); do
            [ "$flag" = "--config" ] && continue
            grep -qE -- "$flag([ =,]|$)" <<<"$help" || missing="$missing $flag"
        done
        if [ -z "$missing" ]; then ok "flags of fskv $* in $file"; else bad "fskv $* has no$missing (used in $file)"; fi
    }
    check_flags deploy/systemd/fskv-mgmtd.service mgmtd
    check_flags deploy/systemd/fskv-meta.service meta
    check_flags deploy/systemd/fskv-storage.service storage
    check_flags deploy/systemd/fskv-gateway-s3@.service gateway s3
    check_flags deploy/systemd/fskv-mount@.service mount
    check_flags deploy/systemd/fskv-front.service front
fi

# Config and etcd flags.
if [ -x "$BIN" ]; then
    if out=$("$BIN" --config deploy/config/fskv.toml config show 2>&1); then ok "fskv config show --config deploy/config/fskv.toml"
    else echo "$out"; bad "deploy/config/fskv.toml"; fi
else
    bad "no fskv binary at $BIN to check deploy/config/fskv.toml"
fi
if command -v etcd >/dev/null; then
    flags=$(etcd --help 2>&1)
    for var in $(grep -oE '^ETCD_[A-Z_]+' deploy/config/etcd.env.example); do
        flag="--$(echo "${var#ETCD_}" | tr 'A-Z_' 'a-z-')"
        if grep -qE -- "^ *$flag( |$)" <<<"$flags"; then ok "etcd flag $flag ($var)"; else bad "etcd has no flag $flag ($var)"; fi
    done
else
    bad "etcd not found to check deploy/config/etcd.env.example"
fi

echo "deploy: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
