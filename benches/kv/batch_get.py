#!/usr/bin/env python3
"""Batch get of 16 x 4 MiB values with the Python client reading straight
into preallocated buffers (`batch_get_into`), against one or more KV
endpoints of the same cluster, interleaved round by round.

    benches/kv/batch_get.py --target front=DATA/endpoints.json \
        --target direct=DATA/endpoints.json@http://127.0.0.1:PORT \
        [--seconds 3] [--rounds 3]

A target is NAME=ENDPOINTS_JSON[@URL]: its bearer token comes from that
endpoints.json, its URL is `kv` there unless given (e.g. a gateway process
started by hand, not behind the front). The values are written first
through each cluster's KV writer (`kv` in endpoints.json), in namespace `bench` as keys `big-00` .. `big-15` (the
same keys `fskv bench kv-gateway` writes). Every batch is checked: 16
values of 4 MiB each, the first one's bytes compared with what was written.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "clients", "python"))
from fskv_kv import KvClient  # noqa: E402

VALUE_BYTES = 4 << 20
KEYS = [f"big-{i:02}".encode() for i in range(16)]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", action="append", required=True, help="NAME=ENDPOINTS_JSON[@URL] (repeat)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    value = bytes((i * 2654435761 >> 11) & 0xFF for i in range(4096)) * (VALUE_BYTES // 4096)
    targets = []
    filled = set()
    for t in a.target:
        name, sep, rest = t.partition("=")
        path, _, url = rest.partition("@")
        if not sep or not path:
            sys.exit(f"--target {t}: expected NAME=ENDPOINTS_JSON[@URL]")
        e = json.load(open(path))
        token = e["bearer_token"]
        if path not in filled:
            writer = KvClient(e["kv"], token)
            writer.put_namespace("bench")
            for k in KEYS:
                writer.put("bench", k, value)
            filled.add(path)
        targets.append((name, url or e["kv"], token))
    bufs = [bytearray(VALUE_BYTES) for _ in KEYS]
    results = {name: [] for name, _, _ in targets}
    for rnd in range(a.rounds):
        for name, url, token in targets:
            c = KvClient(url, token)
            start = time.monotonic()
            n = 0
            while time.monotonic() - start < a.seconds or n == 0:
                lens = c.batch_get_into("bench", KEYS, bufs)
                if lens != [VALUE_BYTES] * len(KEYS) or bufs[0] != value:
                    sys.exit(f"{name}: batch get incomplete or wrong: {lens}")
                n += 1
            mib = n * len(KEYS) * VALUE_BYTES / (1 << 20) / (time.monotonic() - start)
            results[name].append(mib)
            print(f"round {rnd + 1} {name:<10} {mib:8.0f} MiB/s ({n} batches)", flush=True)
    for name, v in results.items():
        print(f"{name:<10} median {sorted(v)[len(v) // 2]:.0f} MiB/s over {len(v)} rounds")


if __name__ == "__main__":
    main()
