#!/usr/bin/env python3
"""S3 gateway CPU per request, gateways side by side on one cluster.

Starts one `fskv up --replicas 1` (with the first binary), then one extra
writer gateway per `--gateway NAME=BINARY` on free loopback ports, all over
the same cluster and credentials. Each round runs, for every gateway in
turn, s5cmd PUT of N objects of 4 KiB and GET of them back, and reads the
gateway process's user+system CPU time from /proc before and after each
phase. Because every gateway serves the same meta and storage processes in
the same round, the CPU per request compares the gateways themselves, far
less disturbed by a loaded machine than throughput is.

Usage (s5cmd from the conformance venv: run conformance/s3/run.sh once):
  benches/s3/gateway_cpu.py --gateway base=/tmp/fskv-base --gateway new=target/release/fskv \
      [--objects 3000] [--rounds 4] [--workers 32]

Prints one line per gateway and round and the means.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bench  # noqa: E402  (same directory: ports, s5cmd runner, inputs)

TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gateway", action="append", required=True, metavar="NAME=BINARY")
    ap.add_argument("--objects", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--venv", default=os.path.join(REPO, "conformance", ".venv"))
    a = ap.parse_args()
    if not (1 <= a.objects <= 100_000 and 1 <= a.rounds <= 20 and 1 <= len(a.gateway) <= 8):
        raise SystemExit("limits: --objects 1..100000, --rounds 1..20, 1..8 gateways")
    gateways = []
    for g in a.gateway:
        name, _, binary = g.partition("=")
        if not name or not os.path.exists(binary):
            raise SystemExit(f"--gateway {g}: expected NAME=BINARY with an existing binary")
        gateways.append((name, os.path.abspath(binary)))
    work = tempfile.mkdtemp(prefix="fskv-gwcpu-", dir=os.path.join(REPO, "target"))
    sdir, _ = bench.make_inputs(work, a.objects, 1)
    data = os.path.join(work, "data")
    base = bench.free_base()
    log = open(os.path.join(work, "up.log"), "w")
    up = subprocess.Popen([gateways[0][1], "up", "--data", data, "--base-port", str(base), "--replicas", "1"],
                          stdout=log, stderr=subprocess.STDOUT)
    procs = []
    out = tempfile.mkdtemp(prefix="fskv-gwcpu-out-", dir="/dev/shm" if os.path.isdir("/dev/shm") else work)
    try:
        ep = os.path.join(data, "endpoints.json")
        deadline = time.time() + 300
        while not (os.path.exists(ep) and "serving" in open(log.name).read()):
            if up.poll() is not None or time.time() > deadline:
                raise SystemExit(f"fskv up did not become ready; see {log.name}")
            time.sleep(0.2)
        creds_file = os.path.join(data, "credentials.json")
        e = json.load(open(ep))
        creds = (e["access_key"], e["secret_key"])
        for i, (name, binary) in enumerate(gateways):
            port = bench.free_base(23000 + 20 * i, 1)
            p = subprocess.Popen([binary, "gateway", "s3", "--role", "writer", "--listen", f"127.0.0.1:{port}",
                                  "--mgmtd", f"127.0.0.1:{base + 11}", "--meta", f"127.0.0.1:{base + 12}",
                                  "--credentials", creds_file],
                                 stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, f"{name}.log"), "w"))
            procs.append((name, p, f"http://127.0.0.1:{port}"))
            bench.wait_port(port)
        bench.s5cmd(a.venv, procs[0][2], creds, a.workers, "mb", "s3://gwcpu")
        results = {name: [] for name, _, _ in procs}
        for r in range(a.rounds):
            for name, p, url in procs:
                c0 = cpu_seconds(p.pid)
                t_put = bench.s5cmd(a.venv, url, creds, a.workers, "cp", f"{sdir}/*", f"s3://gwcpu/{name}{r}/")
                c1 = cpu_seconds(p.pid)
                t_get = bench.s5cmd(a.venv, url, creds, a.workers, "cp", f"s3://gwcpu/{name}{r}/*", f"{out}/{name}{r}/")
                c2 = cpu_seconds(p.pid)
                shutil.rmtree(f"{out}/{name}{r}", ignore_errors=True)
                row = ((c1 - c0) / a.objects * 1e6, (c2 - c1) / a.objects * 1e6, a.objects / t_put, a.objects / t_get)
                results[name].append(row)
                print(f"round {r + 1} {name:10s} PUT {row[2]:7.1f}/s, {row[0]:6.1f} us CPU/request   "
                      f"GET {row[3]:7.1f}/s, {row[1]:6.1f} us CPU/request", flush=True)
        print("\nmean over rounds (gateway process CPU per 4 KiB request):")
        for name, rows in results.items():
            m = [sum(x[i] for x in rows) / len(rows) for i in range(4)]
            print(f"  {name:10s} PUT {m[0]:6.1f} us ({m[2]:.0f}/s)   GET {m[1]:6.1f} us ({m[3]:.0f}/s)")
    finally:
        for _, p, _ in procs:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
