"""tessera.torch against a running cluster: the gradients the module pushes equal those
torch.nn.EmbeddingBag computes for the same model and batch (sum and mean pooling,
per-id weights, repeated ids); 200 training steps through the module equal the same
model trained with EmbeddingBag tables and the same row-wise optimizer written in torch
(SGD and Adagrad) within 1e-5; eval mode creates no rows and pushes nothing. The same
checks over tables in this process (tessera.local), and a model trained on both equal bit
for bit.

    PYTHONPATH=build/python /usr/bin/python3 python/tests/torch_check.py HOST:PORT
"""
import sys

import numpy as np
import torch

import tessera
import tessera.torch as ttorch

DIM = 4
VOCAB = 40
EPS = 1e-10  # Tessera's Adagrad epsilon


class Spy:
    """The client, recording every push."""

    def __init__(self, client):
        self.client = client
        self.pushes = []
        self.batches = 0  # push calls (one per step when batched)

    def __getattr__(self, name):
        return getattr(self.client, name)

    def push(self, table, ids, gradients, step=0, request_id=None):
        self.pushes.append((table, np.array(ids), np.array(gradients), step))
        self.batches += 1
        return self.client.push(table, ids, gradients, step=step, request_id=request_id)

    def push_many(self, pushes, step=0, request_id=None, after_lookup=False):
        for table, (ids, gradients) in pushes.items():
            self.pushes.append((table, np.array(ids), np.array(gradients), step))
        self.batches += 1
        return self.client.push_many(pushes, step=step, request_id=request_id,
                                     after_lookup=after_lookup)


def batch(rng, bags=16, max_len=4):
    """ids (Zipf-ish over the vocabulary: repeats within a batch), CSR offsets, weights."""
    lengths = rng.integers(1, max_len + 1, size=bags)
    ids = np.minimum(rng.zipf(1.3, size=int(lengths.sum())) - 1, VOCAB - 1).astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    weights = rng.uniform(0.5, 1.5, size=len(ids)).astype(np.float32)
    return ids, offsets, weights


def reference_tables(client, names, mode):
    """EmbeddingBag tables starting from the Tessera tables' initial rows."""
    tables = {}
    for name in names:
        initial = client.lookup(name, np.arange(VOCAB), read_only=True)
        bag = torch.nn.EmbeddingBag(VOCAB, DIM, mode=mode)
        with torch.no_grad():
            bag.weight.copy_(torch.from_numpy(initial))
        tables[name] = bag
    return tables


def check_gradients(client, prefix):
    rng = np.random.default_rng(7)
    for mode, weighted in (("sum", False), ("mean", False), ("sum", True), ("sqrtn", False)):
        names = [f"{prefix}.{mode}{int(weighted)}.a", f"{prefix}.{mode}{int(weighted)}.b"]
        spy = Spy(client)
        module = ttorch.EmbeddingCollection(
            spy, [{"name": n, "dim": DIM, "optimizer": "sgd", "learning_rate": 1e-3}
                  for n in names], pooling=mode)
        # EmbeddingBag has no sqrtn: its sum, times 1 / sqrt(count) per bag, is the reference.
        ref = reference_tables(client, names, "sum" if mode == "sqrtn" else mode)
        feats, ref_out = {}, []
        for n in names:
            ids, offsets, weights = batch(rng)
            feats[n] = (ids, offsets, weights) if weighted else (ids, offsets)
            pooled = ref[n](torch.from_numpy(ids), torch.from_numpy(offsets[:-1]),
                            per_sample_weights=torch.from_numpy(weights) if weighted else None)
            if mode == "sqrtn":
                scale = tessera.checks.sqrtn_scale(np.diff(offsets))
                pooled = pooled * torch.from_numpy(scale)[:, None]
            ref_out.append(pooled)
        out = module(feats)
        want = torch.stack(ref_out, dim=1)
        assert out.shape == want.shape, (out.shape, want.shape)
        assert torch.allclose(out, want, atol=1e-6), f"{mode} weighted={weighted}: forward differs"
        # Any loss that weighs every output differently.
        coef = torch.from_numpy(rng.normal(size=tuple(out.shape)).astype(np.float32))
        (out * coef).sum().backward()
        (want * coef).sum().backward()
        assert len(spy.pushes) == 2 and spy.batches == 1, \
            f"expected one batched push of both tables, got {spy.batches} of {len(spy.pushes)}"
        for table, ids, grads, step in spy.pushes:
            assert step == 0, step
            assert len(np.unique(ids)) == len(ids), "a push repeats an id"
            expected = ref[table].weight.grad[torch.from_numpy(ids)].numpy()
            # The same sums in another order: equal to float rounding.
            err = np.abs(grads - expected).max() / max(1.0, np.abs(expected).max())
            assert err < 1e-6, f"{table} ({mode}, weighted={weighted}): gradients differ by {err}"
            untouched = np.setdiff1d(np.arange(VOCAB), ids)
            assert not ref[table].weight.grad[torch.from_numpy(untouched)].any(), \
                "the reference touched rows the module did not push"
    print("gradients: equal to EmbeddingBag's (sum, mean, sqrtn, weighted; repeated ids)")


def train(client, prefix, optimizer, steps=200, lr=0.1):
    names = [f"{prefix}.{optimizer}.a", f"{prefix}.{optimizer}.b"]
    module = ttorch.EmbeddingCollection(
        client, [{"name": n, "dim": DIM, "optimizer": optimizer, "learning_rate": lr}
                 for n in names])
    ref = reference_tables(client, names, "sum")
    acc = {n: torch.zeros(VOCAB, DIM) for n in names}
    torch.manual_seed(3)
    dense = torch.nn.Sequential(torch.nn.Linear(2 * DIM, 8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 1))
    dense_ref = torch.nn.Sequential(torch.nn.Linear(2 * DIM, 8), torch.nn.ReLU(),
                                    torch.nn.Linear(8, 1))
    dense_ref.load_state_dict(dense.state_dict())
    opt = torch.optim.SGD(dense.parameters(), lr=0.05)
    opt_ref = torch.optim.SGD(dense_ref.parameters(), lr=0.05)
    loss_fn = torch.nn.BCEWithLogitsLoss()
    rng = np.random.default_rng(11)
    for _ in range(steps):
        feats = {n: batch(rng)[:2] for n in names}
        labels = torch.from_numpy(rng.integers(0, 2, size=16).astype(np.float32))
        # Through Tessera.
        opt.zero_grad()
        pooled = module(feats)
        loss = loss_fn(dense(pooled.flatten(1)).squeeze(1), labels)
        loss.backward()
        opt.step()
        # The same model in torch, its row-wise optimizer by hand.
        opt_ref.zero_grad()
        for n in names:
            ref[n].weight.grad = None
        pooled_ref = torch.stack([ref[n](torch.from_numpy(feats[n][0]),
                                         torch.from_numpy(feats[n][1][:-1])) for n in names], 1)
        loss_ref = loss_fn(dense_ref(pooled_ref.flatten(1)).squeeze(1), labels)
        loss_ref.backward()
        opt_ref.step()
        with torch.no_grad():
            for n in names:
                g = ref[n].weight.grad
                if optimizer == "sgd":
                    ref[n].weight -= lr * g
                else:
                    acc[n] += g * g
                    ref[n].weight -= lr * g / (torch.sqrt(acc[n]) + EPS)
    worst = 0.0
    for n in names:
        rows = client.lookup(n, np.arange(VOCAB), read_only=True)
        worst = max(worst, float(np.abs(rows - ref[n].weight.detach().numpy()).max()))
    for p, q in zip(dense.parameters(), dense_ref.parameters()):
        worst = max(worst, float((p - q).abs().max()))
    assert worst < 1e-5, f"{optimizer}: after {steps} steps the models differ by {worst}"
    assert module.step == steps, module.step
    print(f"{optimizer}: {steps} steps equal to EmbeddingBag + torch {optimizer} "
          f"(largest difference {worst:.2e}, loss {loss.item():.4f})")


def check_eval(client, prefix):
    name = f"{prefix}.eval"
    spy = Spy(client)
    module = ttorch.EmbeddingCollection(spy, [{"name": name, "dim": DIM, "optimizer": "sgd",
                                               "learning_rate": 0.1}])
    before = sum(t.rows for t in client.stats(name).tables)
    module.eval()
    ids = np.arange(1000, 1032, dtype=np.int64)
    offsets = np.arange(0, 33, 4, dtype=np.int64)
    out = module({name: (ids, offsets)})
    assert out.shape == (8, 1, DIM), out.shape
    assert not out.requires_grad
    after = sum(t.rows for t in client.stats(name).tables)
    assert after == before, f"eval mode created {after - before} rows"
    assert not spy.pushes and module.step == 0
    # Training mode creates them (and counts a step).
    module.train()
    module({name: (ids, offsets)}).sum().backward()
    assert sum(t.rows for t in client.stats(name).tables) == before + len(ids)
    assert len(spy.pushes) == 1 and module.step == 1
    print("eval mode: no rows created, nothing pushed")


def check_prefetch(client, prefix):
    name = f"{prefix}.prefetch"
    spy = Spy(client)
    module = ttorch.EmbeddingCollection(spy, [{"name": name, "dim": DIM, "optimizer": "sgd",
                                               "learning_rate": 0.1}])
    rng = np.random.default_rng(5)
    batches = [({name: batch(rng)[:2]}, i) for i in range(20)]
    # Read-only: rows fetched ahead are the rows a forward would read.
    module.eval()
    for (feats, i), fetched in ttorch.prefetch(module, batches, depth=2):
        assert torch.equal(module(fetched), module(feats)), f"batch {i} differs"
    # Training: every batch trained once, in order, each step pushed.
    module.train()
    seen = []
    for (feats, i), fetched in ttorch.prefetch(module, batches):
        module(fetched).sum().backward()
        seen.append(i)
    assert seen == list(range(20)), seen
    assert module.step == 20 and [p[3] for p in spy.pushes] == list(range(20))
    print("prefetch: batches in order, rows as a forward reads them")


class KeyedJagged:
    """The shape of TorchRec's KeyedJaggedTensor: keys, values, lengths (key-major)."""

    def __init__(self, keys, values, lengths, weights=None):
        self._keys, self._values, self._lengths, self._weights = keys, values, lengths, weights

    def keys(self):
        return self._keys

    def values(self):
        return self._values

    def lengths(self):
        return self._lengths

    def weights(self):
        return self._weights


def check_keyed_jagged(client, prefix):
    names = [f"{prefix}.kjt.a", f"{prefix}.kjt.b"]
    module = ttorch.EmbeddingCollection(client, [{"name": n, "dim": DIM} for n in names])
    module.eval()
    rng = np.random.default_rng(9)
    parts = {n: batch(rng) for n in names}
    values = torch.from_numpy(np.concatenate([parts[n][0] for n in names]))
    lengths = torch.from_numpy(np.concatenate([np.diff(parts[n][1]) for n in names]))
    weights = torch.from_numpy(np.concatenate([parts[n][2] for n in names]))
    got = module(KeyedJagged(names, values, lengths))
    want = module({n: parts[n][:2] for n in names})
    assert torch.equal(got, want), "a KeyedJaggedTensor reads other bags than the dict form"
    got = module(KeyedJagged(names, values, lengths, weights), as_dict=True)
    want = module(parts, as_dict=True)
    assert all(torch.equal(got[n], want[n]) for n in names), "weighted KJT differs"
    print("KeyedJaggedTensor input: the bags of the dict form")


def check_errors(client, prefix):
    name = f"{prefix}.err"
    module = ttorch.EmbeddingCollection(client, [{"name": name, "dim": DIM}])
    for bad, words in (({"other": ([1], [0, 1])}, "unknown"),
                       ({name: ([1, 2], [0, 3])}, "offsets")):
        try:
            module(bad)
        except (ValueError, tessera.TesseraError) as e:
            assert words in str(e), (words, str(e))
        else:
            raise AssertionError(f"{bad} accepted")
    for spec, words in (({"dim": DIM + 1}, f"dim: the table has {DIM}, the spec says {DIM + 1}"),
                        ({"learning_rate": 0.5}, "learning_rate: the table has 0.05"),
                        ({"optimizer": "sgd"}, "optimizer: the table has ADAGRAD, the spec says 'sgd'")):
        try:
            ttorch.EmbeddingCollection(client, [{"name": name, **spec}])
        except ValueError as e:
            assert words in str(e), (words, str(e))
        else:
            raise AssertionError(f"a mismatch accepted: {spec}")
    # The table's own settings, spelt as the proto spells them, are accepted.
    ttorch.EmbeddingCollection(client, [{"name": name, "dim": DIM, "learning_rate": 0.05,
                                         "optimizer": "ADAGRAD"}])
    print("errors: named")


def check_refused_push_is_dropped(client, prefix):
    """A backward whose gradient holds a NaN raises once; the module goes on training,
    and retry_failed_push() sends a failed push again under its request id."""
    name = f"{prefix}.nan"
    module = ttorch.EmbeddingCollection(client, [{"name": name, "dim": DIM, "optimizer": "sgd",
                                                  "learning_rate": 1.0}])
    ids, offsets = np.array([1, 2, 3]), np.array([0, 1, 3])
    before = client.lookup(name, ids, read_only=True)
    out = module({name: (ids, offsets)})
    try:
        (out * torch.tensor(float("nan"))).sum().backward()
    except tessera.TesseraError as e:
        assert "is nan; batch rejected" in e.message, e.message
    else:
        raise AssertionError("a NaN gradient was pushed")
    assert module.failed_push is not None and module.failed_push.step == 0
    np.testing.assert_array_equal(client.lookup(name, ids, read_only=True), before)
    # The next steps train: the refused gradients are not sent again.
    for _ in range(2):
        module({name: (ids, offsets)}).sum().backward()
    module.flush()
    after = client.lookup(name, ids, read_only=True)
    np.testing.assert_allclose(after, before - 2.0, rtol=1e-6, atol=1e-6)
    try:
        module.retry_failed_push()  # refused again for its content
    except tessera.TesseraError:
        pass
    else:
        raise AssertionError("a NaN push was accepted on retry")
    module.failed_push = None
    print("refused push: dropped, the module trains on")


def check_local_equals_cluster(client, prefix, weighted, steps=60):
    """The same model trained the same steps with its tables on the cluster and in this
    process (tessera.local): every row and every dense parameter equal, bit for bit.
    Unweighted bags take the local tables' fused path (pooled and summed in the core),
    weighted ones the general path."""
    kind = "weighted" if weighted else "fused"
    specs = [{"name": f"{prefix}.same.{kind}.{k}", "dim": DIM, "optimizer": opt,
              "learning_rate": 0.1, "seed": 7 + k}
             for k, opt in enumerate(("adagrad", "sgd", "adam"))]
    trained = {}
    for where, tables in (("cluster", client), ("local", tessera.local())):
        module = ttorch.EmbeddingCollection(tables, specs)
        torch.manual_seed(3)
        dense = torch.nn.Sequential(torch.nn.Linear(len(specs) * DIM, 8), torch.nn.ReLU(),
                                    torch.nn.Linear(8, 1))
        opt = torch.optim.SGD(dense.parameters(), lr=0.05)
        rng = np.random.default_rng(21)
        for _ in range(steps):
            feats = {s["name"]: batch(rng)[:3 if weighted else 2] for s in specs}
            labels = torch.from_numpy(rng.integers(0, 2, size=16).astype(np.float32))
            opt.zero_grad()
            logits = dense(module(feats).flatten(1)).squeeze(1)
            torch.nn.BCEWithLogitsLoss()(logits, labels).backward()
            opt.step()
        rows = {s["name"]: tables.lookup(s["name"], np.arange(VOCAB), read_only=True)
                for s in specs}
        trained[where] = (rows, [p.detach().clone() for p in dense.parameters()])
    for s in specs:
        name = s["name"]
        assert trained["cluster"][0][name].tobytes() == trained["local"][0][name].tobytes(), (
            f"{name} ({s['optimizer']}): local rows differ from the cluster's")
    for p, q in zip(trained["cluster"][1], trained["local"][1]):
        assert torch.equal(p, q), "the dense models differ"
    print(f"tessera.local ({kind}): {steps} steps give the cluster's rows (adagrad, sgd, "
          f"adam) and dense parameters, bit for bit")


def run_checks(client, prefix):
    check_gradients(client, prefix)
    train(client, prefix, "sgd")
    train(client, prefix, "adagrad")
    check_eval(client, prefix)
    check_prefetch(client, prefix)
    check_keyed_jagged(client, prefix)
    check_errors(client, prefix)
    check_refused_push_is_dropped(client, prefix)


def main():
    client = tessera.connect(sys.argv[1])
    prefix = "torchcheck"
    run_checks(client, prefix)
    print("tessera.torch on the cluster: ok")
    run_checks(tessera.local(), prefix)
    print("tessera.torch on tessera.local: ok")
    check_local_equals_cluster(client, prefix, weighted=False)
    check_local_equals_cluster(client, prefix, weighted=True)
    print("tessera.torch: ok")


if __name__ == "__main__":
    main()
