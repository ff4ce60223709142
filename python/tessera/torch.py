"""PyTorch modules over Tessera tables: the sparse half of a model lives on the shards,
the dense half is an ordinary torch model wherever PyTorch runs it.

    import tessera, tessera.torch
    client = tessera.connect("127.0.0.1:7000")
    emb = tessera.torch.EmbeddingCollection(client, [
        {"name": "ctr.user", "dim": 16, "optimizer": "adagrad", "learning_rate": 0.05},
        {"name": "ctr.item", "dim": 16, "optimizer": "adagrad", "learning_rate": 0.05},
    ])
    pooled = emb({"ctr.user": (ids, offsets), "ctr.item": (ids2, offsets2)})  # (B, 2, 16)
    loss = model(dense, pooled).mean()
    loss.backward()        # pushes each table's gradients, summed per unique id
    optimizer.step()       # the torch optimizer sees only the dense parameters

Forward looks up every table's distinct ids through the client in one batched request
per shard and pools them into bags in torch, so autograd sums the gradients of a
repeated id; backward sends every table's gradients (each table's distinct ids) in one
batched push at the module's step, and the shards apply each table's row-wise optimizer. In eval mode lookups
create no rows and nothing is pushed.
"""
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from tessera.checks import TesseraError, as_ids, check_lookup, sqrtn_scale
from tessera.client import Client
from tessera.tables import OPTIMIZER_SETTINGS, TABLE_SETTINGS, table_config

__all__ = ["EmbeddingCollection", "Fetched", "prefetch", "TesseraError"]

# create_table's keyword arguments a table spec may carry.
_CREATE_ARGS = TABLE_SETTINGS


def _spec_differences(config, spec: Mapping) -> List[str]:
    """The settings of `spec` that the existing table's `config` does not have, each as
    "learning_rate: the table has 0.05, the spec says 0.5"."""
    want = table_config(config.name, spec.get("dim", config.dim),
                        **{k: spec[k] for k in _CREATE_ARGS if k in spec})
    fields = {"dim": ("dim",), "optimizer": ("optimizer", "type"), "dtype": ("dtype",),
              "seed": ("seed",), "max_rows": ("max_rows",), "durability": ("durability",),
              "initializer": ("initializer", "type"), "init_scale": ("initializer", "scale"),
              "eviction": ("eviction", "policy"), "ttl_steps": ("eviction", "ttl_steps"),
              "admit_min_count": ("admission", "min_count"),
              "admit_probability": ("admission", "probability"),
              "admit_sketch_width": ("admission", "sketch_width"),
              "vocabulary_size": ("vocabulary_size",),
              **{k: ("optimizer", k) for k in OPTIMIZER_SETTINGS}}
    out = []
    for key in spec:
        if key == "name":
            continue
        have, wanted = config, want
        for part in fields[key]:
            field = have.DESCRIPTOR.fields_by_name[part]
            have, wanted = getattr(have, part), getattr(wanted, part)
        if have == wanted or (isinstance(have, float) and np.float32(have) == np.float32(wanted)):
            continue
        if field.enum_type is not None:
            shown = field.enum_type.values_by_number[have].name
        else:
            shown = str(np.float32(have)) if isinstance(have, float) else repr(have)
        out.append(f"{key}: the table has {shown}, the spec says {spec[key]!r}")
    return out


def _features(features, names: Sequence[str]) -> Dict[str, Tuple[np.ndarray, np.ndarray,
                                                                     Optional[np.ndarray]]]:
    """Per table: (ids, CSR offsets, weights or None) from a mapping of name -> (ids,
    offsets[, weights]) or a KeyedJaggedTensor-like object (keys(), values(), lengths(),
    optionally weights())."""
    out = {}
    if hasattr(features, "keys") and hasattr(features, "values") and hasattr(
            features, "lengths") and callable(features.lengths):
        keys = list(features.keys())
        values = np.asarray(_numpy(features.values()))
        lengths = np.asarray(_numpy(features.lengths()), dtype=np.int64)
        weights = features.weights() if hasattr(features, "weights") else None
        weights = None if weights is None else np.asarray(_numpy(weights), dtype=np.float32)
        if len(lengths) % max(1, len(keys)) != 0:
            raise ValueError(f"lengths ({len(lengths)}) is not a multiple of the "
                             f"{len(keys)} keys")
        per_key = len(lengths) // max(1, len(keys))
        start = 0
        for k, key in enumerate(keys):
            lens = lengths[k * per_key:(k + 1) * per_key]
            n = int(lens.sum())
            offsets = np.concatenate([[0], np.cumsum(lens)])
            out[key] = (values[start:start + n], offsets,
                        None if weights is None else weights[start:start + n])
            start += n
    elif isinstance(features, Mapping):
        for key, value in features.items():
            if not isinstance(value, (tuple, list)) or len(value) not in (2, 3):
                raise ValueError(f"feature {key!r}: expected (ids, offsets) or "
                                 f"(ids, offsets, weights)")
            weights = value[2] if len(value) == 3 else None
            out[key] = (_numpy(value[0]), np.asarray(_numpy(value[1]), dtype=np.int64),
                        None if weights is None else np.asarray(_numpy(weights),
                                                                dtype=np.float32))
    else:
        raise TypeError("features must be a mapping of table name -> (ids, offsets[, weights]) "
                        "or a KeyedJaggedTensor-like object (keys, values, lengths)")
    missing = [n for n in names if n not in out]
    extra = [k for k in out if k not in names]
    if missing or extra:
        raise ValueError(f"features name tables {sorted(out)}; this collection has "
                         f"{list(names)} (missing {missing}, unknown {extra})")
    return out


def _numpy(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    return np.asarray(x)


class EmbeddingCollection(torch.nn.Module):
    """Tessera tables as a torch module (see the module's docstring).

    `tables`: each a table name (the table must exist) or a dict with "name", "dim" and
    any of create_table's keyword arguments (TABLE_SETTINGS: optimizer and its settings,
    dtype, seed, max_rows, initializer, init_scale, durability, eviction, ttl_steps,
    admit_min_count, admit_probability, admit_sketch_width, vocabulary_size):
    created when missing, else every setting the spec gives is checked against the
    existing table (ValueError naming each field that differs and both values).
    `pooling`: "sum", "mean" or "sqrtn" (of weight x row over a bag's ids: the sum, divided
    by the bag's id count or by its square root). `device`: where the
    pooled embeddings go (default: the CPU). `step`: the step of the first training
    forward; each training forward takes the next one unless forward(step=) says.
    `grad_scale`: multiplies the gradients pushed (1 / world size under
    DistributedDataParallel, so that the processes' pushes add up to the mean over the
    global batch).
    """

    def __init__(self, client: Client, tables: Sequence[Union[str, Mapping]],
                 pooling: str = "sum", device: Optional[Union[str, torch.device]] = None,
                 step: int = 0, grad_scale: float = 1.0):
        super().__init__()
        if not (grad_scale > 0 and np.isfinite(grad_scale)):
            raise ValueError(f"grad_scale must be a finite number > 0, got {grad_scale!r}")
        self.grad_scale = float(grad_scale)
        if pooling not in ("sum", "mean", "sqrtn"):
            raise ValueError(f"pooling must be 'sum', 'mean' or 'sqrtn', got {pooling!r}")
        if not tables:
            raise ValueError("an EmbeddingCollection needs at least one table")
        self.client = client
        self.pooling = pooling
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        self.step = int(step)
        existing = client.tables()
        self.names: List[str] = []
        self.dims: Dict[str, int] = {}
        for spec in tables:
            spec = {"name": spec} if isinstance(spec, str) else dict(spec)
            name = spec.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError(f"a table spec needs a name: {spec!r}")
            unknown = set(spec) - {"name", "dim", *_CREATE_ARGS}
            if unknown:
                raise ValueError(f"table {name!r}: unknown spec keys {sorted(unknown)}")
            if name in existing:
                config = existing[name]
                differences = _spec_differences(config, spec)
                if differences:
                    raise ValueError(
                        f"table {name!r} exists with other settings than the spec's: "
                        f"{'; '.join(differences)}. Give the table's settings (or leave them "
                        f"out of the spec), change the table's optimizer settings first "
                        f"(client.alter_table), or use another table name")
            elif "dim" in spec:
                config = client.create_table(name, spec["dim"], **{
                    k: spec[k] for k in _CREATE_ARGS if k in spec})
            else:
                raise ValueError(f"table {name!r} does not exist; give its dim to create it")
            if name in self.dims:
                raise ValueError(f"table {name!r} is named twice")
            self.names.append(name)
            self.dims[name] = config.dim
        self.pushed_rows = 0  # distinct rows pushed so far (all tables)
        # What the fused path's output hangs from (autograd calls its backward through it).
        self._anchor = torch.zeros(0, requires_grad=True)
        # The newest push that raised (dropped from the steps that follow), or None.
        self.failed_push: Optional[_FailedPush] = None

    def fetch(self, features) -> "Fetched":
        """Looks up the rows `features` needs (each table's distinct ids), for a later
        forward(): what prefetch() runs ahead on a background thread. Read-only unless the
        module is in training mode."""
        return self._fetch(_features(features, self.names))

    def _fetch(self, parts) -> "Fetched":
        """fetch() of the features' parts (_features)."""
        training = self.training
        checked = {}
        for name in self.names:
            ids, offsets, weights = parts[name]
            ids = as_ids(ids)
            offsets, weights = check_lookup(len(ids), list(offsets), weights, self.pooling)
            unique, inverse = np.unique(ids, return_inverse=True)
            checked[name] = (unique, inverse, offsets, weights)
        # Every table's distinct ids in one request per shard.
        rows = self.client.lookup_many({name: c[0] for name, c in checked.items()},
                                       read_only=not training)
        return Fetched({name: (*c, rows[name]) for name, c in checked.items()})

    def forward(self, features, step: Optional[int] = None,
                as_dict: bool = False) -> Union[torch.Tensor, Dict[str, torch.Tensor]]:
        """Pooled embeddings of every table's bags: a (batch, tables, dim) tensor in table
        order when all tables have one dim and the same number of bags (else pass
        as_dict=True), or {table: (bags, dim)}. `features`: {table: (ids, offsets)} or
        {table: (ids, offsets, weights)} (CSR offsets, bags + 1 entries; arrays or tensors),
        a KeyedJaggedTensor-like object, or what fetch() returned for them. Training: the
        rows' gradients are pushed at step `step` (default: the module's next step) during
        backward. TesseraError as the client raises it (unknown table, bad ids or
        offsets)."""
        if isinstance(features, Fetched):
            fetched = features
        else:
            parts = _features(features, self.names)
            if hasattr(self.client, "pooled_lookup"):
                fused = self._fused_forward(parts, step, as_dict)
                if fused is not None:
                    return fused
            fetched = self._fetch(parts)
        training = self.training and torch.is_grad_enabled()
        if training and step is None:
            step = self.step
            self.step += 1
        self.flush()  # a step whose backward left some table without a gradient
        pending = _PendingPush(step, len(self.names)) if training else None
        pooled: Dict[str, torch.Tensor] = {}
        for name in self.names:
            unique, inverse, offsets, weights, rows = fetched.tables[name]
            rows = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.float32)).to(self.device)
            if training:
                rows.requires_grad_(True)
                rows.register_hook(self._collector(pending, name, unique))
            pooled[name] = self._pool(rows, inverse, offsets, weights)
        self._pending = pending
        if as_dict:
            return pooled
        shapes = {tuple(p.shape) for p in pooled.values()}
        if len(shapes) != 1:
            raise ValueError(f"tables give pooled shapes {sorted(shapes)}: pass as_dict=True")
        return torch.stack([pooled[n] for n in self.names], dim=1)

    def _fused_forward(self, parts, step, as_dict):
        """Tables in this process (tessera.local), "sum" pooling without weights, one dim and
        bag count: every table's bags pooled in one call of the core, and in backward their
        rows' gradients summed by it, in the order and arithmetic of the general path (so
        the rows equal a cluster's after the same steps). `parts`: the features' parts
        (_features). None where that does not apply."""
        if self.pooling != "sum" or len(set(self.dims.values())) != 1:
            return None
        if any(parts[n][2] is not None for n in self.names):
            return None
        ids = [as_ids(parts[n][0]) for n in self.names]
        offsets = []
        for name, table_ids in zip(self.names, ids):
            table_offsets = np.asarray(parts[name][1], dtype=np.int64)
            # CSR offsets over the ids, checked at array speed; anything else is named as
            # check_lookup names it.
            if (table_offsets.ndim != 1 or len(table_offsets) < 1 or table_offsets[0] != 0
                    or table_offsets[-1] != len(table_ids)
                    or np.any(table_offsets[1:] < table_offsets[:-1])):
                check_lookup(len(table_ids), list(parts[name][1]), None, "sum")
                return None
            offsets.append(table_offsets)
        if len({len(o) for o in offsets}) != 1:
            return None
        training = self.training and torch.is_grad_enabled()
        if training and step is None:
            step = self.step
            self.step += 1
        self.flush()
        if training:
            pending = _PendingPush(step, len(self.names))
            pooled = _PooledTables.apply(self._anchor, self, ids, offsets, pending)
        else:
            pending = None
            pooled = torch.from_numpy(self.client.pooled_lookup(
                self.names, ids, offsets, read_only=not self.training)).permute(1, 0, 2)
        pooled = pooled.to(self.device)
        self._pending = pending
        if as_dict:
            return {name: pooled[:, t] for t, name in enumerate(self.names)}
        return pooled

    def _pool(self, rows: torch.Tensor, inverse: np.ndarray, offsets, weights) -> torch.Tensor:
        offsets = np.asarray(offsets, dtype=np.int64)
        counts = np.diff(offsets)
        bag = torch.from_numpy(np.repeat(np.arange(len(counts)), counts)).to(self.device)
        gathered = rows[torch.from_numpy(inverse.astype(np.int64)).to(self.device)]
        if weights is not None:
            gathered = gathered * torch.from_numpy(
                np.asarray(weights, dtype=np.float32)).to(self.device)[:, None]
        out = torch.zeros(len(counts), rows.shape[1], dtype=rows.dtype, device=self.device)
        out = out.index_add(0, bag, gathered)
        if self.pooling == "mean":
            scale = torch.from_numpy(1.0 / np.maximum(counts, 1).astype(np.float32))
            out = out * scale.to(self.device)[:, None]
        elif self.pooling == "sqrtn":
            out = out * torch.from_numpy(sqrtn_scale(counts)).to(self.device)[:, None]
        return out

    def _collector(self, pending: "_PendingPush", name: str, unique: np.ndarray):
        """The hook of a table's rows: keeps their gradient for the step's push, and sends
        the push once every table's gradient is in."""
        def collect(grad: torch.Tensor):
            if name in pending.grads:  # a second backward through the same step
                self._push(pending)
            g = grad.detach().cpu().numpy()
            if self.grad_scale != 1.0:
                g = g * np.float32(self.grad_scale)
            pending.grads[name] = (unique, g)
            if len(pending.grads) == pending.tables:
                self._push(pending)
            return grad
        return collect

    def _push(self, pending: "_PendingPush"):
        """Sends the step's gradients once: they leave `pending` before the push, so a
        refused push (TesseraError, raised from backward, flush or the next forward) is
        not sent again by later steps. It is kept in `failed_push` for retry_failed_push()."""
        if not pending.grads:
            return
        grads, pending.grads = pending.grads, {}
        request_id = self.client.next_request_id()
        try:
            # The forward looked these ids up (rows made): no check round.
            updated = self.client.push_many(grads, step=pending.step, request_id=request_id,
                                            after_lookup=True)
        except TesseraError as error:
            self.failed_push = _FailedPush(pending.step, grads, request_id, error)
            raise
        self.pushed_rows += sum(updated.values())

    def retry_failed_push(self) -> int:
        """Sends the newest refused or failed push again, under its request id (so parts a
        shard applied before the failure are not applied twice), and forgets it. Returns the
        distinct rows updated; raises as the push does (a push refused for its content, such
        as non-finite gradients, is refused again: drop it with `failed_push = None`).
        ValueError when there is none."""
        failed = self.failed_push
        if failed is None:
            raise ValueError("no failed push to retry")
        updated = self.client.push_many(failed.grads, step=failed.step,
                                        request_id=failed.request_id)
        self.failed_push = None
        self.pushed_rows += sum(updated.values())
        return sum(updated.values())

    def flush(self):
        """Pushes the gradients a backward left waiting: those of a step in which some
        table's output took no part in the loss (its other tables' gradients wait for it
        until the next forward, which flushes them, or this call)."""
        pending = getattr(self, "_pending", None)
        if pending is not None:
            self._push(pending)

class _PooledTables(torch.autograd.Function):
    """Every table's pooled bags as one (bags, tables, dim) tensor from the tables in this
    process; backward pushes the rows' gradients (EmbeddingCollection._push)."""

    @staticmethod
    def forward(ctx, anchor, module, ids, offsets, pending):
        pooled = module.client.pooled_lookup(module.names, ids, offsets)
        ctx.module, ctx.ids, ctx.offsets, ctx.pending = module, ids, offsets, pending
        return torch.from_numpy(pooled).permute(1, 0, 2)

    @staticmethod
    def backward(ctx, grad):
        module, pending = ctx.module, ctx.pending
        g = grad.detach().to("cpu", torch.float32).permute(1, 0, 2).contiguous().numpy()
        if pending.grads:  # a second backward through the same step
            module._push(pending)
        grads = module.client.pooled_gradients(module.names, ctx.ids, ctx.offsets, g)
        if module.grad_scale != 1.0:  # of each row's sum, as the general path scales
            grads = {n: (u, r * np.float32(module.grad_scale)) for n, (u, r) in grads.items()}
        pending.grads = grads
        module._push(pending)
        return None, None, None, None, None


class _PendingPush:
    """One training step's table gradients on their way to one push."""

    def __init__(self, step: int, tables: int):
        self.step = step
        self.tables = tables
        self.grads: Dict[str, Tuple[np.ndarray, np.ndarray]] = {}


class _FailedPush:
    """A step's push that raised: its gradients, request id and the error."""

    def __init__(self, step: int, grads, request_id, error: TesseraError):
        self.step = step
        self.grads = grads
        self.request_id = request_id
        self.error = error


class Fetched:
    """A batch's rows looked up ahead (EmbeddingCollection.fetch): per table, its
    distinct ids, each id's place among them, offsets, weights and rows."""

    def __init__(self, tables):
        self.tables = tables


def prefetch(collection: EmbeddingCollection, batches: Iterable,
             features: Callable = lambda batch: batch[0], depth: int = 1) -> Iterator:
    """Yields (batch, fetched) for each batch of `batches` (a DataLoader, say), looking up
    the rows of the next `depth` batches on a background thread while the caller trains
    on the current one: pass `fetched` to the collection instead of the features.
    `features(batch)` gives a batch's features (default: its first element). The rows of
    batch t+1 are read before batch t's push: they miss at most `depth` steps of updates
    (bounded staleness, as tessera-train's --max_staleness)."""
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    pending: deque = deque()
    with ThreadPoolExecutor(max_workers=1) as pool:
        for batch in batches:
            pending.append((batch, pool.submit(collection.fetch, features(batch))))
            if len(pending) > depth:
                done, rows = pending.popleft()
                yield done, rows.result()
        while pending:
            done, rows = pending.popleft()
            yield done, rows.result()
