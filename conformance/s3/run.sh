#!/usr/bin/env bash
# S3 conformance harness. See README.md beside this file.
#
#   run.sh --endpoint http://127.0.0.1:PORT --access-key AK --secret-key SK \
#          [--reader-endpoint URL] [--reference moto|none] [-- PYTEST_ARGS...]
#   run.sh --self-test [--reference moto|none] [-- PYTEST_ARGS...]
#   (--target-kind moto marks a hand-started moto as the target: gateway-only
#   tests are then skipped as in --self-test)
#
# Prints one line "s3 conformance: N passed, M failed, K skipped" and exits
# non-zero when anything failed.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
VENV="$(cd "$HERE/.." && pwd)/.venv"
REQ="$HERE/requirements.txt"

endpoint="" ak="" sk="" reader="" reference="moto" self_test=0 target="gateway"
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --endpoint) endpoint="$2"; shift 2 ;;
    --access-key) ak="$2"; shift 2 ;;
    --secret-key) sk="$2"; shift 2 ;;
    --reader-endpoint) reader="$2"; shift 2 ;;
    --reference) reference="$2"; shift 2 ;;
    --self-test) self_test=1; shift ;;
    --target-kind) target="$2"; shift 2 ;;
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$reference" in moto|none) ;; *) echo "run.sh: --reference must be moto or none" >&2; exit 2 ;; esac

# ---- venv, once per requirements hash (quiet, idempotent)
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
marker="$VENV/.conformance-requirements"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$marker" 2>/dev/null)" != "$want" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ" >"$VENV.install.log" 2>&1 \
    || { echo "run.sh: pip install failed, see $VENV.install.log" >&2; tail -20 "$VENV.install.log" >&2; exit 2; }
  echo "$want" >"$marker"
fi
PY="$VENV/bin/python"

work="$(mktemp -d "${TMPDIR:-/tmp}/s3conf.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_moto() { # $1 = name, [$2 = unauthenticated requests before signature checks start]; sets MOTO_URL
  local port; port="$(free_port)"
  if [ -n "${2:-}" ]; then
    INITIAL_NO_AUTH_ACTION_COUNT="$2" "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$work/$1.log" 2>&1 &
  else
    "$VENV/bin/moto_server" -H 127.0.0.1 -p "$port" >"$work/$1.log" 2>&1 &
  fi
  pids+=("$!")
  for _ in $(seq 1 100); do
    if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$port/moto-api/', timeout=1)" 2>/dev/null; then
      MOTO_URL="http://127.0.0.1:$port"; return 0
    fi
    sleep 0.2
  done
  echo "run.sh: moto server ($1) did not start; log:" >&2; cat "$work/$1.log" >&2; exit 2
}

if [ "$self_test" = 1 ]; then
  start_moto target
  endpoint="$MOTO_URL"; ak="${ak:-testing}"; sk="${sk:-testing}"; target="moto"
fi
if [ -z "$endpoint" ] || [ -z "$ak" ] || [ -z "$sk" ]; then
  echo "run.sh: --endpoint, --access-key and --secret-key are required (or --self-test)" >&2; exit 2
fi
for url in "$endpoint" ${reader:+"$reader"}; do
  "$PY" -c 'import sys, urllib.parse as u; h = u.urlsplit(sys.argv[1]).hostname or ""; sys.exit(0 if h == "localhost" or h.startswith("127.") or h == "::1" else 1)' "$url" \
    || { echo "run.sh: $url is not a loopback address; the harness sends traffic only to loopback" >&2; exit 2; }
done
ref_url=""
if [ "$reference" = moto ]; then start_moto reference; ref_url="$MOTO_URL"; fi

export S3_READER_ENDPOINT="$reader" S3_REFERENCE_ENDPOINT="$ref_url"
export PYTHONDONTWRITEBYTECODE=1

run_pytest() { # $1 = junit file, $2 = log file, rest = pytest arguments
  local junit="$1" log="$2"; shift 2
  set +e
  (cd "$HERE" && timeout 900 "$PY" -m pytest -q -rfEs --junitxml="$junit" "$@") >"$log" 2>&1
  echo $? >"$junit.rc"
  set -e
}

S3_ENDPOINT="$endpoint" S3_ACCESS_KEY="$ak" S3_SECRET_KEY="$sk" S3_TARGET="$target" \
  run_pytest "$work/junit.xml" "$work/pytest.out" "${pytest_args[@]}"
cp "$work/pytest.out" "$HERE/../last-run.log"
grep -hE '^(FAILED|ERROR|SKIPPED) ' "$work/pytest.out" || true
reports=("$work/junit.xml")

if [ "$self_test" = 1 ] && [ ${#pytest_args[@]} -eq 0 ]; then
  # Second pass: moto with signature checking on (its IAM auth), proving the
  # harness's own SigV4 signing (raw requests, aws-chunked seed signatures)
  # and its 403 expectations. Tests marked auth_proof run there.
  start_moto auth 3
  read -r auth_ak auth_sk < <("$PY" "$HERE/tools/moto_auth_user.py" "$MOTO_URL")
  S3_ENDPOINT="$MOTO_URL" S3_ACCESS_KEY="$auth_ak" S3_SECRET_KEY="$auth_sk" S3_TARGET="moto-auth" \
    S3_REFERENCE_ENDPOINT="" run_pytest "$work/junit-auth.xml" "$work/pytest-auth.out" -m auth_proof
  { echo; echo "==== second pass: moto with signature checking (-m auth_proof)"; cat "$work/pytest-auth.out"; } \
    >>"$HERE/../last-run.log"
  grep -hE '^(FAILED|ERROR) ' "$work/pytest-auth.out" | sed 's/^/[auth pass] /' || true
  reports+=("$work/junit-auth.xml")
fi

"$PY" "$HERE/tools/summary.py" "${reports[@]}"
