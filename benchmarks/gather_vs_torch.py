"""The table's gather against PyTorch's on the same rows and ids, in one process, one
thread each: Tessera's tables (tessera._core, as tessera.local holds them) beside
torch.nn.functional.embedding_bag (mode "sum", one id a bag: on the CPU it runs FBGEMM's
embedding kernel) and torch.nn.functional.embedding ("none"), the best of which is the
ceiling the table is measured against.

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/gather_vs_torch.py [--dims 16,64]
        [--ids uniform,zipf] [--kinds dynamic,fixed] [--seconds 2] [--bytes B]

Rows span eight times the last-level cache (at least 1 GiB; TESSERA_BENCH_LLC_BYTES
overrides the cache size, as for tessera-embedding-benchmark), batches of 4,096 ids
uniform or Zipf(1.05) over them (popular ranks spread over the id space), enough batches
that their rows span the same. The table and torch take turns batch by batch, so that a
shared machine's drifts fall on both, each op on a batch of its own (the two torch ops read
one tensor: on the same ids, the second would find its rows in the cache). Prints one line per case and, with --json, writes
them: rows/s of the table, of torch's sum and none, and table / best torch.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch

from tessera import _core
from tessera.tables import table_config

BATCH = 4096
MIN_BYTES = 1 << 30


def llc_bytes() -> int:
    if os.environ.get("TESSERA_BENCH_LLC_BYTES"):
        return int(os.environ["TESSERA_BENCH_LLC_BYTES"])
    # What sysconf(_SC_LEVEL3_CACHE_SIZE) answers tessera-embedding-benchmark.
    try:
        size = int(subprocess.run(["getconf", "LEVEL3_CACHE_SIZE"], capture_output=True,
                                  text=True, check=True).stdout.strip() or 0)
    except (OSError, ValueError, subprocess.CalledProcessError):
        size = 0
    return size if size > 0 else 32 << 20


def make_ids(rows: int, zipf: bool, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if not zipf:
        return rng.integers(0, rows, size=count, dtype=np.int64)
    # Zipf(1.05) ranks over [1, rows] by inverting the continuous CDF, spread over the ids
    # as feature hashes are (a multiplicative hash, as the C++ benchmark's).
    s = 1.05
    u = rng.random(count)
    h = (rows ** (1 - s) - 1) / (1 - s)
    ranks = np.floor((1 + u * h * (1 - s)) ** (1 / (1 - s))).astype(np.uint64)
    ranks = np.minimum(np.maximum(ranks, 1), rows) - np.uint64(1)
    return ((ranks * np.uint64(0x9E3779B97F4A7C15)) % np.uint64(rows)).astype(np.int64)


def build(kind: str, dim: int, rows: int):
    """A table of `rows` rows (ids 0..rows-1, stored), and the same rows as a tensor."""
    tables = _core.Tables("", 1, 1, -1)  # one partition, one thread, no memory budget
    config = table_config("bench.t", dim, optimizer="sgd", learning_rate=0.01,
                          vocabulary_size=rows if kind == "fixed" else 0)
    tables.create_table(config.SerializeToString())
    weight = torch.empty(rows, dim, dtype=torch.float32)
    chunk = 1 << 16
    zeros = np.zeros((chunk, dim), dtype=np.float32)
    for begin in range(0, rows, chunk):
        ids = np.arange(begin, min(rows, begin + chunk), dtype=np.int64)
        # A fixed vocabulary stores a row on its first update (zero gradients: SGD leaves
        # it as it was); a dynamic table on lookup.
        tables.push_many([("bench.t", ids, zeros[:len(ids)])], 0)
        weight[begin:begin + len(ids)] = torch.from_numpy(tables.lookup("bench.t", ids, True))
    return tables, weight


def measure(tables, weight, batches, seconds: float):
    """rows/s of the table, torch's embedding_bag sum and torch's embedding, taking turns."""
    offsets = torch.arange(BATCH, dtype=torch.int64)
    tensors = [torch.from_numpy(b) for b in batches]
    ops = {
        "table": lambda i: tables.lookup("bench.t", batches[i], True),
        "torch_sum": lambda i: torch.nn.functional.embedding_bag(
            tensors[i], weight, offsets, mode="sum"),
        "torch_none": lambda i: torch.nn.functional.embedding(tensors[i], weight),
    }
    # Each op reads its own batch of a round, a third of the batches away from the others':
    # two ops reading the same ids one after the other would find the second's rows (the
    # two torch ops share a tensor) still in the cache.
    shift = {name: k * len(batches) // len(ops) for k, name in enumerate(ops)}
    spent = dict.fromkeys(ops, 0.0)
    done = 0
    with torch.no_grad():
        for i in range(len(batches)):  # a warm-up round
            for op in ops.values():
                op(i)
        until = time.perf_counter() + seconds * len(ops)
        i = 0
        while time.perf_counter() < until:
            order = list(ops) if done % 2 == 0 else list(reversed(ops))
            for name in order:
                t0 = time.perf_counter()
                ops[name]((i + shift[name]) % len(batches))
                spent[name] += time.perf_counter() - t0
            done += 1
            i = (i + 1) % len(batches)
    return {name: done * BATCH / spent[name] for name in ops}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dims", default="16,64")
    parser.add_argument("--ids", default="uniform,zipf")
    parser.add_argument("--kinds", default="dynamic,fixed")
    parser.add_argument("--seconds", type=float, default=2.0, help="of each op, each case")
    parser.add_argument("--json", default="", help="write the results here")
    parser.add_argument("--bytes", type=int, default=0,
                        help="bytes of rows a table (0: 8x the last-level cache, >= 1 GiB)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    budget = args.bytes or max(8 * llc_bytes(), MIN_BYTES)
    results = []
    size = f"{budget / 2**30:.2f} GiB" if budget >= 2**30 else f"{budget / 2**20:.1f} MiB"
    print(f"rows of {size} a table"
          f"{'' if args.bytes else ' (8x the last-level cache, at least 1 GiB)'}; "
          f"batches of {BATCH} ids; one thread each")
    for dim in (int(d) for d in args.dims.split(",")):
        rows = budget // (dim * 4)
        count = max(4 if args.bytes else 64, budget // (BATCH * dim * 4))
        for kind in args.kinds.split(","):
            tables, weight = build(kind, dim, rows)
            for ids in args.ids.split(","):
                batches = np.split(make_ids(rows, ids == "zipf", BATCH * count, 1), count)
                rate = measure(tables, weight, batches, args.seconds)
                best = max(rate["torch_sum"], rate["torch_none"])
                row = {"dim": dim, "kind": kind, "ids": ids, "rows": rows,
                       "table_rows_per_s": rate["table"], "torch_sum_rows_per_s": rate["torch_sum"],
                       "torch_none_rows_per_s": rate["torch_none"],
                       "vs_torch": rate["table"] / best}
                results.append(row)
                print(f"dim {dim:3d} {kind:7s} {ids:7s}: table {rate['table'] / 1e6:6.2f}M rows/s "
                      f"({rate['table'] * dim * 4 / 1e9:5.2f} GB/s), torch sum "
                      f"{rate['torch_sum'] / 1e6:6.2f}M, none {rate['torch_none'] / 1e6:6.2f}M: "
                      f"{row['vs_torch']:.2f}x the best", flush=True)
            del tables, weight
    if args.json:
        with open(args.json, "w") as out:
            json.dump(results, out, indent=1)


if __name__ == "__main__":
    sys.exit(main())
