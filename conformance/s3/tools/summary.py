"""Add up pytest junit reports into the harness's one summary line.
Arguments: junit files; beside each, FILE.rc holds pytest's exit code."""
import os
import sys
import xml.etree.ElementTree as ET

p = f = s = 0
for path in sys.argv[1:]:
    rc = int(open(path + ".rc").read().strip()) if os.path.exists(path + ".rc") else 2
    nf = 0
    try:
        for tc in ET.parse(path).getroot().iter("testcase"):
            kinds = {c.tag for c in tc}
            if "failure" in kinds or "error" in kinds:
                nf += 1
            elif "skipped" in kinds:
                s += 1
            else:
                p += 1
    except Exception as e:  # no report: pytest did not get to write one
        print(f"run.sh: no junit report {path} ({e})", file=sys.stderr)
    if rc not in (0, 1, 5) and nf == 0:
        nf = 1  # pytest crashed, was interrupted or timed out
    f += nf
print(f"s3 conformance: {p} passed, {f} failed, {s} skipped")
sys.exit(1 if f else 0)
