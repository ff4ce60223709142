"""DLRM in PyTorch with its embedding tables on Tessera, trained on a Criteo-format TSV.

    deploy/local/cluster.sh start 2
    PYTHONPATH=build/python /usr/bin/python3 examples/python/torch_dlrm.py --make_data=200000 \\
        --data=/tmp/clicks.tsv                        # writes a TSV with a planted teacher
    PYTHONPATH=build/python /usr/bin/python3 examples/python/torch_dlrm.py \\
        --coordinator=127.0.0.1:7000 --data=/tmp/clicks.tsv [--epochs N] [--batch_size B]
    # the same model with torch.nn.EmbeddingBag tables, for comparison:
    PYTHONPATH=build/python /usr/bin/python3 examples/python/torch_dlrm.py --tables=torch \\
        --data=/tmp/clicks.tsv
    # Tessera's tables in this process (tessera.local: no server), optionally kept in a
    # directory (--local_dir):
    PYTHONPATH=build/python /usr/bin/python3 examples/python/torch_dlrm.py --tables=local \\
        --data=/tmp/clicks.tsv

The model has tessera-train's default shape: bottom MLP 13 -> 64 -> 32 -> 16, pairwise dot
interaction of its output with the 26 pooled embeddings, top MLP 367 -> 64 -> 32 -> 1,
binary cross-entropy; Adagrad (lr 0.05) on the tables, Adam (lr 0.002) on the dense
parameters. Lines: label, 13 integers (log(1 + max(x, 0)), empty = 0), 26 hexadecimal
categoricals (the value is the row id in its feature's table; empty = a "missing" id),
tab-separated, plain or gzip. Every 10th line (line numbers 10, 20, ...) is held out for
evaluation. Prints samples/s while it trains and, at the end,
`held-out: N samples  logloss X  auc Y`. --device moves the dense model (cuda where
present).
"""
import argparse
import gzip
import math
import sys
import time

import numpy as np
import torch

NUM_DENSE = 13
NUM_SPARSE = 26
DIM = 16
MISSING = -1  # the id of an empty categorical


def open_text(path, mode="rt"):
    return gzip.open(path, mode) if path.endswith(".gz") else open(path, mode)


def make_data(path, lines, seed=1):
    """A Criteo-format TSV from a planted teacher: Zipf-popular categories per feature,
    each with a weight, a few dense columns that matter; labels drawn from the teacher."""
    rng = np.random.default_rng(seed)
    vocab = rng.integers(200, 5000, size=NUM_SPARSE)
    weights = [rng.normal(0, 0.6, size=v) for v in vocab]
    dense_w = rng.normal(0, 0.3, size=NUM_DENSE)
    with open_text(path, "wt") as out:
        for start in range(0, lines, 10000):
            n = min(10000, lines - start)
            cats = np.stack([np.minimum(rng.zipf(1.2, size=n) - 1, v - 1) for v in vocab], 1)
            ints = rng.geometric(0.05, size=(n, NUM_DENSE)) - 1
            logit = -1.0 + np.log1p(ints) @ dense_w * 0.3
            logit = logit + sum(weights[f][cats[:, f]] for f in range(NUM_SPARSE))
            label = rng.random(n) < 1.0 / (1.0 + np.exp(-logit))
            empty = rng.random((n, NUM_DENSE)) < 0.1
            for i in range(n):
                dense = ["" if empty[i, j] else str(ints[i, j]) for j in range(NUM_DENSE)]
                sparse = [f"{(f * 0x9E3779B1 + int(cats[i, f]) * 2654435761) & 0xffffffff:08x}"
                          for f in range(NUM_SPARSE)]
                out.write("\t".join([str(int(label[i]))] + dense + sparse) + "\n")
    print(f"wrote {lines} lines to {path}")


def read(path):
    """(train, held_out): each (labels, dense (n, 13), ids (n, 26) int64)."""
    labels, dense, ids, held = [], [], [], []
    bad = 0
    with open_text(path) as f:
        for number, line in enumerate(f, 1):
            cols = line.rstrip("\n").split("\t")
            if len(cols) != 1 + NUM_DENSE + NUM_SPARSE or cols[0] not in ("0", "1"):
                bad += 1
                continue
            try:
                d = [math.log1p(max(int(c), 0)) if c else 0.0 for c in cols[1:1 + NUM_DENSE]]
                s = [int(c, 16) if c else MISSING for c in cols[1 + NUM_DENSE:]]
            except ValueError:
                bad += 1
                continue
            labels.append(float(cols[0]))
            dense.append(d)
            ids.append(s)
            held.append(number % 10 == 0)
    if bad:
        print(f"data: skipped {bad} malformed line(s)")
    labels = np.array(labels, dtype=np.float32)
    dense = np.array(dense, dtype=np.float32).reshape(-1, NUM_DENSE)
    ids = np.array(ids, dtype=np.int64).reshape(-1, NUM_SPARSE)
    held = np.array(held, dtype=bool)
    split = lambda m: (labels[m], dense[m], ids[m])
    return split(~held), split(held)


class Dense(torch.nn.Module):
    """DLRM's dense half: bottom MLP, pairwise dot interaction, top MLP."""

    def __init__(self):
        super().__init__()
        self.bottom = torch.nn.Sequential(
            torch.nn.Linear(NUM_DENSE, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
            torch.nn.ReLU(), torch.nn.Linear(32, DIM), torch.nn.ReLU())
        pairs = (NUM_SPARSE + 1) * NUM_SPARSE // 2
        self.top = torch.nn.Sequential(
            torch.nn.Linear(DIM + pairs, 64), torch.nn.ReLU(), torch.nn.Linear(64, 32),
            torch.nn.ReLU(), torch.nn.Linear(32, 1))
        rows, cols = torch.tril_indices(NUM_SPARSE + 1, NUM_SPARSE + 1, offset=-1)
        self.register_buffer("rows", rows)
        self.register_buffer("cols", cols)

    def forward(self, dense, pooled):  # pooled: (B, 26, dim)
        x = self.bottom(dense)
        v = torch.cat([x.unsqueeze(1), pooled], dim=1)  # (B, 27, dim)
        dots = torch.bmm(v, v.transpose(1, 2))[:, self.rows, self.cols]
        return self.top(torch.cat([x, dots], dim=1)).squeeze(1)


class TorchTables(torch.nn.Module):
    """The baseline: one torch.nn.EmbeddingBag per feature, ids mapped to rows in order of
    first sight (no collisions, as Tessera's 64-bit ids), Adagrad on sparse gradients."""

    def __init__(self, ids, device):
        super().__init__()
        self.maps = [dict((v, i) for i, v in enumerate(np.unique(ids[:, f])))
                     for f in range(NUM_SPARSE)]
        self.tables = torch.nn.ModuleList()
        for m in self.maps:
            bag = torch.nn.EmbeddingBag(len(m) + 1, DIM, mode="sum", sparse=True)
            torch.nn.init.uniform_(bag.weight, -0.05, 0.05)
            self.tables.append(bag)
        self.device = device

    def forward(self, ids):
        out = []
        offsets = torch.arange(len(ids), device=self.device)
        for f, bag in enumerate(self.tables):
            m = self.maps[f]
            rows = torch.tensor([m.get(v, len(m)) for v in ids[:, f]], device=self.device)
            out.append(bag(rows, offsets))
        return torch.stack(out, dim=1)


def auc(labels, scores):
    """Exact ROC AUC (ties share their average rank)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = labels > 0.5
    n_pos, n_neg = pos.sum(), (~pos).sum()
    if n_pos == 0 or n_neg == 0:
        return 0.5
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--coordinator", default="", help="host:port (with --tables=tessera)")
    parser.add_argument("--data", required=True, help="Criteo-format TSV (plain or .gz)")
    parser.add_argument("--make_data", type=int, default=0,
                        help="write this many lines of planted-teacher data to --data and stop")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--tables", choices=("tessera", "local", "torch"), default="tessera",
                        help="tessera: a cluster's (--coordinator); local: Tessera's tables "
                             "in this process; torch: torch.nn.EmbeddingBag")
    parser.add_argument("--local_dir", default="",
                        help="with --tables=local: keep the tables in this directory")
    parser.add_argument("--model", default="torchdlrm", help="Tessera tables: MODEL.C1..C26")
    parser.add_argument("--device", default="cpu", help="where the dense model runs (cpu, cuda)")
    parser.add_argument("--log_every", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--continue_tables", action="store_true",
                        help="train on tables a previous run trained (refused otherwise)")
    return parser.parse_args()


def tessera_tables(args, device):
    """The model's tables on the cluster of --coordinator, or in this process
    (--tables=local): (module, its bag lookup, no optimizer of its own: the tables apply
    the rows' updates, where they are)."""
    names = [f"{args.model}.C{f + 1}" for f in range(NUM_SPARSE)]
    import tessera
    import tessera.torch as ttorch
    if args.tables == "local":
        client = tessera.local(data_dir=args.local_dir or None)
        where = "Tessera tables in this process" + (
            f" (kept in {args.local_dir})" if args.local_dir else "")
    elif not args.coordinator:
        sys.exit("--tables=tessera needs --coordinator=HOST:PORT")
    else:
        client = tessera.connect(args.coordinator)
        where = f"Tessera tables via {args.coordinator}"
    # A previous run's tables without its dense model: refuse, as tessera-train does.
    trained = client.trained_rows(names)
    if trained and not args.continue_tables:
        sys.exit(f"model '{args.model}': {len(trained)} of its tables hold a previous "
                 f"run's training ({sum(trained.values())} rows), and this example keeps "
                 f"no checkpoint of its dense model; drop them (tessera-cli drop "
                 f"--model={args.model}), pick another --model, or pass --continue_tables "
                 f"to train a new dense model on them")
    if trained:
        print(f"model '{args.model}': continuing on a previous run's tables "
              f"({sum(trained.values())} rows)")
    emb = ttorch.EmbeddingCollection(
        client, [{"name": n, "dim": DIM, "optimizer": "adagrad", "learning_rate": 0.05,
                  "seed": args.seed * 1000 + i, "init_scale": 0.05}
                 for i, n in enumerate(names)], device=device)
    embed = lambda batch_ids: emb({n: (batch_ids[:, f], np.arange(len(batch_ids) + 1))
                                   for f, n in enumerate(names)})
    return emb, embed, None, where


def train(args, dense, emb, embed, sparse_opt, y, x, ids, device):
    """--epochs over the training samples in batches; prints progress and the rate."""
    dense_opt = torch.optim.Adam(dense.parameters(), lr=2e-3)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(args.seed)
    start = window = time.time()
    samples = window_samples = step = 0
    losses = []
    for epoch in range(args.epochs):
        order = rng.permutation(len(y))
        for b in range(0, len(y), args.batch_size):
            sel = order[b:b + args.batch_size]
            emb.train()
            pooled = embed(ids[sel])
            logits = dense(torch.from_numpy(x[sel]).to(device), pooled)
            loss = loss_fn(logits, torch.from_numpy(y[sel]).to(device))
            dense_opt.zero_grad()
            if sparse_opt is not None:
                sparse_opt.zero_grad()
            loss.backward()
            dense_opt.step()
            if sparse_opt is not None:
                sparse_opt.step()
            step += 1
            samples += len(sel)
            window_samples += len(sel)
            losses.append(loss.item())
            if args.log_every and step % args.log_every == 0:
                now = time.time()
                print(f"step {step}  samples/s {window_samples / (now - window):.0f}  "
                      f"loss {np.mean(losses[-args.log_every:]):.5f}", flush=True)
                window, window_samples = now, 0
    seconds = time.time() - start
    print(f"trained {step} steps, {samples} samples in {seconds:.1f}s "
          f"({samples / seconds:.0f} samples/s)")


def evaluate(dense, emb, embed, hy, hx, hids, device):
    """Prints the held-out logloss and AUC."""
    emb.eval()
    dense.eval()
    probs = []
    with torch.no_grad():
        for b in range(0, len(hy), 4096):
            logits = dense(torch.from_numpy(hx[b:b + 4096]).to(device), embed(hids[b:b + 4096]))
            probs.append(torch.sigmoid(logits).cpu().numpy())
    if not len(hy):
        print("held-out: 0 samples (none held out: no logloss or auc)")
        return
    p = np.clip(np.concatenate(probs).astype(np.float64), 1e-7, 1 - 1e-7)
    logloss = float(-np.mean(hy * np.log(p) + (1 - hy) * np.log(1 - p)))
    print(f"held-out: {len(hy)} samples  logloss {logloss:.5f}  auc {auc(hy, p):.5f}")


def main():
    args = parse_args()
    if args.make_data:
        make_data(args.data, args.make_data, args.seed)
        return
    if args.epochs < 1 or args.batch_size < 1:
        sys.exit("--epochs and --batch_size must be >= 1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit(f"--device={args.device}: this PyTorch has no usable CUDA device")
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    (y, x, ids), (hy, hx, hids) = read(args.data)
    if len(y) == 0:
        sys.exit(f"no training line in {args.data}")
    print(f"data: {args.data}, {len(y)} training and {len(hy)} held-out samples, "
          f"{args.epochs} epoch(s) of batches of {args.batch_size}")

    dense = Dense().to(device)
    if args.tables in ("tessera", "local"):
        emb, embed, sparse_opt, where = tessera_tables(args, device)
    else:
        emb = TorchTables(np.concatenate([ids, hids]), device).to(device)
        embed = emb
        sparse_opt = torch.optim.Adagrad(emb.parameters(), lr=0.05, eps=1e-10)
        where = "torch.nn.EmbeddingBag tables"
    print(f"model: dlrm (PyTorch, dense on {device}), {where}")
    train(args, dense, emb, embed, sparse_opt, y, x, ids, device)
    evaluate(dense, emb, embed, hy, hx, hids, device)


if __name__ == "__main__":
    main()
