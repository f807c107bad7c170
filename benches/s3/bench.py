#!/usr/bin/env python3
"""S3 gateway benchmark: s5cmd as the client, our gateway (replication
factor 1 and 3) next to `rclone serve s3` and `s3s-fs` on the local disk, in
one run on one machine.

Workloads (each timed with s5cmd, the same for every server):
  put-small  N objects of 4 KiB       (ops/s)
  get-small  the same N objects       (ops/s)
  put-large  M objects of 64 MiB      (MiB/s)
  get-large  the same M objects       (MiB/s)

Usage (after `cargo build --release -p fskv`; the conformance venv has
s5cmd and rclone: run conformance/s3/run.sh once, or pass --venv):
  benches/s3/bench.py [--small 2000] [--large 4] [--workers 32] [--rounds 3]
                      [--servers fskv-r1,fskv-r3,rclone,s3s-fs] [--json out.json]
                      [--fskv-base OLD_BIN --servers base-r1,fskv-r1,...]
                      [--servers fskv-r1,fskv-r1-versioned,fskv-r1-nosync,...]

`fskv-rN-versioned` is `fskv up --replicas N` whose bench bucket has
versioning Enabled (set with boto3 from the venv): every PUT goes through the
versioned publish (one meta transaction guarded on the key).
`fskv-rN-nosync` is `fskv up --replicas N --no-sync-writes`: acknowledged
writes are not synced (no fdatasync of chunk writes, no KV WAL sync), as
neither peer syncs; it shows what durability costs, it is not the default. Rounds write
fresh keys, so each PUT makes the first version of its key; with
--overwrite every round writes the same keys, so from the second round on
each PUT replaces an object (on a versioned bucket: moves the previous
version into the version store), for every server alike.

Every server runs on loopback with its data under --work (default a fresh
temp dir on the same disk), all at once, and is stopped at the end. Rounds
interleave the servers (round r runs every server before round r+1), so
drift of the machine during the run touches all of them alike. Downloads go
to --out (default /dev/shm: s5cmd writing thousands of small files is often
the bottleneck, and a tmpfs keeps the client's own disk out of the figure).
Each figure is the best of --rounds rounds (fresh keys per round).
--clients N runs the 4 KiB PUT and GET as N `s5cmd run` processes at once,
each with an explicit `cp` per key of its share (one s5cmd process with 32
workers is the bottleneck of GET 4 KiB for every server here). Prints a
table with ratios to the best peer and writes JSON with --json.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
AK, SK = "benchkey", "benchsecret0123456789"


def free_base(start=18000, width=16):
    for base in range(start, 30000, 20):
        socks = []
        try:
            for off in range(width):
                s = socket.socket()
                s.bind(("127.0.0.1", base + off))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise SystemExit("no free port range")


def wait_port(port, timeout_s=60):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"nothing listens on {port} after {timeout_s} s")


class Server:
    def __init__(self, name, url, proc, stop_wait_s=30):
        self.name, self.url, self.proc, self.stop_wait_s = name, url, proc, stop_wait_s

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_fskv(work, fskv, replicas, name=None, extra=()):
    name = name or f"fskv-r{replicas}"
    data = os.path.join(work, name)
    base = free_base()
    log = open(os.path.join(work, f"{name}.log"), "w")
    proc = subprocess.Popen([fskv, "up", "--data", data, "--base-port", str(base), "--replicas", str(replicas), *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    ep = os.path.join(data, "endpoints.json")
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"fskv up exited; see {log.name}")
        if os.path.exists(ep) and "serving" in open(log.name).read():
            break
        time.sleep(0.2)
    e = json.load(open(ep))
    creds = (e["access_key"], e["secret_key"])
    return Server(name, e["s3"], proc), creds


def start_rclone(work, venv):
    root = os.path.join(work, "rclone-data")
    os.makedirs(root)
    port = free_base(21000, 1)
    log = open(os.path.join(work, "rclone.log"), "w")
    proc = subprocess.Popen([os.path.join(venv, "bin", "rclone"), "serve", "s3", root, "--addr", f"127.0.0.1:{port}",
                             "--auth-key", f"{AK},{SK}", "--force-path-style=true"],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "RCLONE_CONFIG": "/dev/null"})
    wait_port(port)
    return Server("rclone", f"http://127.0.0.1:{port}", proc), (AK, SK)


def start_s3s_fs(work):
    exe = shutil.which("s3s-fs") or os.path.expanduser("~/.cargo/bin/s3s-fs")
    if not os.path.exists(exe):
        raise SystemExit("s3s-fs not installed: cargo install s3s-fs@0.14.1 --features binary")
    root = os.path.join(work, "s3s-fs-data")
    os.makedirs(root)
    port = free_base(22000, 1)
    log = open(os.path.join(work, "s3s-fs.log"), "w")
    proc = subprocess.Popen([exe, "--host", "127.0.0.1", "--port", str(port), "--access-key", AK, "--secret-key", SK, root],
                            stdout=log, stderr=subprocess.STDOUT)
    wait_port(port)
    return Server("s3s-fs", f"http://127.0.0.1:{port}", proc), (AK, SK)


def s5cmd(venv, url, creds, workers, *args):
    env = {**os.environ, "AWS_ACCESS_KEY_ID": creds[0], "AWS_SECRET_ACCESS_KEY": creds[1], "AWS_REGION": "us-east-1"}
    cmd = [os.path.join(venv, "bin", "s5cmd"), "--endpoint-url", url, "--numworkers", str(workers), "--retry-count", "2", *args]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=1800)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"s5cmd {' '.join(args)} against {url} failed: {r.stderr[-2000:]}")
    return dt


def s5cmd_parallel(venv, url, creds, workers, command_files):
    """`s5cmd run FILE` for every file at once (one client process each);
    the seconds until the last one ends."""
    env = {**os.environ, "AWS_ACCESS_KEY_ID": creds[0], "AWS_SECRET_ACCESS_KEY": creds[1], "AWS_REGION": "us-east-1"}
    base = [os.path.join(venv, "bin", "s5cmd"), "--endpoint-url", url, "--numworkers", str(workers), "--retry-count", "2", "run"]
    t0 = time.perf_counter()
    procs = [subprocess.Popen(base + [f], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for f in command_files]
    errors = []
    for f, p in zip(command_files, procs):
        try:
            _, err = p.communicate(timeout=1800)
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
        if p.returncode != 0:
            errors.append(f"{f}: {err[-1000:]}")
    dt = time.perf_counter() - t0
    if errors:
        raise SystemExit(f"s5cmd run against {url} failed: {errors}")
    return dt


def small_ops_split(out_root, tag, sdir, prefix, out, clients):
    """Command files of `clients` s5cmd processes that PUT, then GET, the
    small inputs, each process a disjoint share (key i to process i mod N)."""
    names = sorted(os.listdir(sdir))
    files = {"put": [], "get": []}
    for c in range(clients):
        share = names[c::clients]
        for op, line in (("put", lambda n: f"cp {sdir}/{n} s3://bench/{prefix}/small/{n}"),
                         ("get", lambda n: f"cp s3://bench/{prefix}/small/{n} {out}/small/{n}")):
            path = os.path.join(out_root, f"{tag}-{op}-{c}.txt")
            with open(path, "w") as f:
                f.write("".join(line(n) + "\n" for n in share))
            files[op].append(path)
    return files


def make_inputs(work, small, large):
    sdir = os.path.join(work, "in-small")
    ldir = os.path.join(work, "in-large")
    os.makedirs(sdir)
    os.makedirs(ldir)
    for i in range(small):
        with open(os.path.join(sdir, f"o{i:06d}"), "wb") as f:
            f.write(os.urandom(4096))
    for i in range(large):
        with open(os.path.join(ldir, f"big{i:03d}"), "wb") as f:
            for _ in range(64):
                f.write(os.urandom(1 << 20))
    return sdir, ldir


def enable_versioning(venv, url, creds):
    code = ("import boto3, sys; boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id=sys.argv[2], "
            "aws_secret_access_key=sys.argv[3], region_name='us-east-1')"
            ".put_bucket_versioning(Bucket='bench', VersioningConfiguration={'Status': 'Enabled'})")
    subprocess.run([os.path.join(venv, "bin", "python"), "-c", code, url, creds[0], creds[1]], check=True, timeout=60)


def bench_round(srv, creds, venv, out_root, sdir, ldir, small, large, workers, r, overwrite=False, clients=1):
    run = lambda *a: s5cmd(venv, srv.url, creds, workers, *a)
    out = os.path.join(out_root, f"out-{srv.name}-{r}")
    os.makedirs(out)
    p = "same" if overwrite else f"r{r}"
    try:
        if clients > 1:
            os.makedirs(os.path.join(out, "small"))
            cmds = small_ops_split(out_root, f"{srv.name}-{r}", sdir, p, out, clients)
            put_small = small / s5cmd_parallel(venv, srv.url, creds, workers, cmds["put"])
            get_small = small / s5cmd_parallel(venv, srv.url, creds, workers, cmds["get"])
        else:
            put_small = small / run("cp", f"{sdir}/*", f"s3://bench/{p}/small/")
            get_small = small / run("cp", f"s3://bench/{p}/small/*", f"{out}/small/")
        return {
            "put-small": put_small,
            "get-small": get_small,
            "put-large": large * 64 / run("cp", f"{ldir}/*", f"s3://bench/{p}/large/"),
            "get-large": large * 64 / run("cp", f"s3://bench/{p}/large/*", f"{out}/large/"),
        }
    finally:
        shutil.rmtree(out, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fskv", default=os.path.join(REPO, "target", "release", "fskv"))
    ap.add_argument("--fskv-base", default=None,
                    help="a baseline fskv binary (e.g. built from main): servers base-r1/base-r3 run it, in the same rounds")
    ap.add_argument("--venv", default=os.path.join(REPO, "conformance", ".venv"))
    ap.add_argument("--work", default=None, help="scratch directory (default: a fresh temp dir, removed at the end)")
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--large", type=int, default=4)
    ap.add_argument("--workers", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--servers", default="fskv-r1,fskv-r3,rclone,s3s-fs")
    ap.add_argument("--json", default=None)
    ap.add_argument("--overwrite", action="store_true", help="every round writes the same keys (PUTs replace objects)")
    ap.add_argument("--out", default="/dev/shm" if os.path.isdir("/dev/shm") else None, help="where downloads go")
    ap.add_argument("--clients", type=int, default=1,
                    help="s5cmd processes for the 4 KiB PUT and GET (each `s5cmd run` of its share of the keys; "
                         "1: one `s5cmd cp` with a wildcard)")
    a = ap.parse_args()
    if not (1 <= a.small <= 100_000 and 1 <= a.large <= 64 and 1 <= a.rounds <= 10 and 1 <= a.clients <= 8):
        raise SystemExit("limits: --small 1..100000, --large 1..64, --rounds 1..10, --clients 1..8")
    for tool in ("s5cmd", "rclone"):
        if not os.path.exists(os.path.join(a.venv, "bin", tool)):
            raise SystemExit(f"{tool} missing in {a.venv}: run conformance/s3/run.sh once (it makes the venv)")
    work = a.work or tempfile.mkdtemp(prefix="fskv-s3bench-", dir=os.path.join(REPO, "target"))
    os.makedirs(work, exist_ok=True)
    print(f"s3 bench: inputs {a.small} x 4 KiB, {a.large} x 64 MiB; s5cmd --numworkers {a.workers}, {a.clients} client process(es) for 4 KiB; best of {a.rounds}; work {work}", flush=True)
    sdir, ldir = make_inputs(work, a.small, a.large)
    results = {}
    servers = []
    out_root = tempfile.mkdtemp(prefix="fskv-s3bench-out-", dir=a.out or work)
    try:
        versioned = set()
        for name in a.servers.split(","):
            if name.startswith("fskv-r") and name.endswith("-versioned"):
                servers.append(start_fskv(work, a.fskv, int(name[len("fskv-r"):-len("-versioned")]), name))
                versioned.add(name)
            elif name.startswith("fskv-r") and name.endswith("-nosync"):
                servers.append(start_fskv(work, a.fskv, int(name[len("fskv-r"):-len("-nosync")]), name, ["--no-sync-writes"]))
            elif name.startswith("fskv-r"):
                servers.append(start_fskv(work, a.fskv, int(name[len("fskv-r"):])))
            elif name.startswith("base-r"):
                if not a.fskv_base:
                    raise SystemExit("base-rN needs --fskv-base BIN")
                servers.append(start_fskv(work, a.fskv_base, int(name[len("base-r"):]), name))
            elif name == "rclone":
                servers.append(start_rclone(work, a.venv))
            elif name == "s3s-fs":
                servers.append(start_s3s_fs(work))
            else:
                raise SystemExit(f"unknown server {name}")
        for srv, creds in servers:
            s5cmd(a.venv, srv.url, creds, a.workers, "mb", "s3://bench")
            if srv.name in versioned:
                enable_versioning(a.venv, srv.url, creds)
        for r in range(a.rounds):
            for srv, creds in servers:
                figures = bench_round(srv, creds, a.venv, out_root, sdir, ldir, a.small, a.large, a.workers, r, a.overwrite, a.clients)
                best = results.setdefault(srv.name, {})
                for k, v in figures.items():
                    best[k] = max(best.get(k, 0.0), v)
                print(f"  round {r + 1} {srv.name}: " + "  ".join(f"{k} {v:.1f}" for k, v in figures.items()), flush=True)
    finally:
        for srv, _ in servers:
            srv.stop()
        shutil.rmtree(out_root, ignore_errors=True)
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    peers = [n for n in results if not n.startswith(("fskv", "base"))]
    keys = ["put-small", "get-small", "put-large", "get-large"]
    units = {"put-small": "ops/s", "get-small": "ops/s", "put-large": "MiB/s", "get-large": "MiB/s"}
    print()
    print("| server | " + " | ".join(f"{k} ({units[k]})" for k in keys) + " |")
    print("|---|" + "---|" * len(keys))
    for n, r in results.items():
        cells = []
        for k in keys:
            cell = f"{r[k]:.1f}"
            if n.startswith(("fskv", "base")) and peers:
                best_peer = max(results[p][k] for p in peers)
                cell += f" ({r[k] / best_peer:.2f}x best peer)"
            cells.append(cell)
        print(f"| {n} | " + " | ".join(cells) + " |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
