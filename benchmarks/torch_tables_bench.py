"""examples/python/torch_dlrm.py on Tessera's tables in the process (--tables=local) against
the same script on torch.nn.EmbeddingBag tables (--tables=torch), taking turns, with the
dense model alone (its forward, backward and Adam step on the same batches, no tables)
as the ceiling, measured in the same run:

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/torch_tables_bench.py \\
        --data=/tmp/clicks.tsv [--rounds 3] [--batch_size 256]

(--make_data=N writes N lines there first, as torch_dlrm.py --make_data does.) Prints each
run's samples/s and AUC, then the medians and local / torch, local / dense alone.
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "python", "torch_dlrm.py")


def run_example(args, tables):
    out = subprocess.run(
        ["/usr/bin/python3", EXAMPLE, f"--tables={tables}", f"--data={args.data}",
         f"--batch_size={args.batch_size}", "--log_every=0"],
        capture_output=True, text=True, check=True).stdout
    rate = float(re.search(r"\(([0-9]+) samples/s\)", out).group(1))
    auc = float(re.search(r"auc ([0-9.]+)", out).group(1))
    return rate, auc


def dense_alone(args):
    """samples/s of the dense model's steps on the file's batches, pooled embeddings given."""
    sys.path.insert(0, os.path.dirname(EXAMPLE))
    import torch_dlrm
    torch.manual_seed(args.seed)
    (y, x, ids), _ = torch_dlrm.read(args.data)
    dense = torch_dlrm.Dense()
    opt = torch.optim.Adam(dense.parameters(), lr=2e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    pooled = torch.randn(args.batch_size, torch_dlrm.NUM_SPARSE, torch_dlrm.DIM) * 0.05
    order = np.random.default_rng(args.seed).permutation(len(y))
    start = time.time()
    samples = 0
    for b in range(0, len(y), args.batch_size):
        sel = order[b:b + args.batch_size]
        p = pooled[:len(sel)].clone().requires_grad_(True)
        loss = loss_fn(dense(torch.from_numpy(x[sel]), p), torch.from_numpy(y[sel]))
        opt.zero_grad()
        loss.backward()
        opt.step()
        samples += len(sel)
    return samples / (time.time() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--make_data", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.make_data:
        subprocess.run(["/usr/bin/python3", EXAMPLE, f"--make_data={args.make_data}",
                        f"--data={args.data}"], check=True)
    rates = {"torch": [], "local": [], "dense alone": []}
    aucs = {"torch": [], "local": []}
    for r in range(args.rounds):
        for tables in ("torch", "local") if r % 2 == 0 else ("local", "torch"):
            rate, auc = run_example(args, tables)
            rates[tables].append(rate)
            aucs[tables].append(auc)
            print(f"round {r}: --tables={tables}: {rate:.0f} samples/s, auc {auc:.5f}", flush=True)
        rate = dense_alone(args)
        rates["dense alone"].append(rate)
        print(f"round {r}: dense alone: {rate:.0f} samples/s", flush=True)
    median = {k: statistics.median(v) for k, v in rates.items()}
    print(f"medians: torch {median['torch']:.0f}, local {median['local']:.0f}, dense alone "
          f"{median['dense alone']:.0f} samples/s; local / torch "
          f"{median['local'] / median['torch']:.2f}x, local / dense alone "
          f"{median['local'] / median['dense alone']:.2f}x, torch / dense alone "
          f"{median['torch'] / median['dense alone']:.2f}x; auc local "
          f"{statistics.median(aucs['local']):.5f}, torch {statistics.median(aucs['torch']):.5f}")


if __name__ == "__main__":
    main()
