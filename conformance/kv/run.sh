#!/usr/bin/env bash
# KV gateway conformance: the Python client's tests (standard library), the
# KV-cache engine adapters' tests without torch (test_adapters: stand-ins for
# the engine objects) and
# py-consul scenarios (unchanged client code) against a running gateway.
#
#   run.sh ENDPOINTS_JSON      (the endpoints.json of an `fskv up`)
#
# Prints "kv conformance: N passed, M failed, K skipped" and exits non-zero
# when anything failed. py-consul is installed into conformance/.venv-kv
# (once per requirements.txt hash); without network the Consul tests are
# reported skipped.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
endpoints="${1:?usage: run.sh ENDPOINTS_JSON}"
VENV="$(cd "$HERE/.." && pwd)/.venv-kv"
REQ="$HERE/requirements.txt"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$VENV/.requirements" 2>/dev/null)" != "$want" ]; then
    python3 -m venv "$VENV" && "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ" >"$VENV.install.log" 2>&1 \
        && echo "$want" >"$VENV/.requirements" || echo "run.sh: pip install py-consul failed (see $VENV.install.log); Consul tests will be skipped"
fi
PY="$VENV/bin/python"
[ -x "$PY" ] || PY=python3
eval "$(python3 - "$endpoints" <<'PY'
import json, shlex, sys
e = json.load(open(sys.argv[1]))
for k, v in [("KV_URL", e["kv"]), ("KV_READER_URL", e["kv_reader"]), ("CONSUL_URL", e["consul"]),
             ("CONSUL_READER_URL", e["consul_reader"]), ("KV_TOKEN", e["bearer_token"])]:
    print("export %s=%s" % (k, shlex.quote(v)))
PY
)"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
status=0
for t in test_client test_adapters test_consul; do
    (cd "$HERE" && "$PY" -W ignore::ResourceWarning -m unittest -v "$t") >>"$log" 2>&1 || status=1
done
cat "$log"
grep '\.\.\. skipped' "$log" | sed 's/^/SKIPPED: /'
# Counted from unittest's summaries ("Ran N tests", "OK (skipped=K)", "FAILED (failures=F, errors=E)"):
# a line logged during a test can split "name ... ok" over two lines.
python3 - "$log" <<'PY'
import re, sys
text = open(sys.argv[1], errors="replace").read()
ran = sum(int(n) for n in re.findall(r"^Ran (\d+) tests? in", text, re.M))
bad = sum(int(n) for n in re.findall(r"(?:failures|errors)=(\d+)", text))
skipped = sum(int(n) for n in re.findall(r"skipped=(\d+)", text))
print("kv conformance: %d passed, %d failed, %d skipped" % (ran - bad - skipped, bad, skipped))
PY
exit $status
