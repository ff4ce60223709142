#!/usr/bin/env python3
"""Live resharding under load: a cluster of 2 memory-only shards holding ROWS rows (one
table, dim 16, Adagrad, imported with state) moves to 3 shards (RESHARD_DATA_DIRS=1: shards with data directories) while tessera-train trains
through it (smart client) and a Python client pushes gradients of PUSH_ROWS random rows of
the big table in a loop (0: no pusher). RESHARD_FIXED=1: the big table has a fixed
vocabulary of ROWS ids (every row moves; shards of both maps fill a second layout) and the
trainer's tables too (--vocabulary=hashed). Prints the rows moved, how long the reshard took and how long pushes
waited, the run's samples/s and the pusher's rows/s before, during and after it, and checks
that a sample of the big table's rows reads the same afterwards as it did before (the
sample is never pushed to).

  python3 benchmarks/reshard_bench.py [BUILD_DIR] [ROWS] [BATCH] [PUSH_ROWS]

Every process listens on 127.0.0.1 only.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
ROWS = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000_000
BATCH = int(sys.argv[3]) if len(sys.argv) > 3 else 2048
PUSH_ROWS = int(sys.argv[4]) if len(sys.argv) > 4 else 4096
sys.path.insert(0, os.path.join(BUILD, "python"))
import tessera  # noqa: E402


def start(args, log):
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    return p, line.strip().rsplit(" ", 1)[-1]


def records(path):
    try:
        with open(path) as f:
            return [json.loads(l) for l in f if '"train"' in l]
    except FileNotFoundError:
        return []


def rate(recs, t0, t1):
    """samples/s of the records whose interval ends in (t0, t1] (elapsed seconds)."""
    inside = [r for r in recs if t0 < r["elapsed_s"] <= t1]
    before = [r for r in recs if r["elapsed_s"] <= t0]
    if not inside:
        return 0.0
    s0 = before[-1]["samples"] if before else 0
    e0 = before[-1]["elapsed_s"] if before else 0.0
    return (inside[-1]["samples"] - s0) / (inside[-1]["elapsed_s"] - e0)


def start_cluster(root, log, durable, procs):
    """Shards 0 and 1 (map version 1), shard 2 started empty with its place in version 2,
    and a coordinator over the first two: (their addresses, shard 2's, the coordinator's)."""
    def data_dir(k):
        return [f"--data_dir={root}/shard-{k}"] if durable else []

    shards = []
    for k in range(2):
        p, a = start([f"{BUILD}/tessera-shard", "--port=0", f"--shard_index={k}",
                      "--num_shards=2"] + data_dir(k), log)
        procs.append(p)
        shards.append(a)
    p, third = start([f"{BUILD}/tessera-shard", "--port=0", "--shard_index=2",
                      "--num_shards=3", "--shard_map_version=2"] + data_dir(2), log)
    procs.append(p)
    p, coordinator = start([f"{BUILD}/tessera-coordinator", "--port=0",
                            "--shards=" + ",".join(shards)], log)
    procs.append(p)
    time.sleep(0.5)
    return shards, third, coordinator


def import_big_table(c, big_id, fixed):
    c.create_table("big.t", dim=16, optimizer="adagrad",
                   **({"vocabulary_size": ROWS} if fixed else {}))
    rng = np.random.default_rng(1)
    t0 = time.time()
    for b in range(0, ROWS, 500_000):
        ids = big_id(np.arange(b, min(ROWS, b + 500_000), dtype=np.int64))
        c.import_rows("big.t", ids, rng.standard_normal((len(ids), 16), dtype=np.float32),
                      state=np.full((len(ids), 16), 0.1, np.float32))
    print(f"imported {ROWS} rows in {time.time() - t0:.1f} s", flush=True)


class Pusher:
    """Pushes to random rows of the big table in a loop, none of the probed ones (row i for
    i not a multiple of `stride`), noting (time, rows) per push."""

    def __init__(self, coordinator, big_id, stride):
        self.pushed = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, args=(coordinator, big_id, stride))
        if PUSH_ROWS > 0:
            self.thread.start()

    def loop(self, coordinator, big_id, stride):
        pc = tessera.connect(coordinator)
        r = np.random.default_rng(2)
        step = 0
        while not self.stop.is_set():
            i = r.integers(0, ROWS, PUSH_ROWS)
            i = i[i % stride != 0]
            pc.push("big.t", big_id(i.astype(np.int64)),
                    np.full((len(i), 16), 0.01, np.float32), step=step)
            step += 1
            self.pushed.append((time.time(), len(i)))

    def join(self):
        self.stop.set()
        if PUSH_ROWS > 0:
            self.thread.join()

    def rate(self, a, b):
        return sum(n for t, n in self.pushed if a < t <= b) / (b - a)


def reshard_while_training(coordinator, shards, metrics, fixed, log, procs):
    """tessera-train through the cluster; 8 s in, the reshard; 8 s more. Returns (the
    reshard's wall time, its start and end by the clock and in the run's elapsed time)."""
    train = subprocess.Popen(
        [f"{BUILD}/tessera-train", f"--coordinator={coordinator}", "--client_mode=smart",
         "--steps=1000000", "--log_every=5", f"--batch_size={BATCH}", "--held_out=0",
         f"--metrics_out={metrics}", f"--vocabulary={'hashed' if fixed else 'dynamic'}"],
        stdout=subprocess.DEVNULL, stderr=log)
    procs.append(train)
    while not records(metrics) or records(metrics)[-1]["elapsed_s"] < 8:
        time.sleep(0.2)
    start_at = records(metrics)[-1]["elapsed_s"]
    t0 = time.time()
    out = subprocess.run([f"{BUILD}/tessera-cli", f"--coordinator={coordinator}", "reshard",
                          f"--shards={','.join(shards)}"], capture_output=True, text=True)
    took = time.time() - t0
    print(out.stdout.strip() or out.stderr.strip(), flush=True)
    t1 = time.time()
    end_at = records(metrics)[-1]["elapsed_s"]
    while records(metrics)[-1]["elapsed_s"] < end_at + 8:
        time.sleep(0.2)
    train.kill()
    return took, (t0, t1), (start_at, end_at)


def report(recs, took, clock, elapsed, pusher):
    (t0, t1), (start_at, end_at) = clock, elapsed
    b, d, a = (rate(recs, start_at - 6, start_at), rate(recs, start_at, end_at + 0.5),
               rate(recs, end_at + 1, end_at + 7))
    print(f"reshard wall time {took:.1f} s; training samples/s: before {b:.0f}, during "
          f"{d:.0f} ({d / b:.2f}x), after {a:.0f} ({a / b:.2f}x)")
    if PUSH_ROWS > 0:
        pb, pd, pa = pusher.rate(t0 - 6, t0), pusher.rate(t0, t1), pusher.rate(t1 + 1, t1 + 7)
        print(f"big-table pushes, rows/s: before {pb:.0f}, during {pd:.0f} ({pd / pb:.2f}x), "
              f"after {pa:.0f} ({pa / pb:.2f}x)")
    slowest = max(r2["elapsed_s"] - r1["elapsed_s"] for r1, r2 in zip(recs, recs[1:]))
    print(f"longest gap between progress records (5 steps): {slowest:.2f} s")


def main():
    root = tempfile.mkdtemp(prefix="reshard-bench-")
    log = sys.stderr if os.environ.get("RESHARD_LOG") else open(os.path.join(root, "servers.log"), "w")
    procs = []
    try:
        # RESHARD_DATA_DIRS=1: every shard on a data directory (CHECKPOINT tables).
        durable = os.environ.get("RESHARD_DATA_DIRS") == "1"
        fixed = os.environ.get("RESHARD_FIXED") == "1"

        def big_id(i):  # the big table's id of row i
            return i if fixed else i * 7919 + 13

        shards, third, coordinator = start_cluster(root, log, durable, procs)
        c = tessera.connect(coordinator)
        import_big_table(c, big_id, fixed)
        stride = max(1, ROWS // 10000)
        probe = big_id(np.arange(0, ROWS, stride, dtype=np.int64))
        before = c.lookup("big.t", probe, read_only=True)
        pusher = Pusher(coordinator, big_id, stride)
        metrics = os.path.join(root, "train.jsonl")
        took, clock, elapsed = reshard_while_training(coordinator, shards + [third], metrics,
                                                      fixed, log, procs)
        pusher.join()
        report(records(metrics), took, clock, elapsed, pusher)
        per = sorted((t.shard_index, t.rows) for t in c.stats("big.t").tables)
        after = c.lookup("big.t", probe, read_only=True)
        print(f"rows per shard: {[r for _, r in per]} (sum {sum(r for _, r in per)}); "
              f"sampled rows equal: {np.array_equal(before, after)}")
    finally:
        for p in procs:
            p.kill()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
