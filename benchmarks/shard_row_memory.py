"""What a row costs a shard process: the growth of one tessera-shard's resident memory
(VmRSS) while new ids are pushed into a table through the Python client (100k ids a push,
every row updated once). The first ROWS / 2 rows bring in what the process keeps for
serving whatever the rows (every server thread's message buffers); the growth over the
next ROWS rows is the rows' cost. Prints payload, RSS per row and the bound 1.25 x
payload + 16 bytes for each configuration.

    /usr/bin/python3 benchmarks/shard_row_memory.py build [ROWS [ONLY]]

A shard's message buffers come and go by tens of megabytes (malloc keeps and trims them),
so ROWS should be millions (default 10M) for a per-row figure good to a few bytes.
ONLY: run the configurations whose name contains it ("dim 16 sgd").
"""

import os
import subprocess
import sys
import time

import numpy as np

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
ROWS = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000_000
ONLY = sys.argv[3] if len(sys.argv) > 3 else ""
sys.path.insert(0, os.path.join(BUILD, "python"))
import tessera  # noqa: E402



def start(args):
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    return p, p.stdout.readline().strip().rsplit(" ", 1)[-1]


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def payload(dim, optimizer, dtype):
    weights = dim * (2 if dtype == "bf16" else 4)
    state = {"sgd": 0, "adagrad": dim, "rowwise_adagrad": 1, "adam": 2 * dim}[optimizer]
    return weights + 4 * state


def fill(client, name, dim, begin, rows, step=0):
    grads = np.full((100_000, dim), 1e-3, np.float32)
    for b in range(begin, begin + rows, 100_000):
        ids = np.arange(b, min(begin + rows, b + 100_000), dtype=np.int64) * 7919 + 13
        client.push(name, ids, grads[: len(ids)], step=step)


def main():
    configs = [(dim, opt, dtype) for dim in (16, 64) for opt in ("sgd", "adagrad",
               "rowwise_adagrad", "adam") for dtype in ("fp32", "bf16")]
    print(f"{'table':32} {'payload':>8} {'RSS/row':>9} {'bound':>7} {'x payload':>10}")
    for dim, opt, dtype in configs:
        if ONLY not in f"dim {dim} {opt} {dtype}":
            continue
        shard, address = start([f"{BUILD}/tessera-shard", "--port=0"])
        coordinator, caddr = start([f"{BUILD}/tessera-coordinator", "--port=0",
                                    f"--shards={address}"])
        try:
            time.sleep(0.3)
            c = tessera.connect(caddr)
            c.create_table("t", dim=dim, optimizer=opt, dtype=dtype)
            fill(c, "t", dim, 0, ROWS // 2)
            before = rss(shard.pid)
            fill(c, "t", dim, ROWS // 2, ROWS, step=1)
            per_row = (rss(shard.pid) - before) / ROWS
            p = payload(dim, opt, dtype)
            bound = 1.25 * p + 16
            print(f"dim {dim} {opt} {dtype:24}"[:32].ljust(32),
                  f"{p:8d} {per_row:9.1f} {bound:7.1f} {per_row / p:10.2f}", flush=True)
        finally:
            coordinator.kill()
            shard.kill()
            coordinator.wait()
            shard.wait()


if __name__ == "__main__":
    main()
