#!/usr/bin/env bash
# The KV-cache engine adapters' real tests (clients/python/sglang_fskv.py,
# clients/python/lmcache_fskv.py) with torch and the engines' own modules,
# against a fresh `fskv up`. Not part of deploy/test.sh: it installs torch
# (CPU) and the engines into deploy/.venv-kv-adapters (several GB, once).
#
#   deploy/kv-adapter-tests.sh            (uses target/debug/fskv, or $FSKV_BIN)
#   deploy/kv-adapter-tests.sh --setup-only
#
# torch: the CPU wheel index first, PyPI's wheel otherwise. SGLang and LMCache
# are installed with --no-deps, then only the modules their storage interfaces
# import are added (one at a time, from the import error, at most 40 rounds).
# A test whose engine cannot be imported prints `SKIPPED: <reason>`.
# Prints `kv adapter tests: N passed, M failed, K skipped`.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
VENV="$ROOT/deploy/.venv-kv-adapters"
LOG="$VENV.install.log"
PY="$VENV/bin/python"

pipq() { "$PY" -m pip install -q --disable-pip-version-check "$@" >>"$LOG" 2>&1; }

# module name in an import error -> the PyPI package that provides it (where they differ)
pkg_for() {
    case "$1" in
        yaml) echo pyyaml ;; zmq) echo pyzmq ;; PIL) echo pillow ;; google) echo protobuf ;;
        sklearn) echo scikit-learn ;; cv2) echo opencv-python-headless ;; msgspec) echo msgspec ;;
        prometheus_client) echo prometheus-client ;; pydantic_core) echo pydantic ;; cpuinfo) echo py-cpuinfo ;; sortedcontainers) echo sortedcontainers ;;
        *) echo "$1" | tr _ - ;;
    esac
}

# Installs what `import $2` lacks, one module at a time; $1 names the engine.
complete_imports() {
    local name="$1" mod="$2" i missing
    for i in $(seq 1 40); do
        missing=$("$PY" - "$mod" <<'PY' 2>/dev/null
import importlib, sys
try:
    importlib.import_module(sys.argv[1])
except ModuleNotFoundError as e:
    print(e.name.split(".")[0])
except Exception as e:
    print("!" + type(e).__name__ + ": " + str(e).replace("\n", " ")[:300])
PY
)
        if [ -z "$missing" ]; then echo "setup: $name imports ($mod)"; return 0; fi
        case "$missing" in
            '!'*) echo "setup: $name does not import: ${missing#!}"; echo "${missing#!}" >"$VENV/.$name-unavailable"; return 1 ;;
            sglang|lmcache|torch) echo "setup: $name: $missing missing"; echo "$missing missing" >"$VENV/.$name-unavailable"; return 1 ;;
        esac
        echo "setup: $name needs $missing -> pip install $(pkg_for "$missing")" >>"$LOG"
        if ! pipq "$(pkg_for "$missing")"; then
            echo "setup: $name: installing $(pkg_for "$missing") failed (see $LOG)"
            echo "cannot install $(pkg_for "$missing") for module $missing" >"$VENV/.$name-unavailable"
            return 1
        fi
    done
    echo "setup: $name: still missing modules after 40 rounds"; echo "too many missing modules" >"$VENV/.$name-unavailable"
    return 1
}

setup() {
    [ -x "$PY" ] || python3 -m venv "$VENV" || return 1
    : >>"$LOG"
    if ! "$PY" -c 'import torch' 2>/dev/null; then
        echo "setup: installing torch (CPU) into $VENV (log: $LOG)"
        # The CPU wheel index when reachable (small); PyPI's wheel (with its CUDA libraries) otherwise.
        pipq --retries 0 --timeout 20 torch --index-url https://download.pytorch.org/whl/cpu || pipq torch || { echo "setup: torch could not be installed"; return 1; }
        pipq numpy
    fi
    "$PY" -c 'import torch' || { echo "setup: torch installed but does not import"; return 1; }
    rm -f "$VENV/.sglang-unavailable" "$VENV/.lmcache-unavailable"
    "$PY" -c 'import sglang' 2>/dev/null || pipq sglang --no-deps || echo "pip install sglang --no-deps failed" >"$VENV/.sglang-unavailable"
    [ -e "$VENV/.sglang-unavailable" ] || complete_imports sglang sglang.srt.mem_cache.hicache_storage
    [ -e "$VENV/.sglang-unavailable" ] || complete_imports sglang sglang.srt.mem_cache.storage.backend_factory
    "$PY" -c 'import lmcache' 2>/dev/null || pipq lmcache --no-deps || echo "pip install lmcache --no-deps failed" >"$VENV/.lmcache-unavailable"
    # LMCache's CPU compute backend needs numba; without it `import lmcache` only warns and
    # its memory management then fails to import (an ImportError, not a missing module).
    [ -e "$VENV/.lmcache-unavailable" ] || "$PY" -c 'import numba' 2>/dev/null || pipq numba
    [ -e "$VENV/.lmcache-unavailable" ] || complete_imports lmcache lmcache.v1.storage_backend.connector
    return 0
}

if ! setup; then
    echo "SKIPPED: kv adapter tests: torch could not be installed here (see $LOG)"
    echo "kv adapter tests: 0 passed, 0 failed, 2 skipped"
    exit 0
fi
[ "${1:-}" = "--setup-only" ] && exit 0

. deploy/lib.sh
BIN="${FSKV_BIN:-$ROOT/target/debug/fskv}"
[ -x "$BIN" ] || cargo build -p fskv
work=$(mktemp -d /tmp/fskv-kvadapters.XXXXXX)
pid=""
cleanup() {
    fskv_stop_pid "$pid"
    rm -rf "$work"
}
trap cleanup EXIT
base=$(fskv_free_base_port 17600)
"$BIN" up --data "$work/data" --base-port "$base" >"$work/up.log" 2>&1 &
pid=$!
for _ in $(seq 1 900); do
    if grep -q "fskv up: serving" "$work/up.log" 2>/dev/null; then break; fi
    if ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.2
done
if ! grep -q "fskv up: serving" "$work/up.log"; then
    echo "kv-adapter-tests: fskv up did not become ready:"; tail -20 "$work/up.log"
    echo "kv adapter tests: 0 passed, 1 failed, 0 skipped"
    exit 1
fi
eval "$(python3 - "$work/data/endpoints.json" <<'PY'
import json, shlex, sys
e = json.load(open(sys.argv[1]))
for k, v in [("KV_URL", e["kv"]), ("KV_TOKEN", e["bearer_token"])]:
    print("export %s=%s" % (k, shlex.quote(v)))
PY
)"
export FSKV_SGLANG_UNAVAILABLE="$(cat "$VENV/.sglang-unavailable" 2>/dev/null)"
export FSKV_LMCACHE_UNAVAILABLE="$(cat "$VENV/.lmcache-unavailable" 2>/dev/null)"
log="$work/test.log"
status=0
for t in test_sglang test_lmcache; do
    (cd conformance/kv/adapters && "$PY" -W ignore::ResourceWarning -m unittest -v "$t") >>"$log" 2>&1 || status=1
done
cat "$log"
# Counted from unittest's summaries ("Ran N tests", "OK (skipped=K)", "FAILED (failures=F, errors=E)"):
# the engines log to the same stream, so a test's "... ok" may not end its line.
python3 - "$log" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
ran = sum(int(n) for n in re.findall(r"^Ran (\d+) tests? in", text, re.M))
bad = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", text))
skipped = sum(int(n) for n in re.findall(r"skipped=(\d+)", text))
for line in re.findall(r"^SKIPPED: .*$", text, re.M):
    print(line)
print("kv adapter tests: %d passed, %d failed, %d skipped" % (ran - bad - skipped, bad, skipped))
PY
exit $status
