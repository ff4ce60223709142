"""tessera.torch under DistributedDataParallel: 2 processes (gloo backend, 127.0.0.1)
train one model against a running cluster. Each process looks up and pushes its own
batches through its own client (grad_scale = 1/2, so the two pushes of a step add up to
the gradient of the mean loss over both batches); DDP averages the dense gradients. The
processes must end with the same dense parameters, having trained the tables.

    PYTHONPATH=build/python /usr/bin/python3 python/tests/torch_ddp_check.py HOST:PORT
"""
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import tessera
import tessera.torch as ttorch

WORLD = 2
STEPS = 30
TABLES = ["ddp.a", "ddp.b"]


def run(rank, address, port, results):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    client = tessera.connect(address)
    emb = ttorch.EmbeddingCollection(client, TABLES, grad_scale=1.0 / WORLD)
    torch.manual_seed(1)  # the same initial dense model on both
    dense = torch.nn.Sequential(torch.nn.Linear(2 * 8, 16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 1))
    model = torch.nn.parallel.DistributedDataParallel(dense)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    rng = np.random.default_rng(100 + rank)  # each process its own batches
    losses = []
    for step in range(STEPS):
        feats = {}
        for name in TABLES:
            ids = rng.integers(0, 200, size=64)
            feats[name] = (ids, np.arange(0, 65, 4))
        labels = torch.from_numpy((rng.random(16) < 0.5).astype(np.float32))
        opt.zero_grad()
        pooled = emb(feats, step=step)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            model(pooled.flatten(1)).squeeze(1), labels)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in dense.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(WORLD)]
    dist.all_gather(gathered, flat)
    results[rank] = (bool(torch.equal(gathered[0], gathered[1])), emb.pushed_rows,
                     float(np.mean(losses[-5:])))
    dist.destroy_process_group()


def main():
    address = sys.argv[1]
    client = tessera.connect(address)
    for name in TABLES:
        client.create_table(name, dim=8, optimizer="adagrad", learning_rate=0.05)
    before = [client.lookup(n, np.arange(200), read_only=True) for n in TABLES]
    with socket.socket() as s:  # a free port for the process group's rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(run, args=(address, port, results), nprocs=WORLD, join=True)
    assert set(results.keys()) == set(range(WORLD)), dict(results)
    for rank in range(WORLD):
        same, pushed, loss = results[rank]
        assert same, f"rank {rank}: the processes' dense parameters differ"
        assert pushed > 0, f"rank {rank} pushed nothing"
        assert np.isfinite(loss), loss
    after = [client.lookup(n, np.arange(200), read_only=True) for n in TABLES]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after)), "tables not trained"
    print(f"ddp: {WORLD} processes, one dense model, "
          f"{sum(results[r][1] for r in range(WORLD))} rows pushed")


if __name__ == "__main__":
    main()
