"""Tessera tables in this process: the C++ core as a Python extension (tessera._core), with
the calls of a cluster's Client that tessera.torch and training loops use.

    import tessera, tessera.torch
    tables = tessera.local()                         # in memory; or local(data_dir=...)
    emb = tessera.torch.EmbeddingCollection(tables, [{"name": "ctr.user", "dim": 16}])

The same tables, optimizers, dynamic vocabularies, admission and eviction as a shard's,
without a server or the network: for a model trained on one machine. With `data_dir` the
rows are kept there (RocksDB) and checkpoint()/restore() work as a cluster's do. Pushes
are applied once by construction (no retries cross a network), so request ids are taken
and not needed.
"""
import itertools
import threading
from typing import Dict, Optional, Sequence

import grpc
import numpy as np

from tessera.checks import (TableConfigs, TesseraError, _check_gradients, _pool, as_ids,
                            check_lookup)
from tessera.tables import optimizer_changes, table_config
from tessera.v1 import config_pb2
from tessera.v1 import embedding_service_pb2 as api

try:
    from tessera import _core
except ImportError as error:  # built by CMake next to the package (pybind11-dev)
    _core = None
    _IMPORT_ERROR = error

__all__ = ["LocalTables", "local"]

_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _raise(error) -> None:
    code, message = error.args
    raise TesseraError(_CODES.get(code, grpc.StatusCode.UNKNOWN), message) from None


def local(data_dir: Optional[str] = None, shards: int = 0, threads: int = 0,
          memory_limit: int = 0) -> "LocalTables":
    """Tables in this process: in memory, or kept in `data_dir` (created if missing; an
    existing one brings back its tables and rows). `shards`: partitions of each table
    (0: one per thread); `threads`: threads serving a batch's tables (0: this process's
    CPUs); `memory_limit`: bytes every table's rows may take (0: the machine's default
    budget, negative: none)."""
    if _core is None:
        raise ImportError(f"tessera._core is not built (the build needs pybind11-dev): "
                          f"{_IMPORT_ERROR}")
    return LocalTables(data_dir, shards, threads, memory_limit)


class LocalTables(TableConfigs):
    """See the module's docstring. Thread-safe as a Client is."""

    mode = "local"

    def __init__(self, data_dir: Optional[str], shards: int, threads: int, memory_limit: int):
        import os
        shards = shards or max(1, threads or len(os.sched_getaffinity(0)))
        try:
            self._tables = _core.Tables(data_dir or "", shards, threads, memory_limit)
        except _core.Error as error:
            _raise(error)
        self.data_dir = data_dir
        self._configs: Dict[str, config_pb2.TableConfig] = {}
        self._sequence = itertools.count(1)
        self._lock = threading.Lock()

    def _call(self, method, *args, **kwargs):
        try:
            return method(*args, **kwargs)
        except _core.Error as error:
            _raise(error)

    # -- tables --------------------------------------------------------------------------

    def create_table(self, name: str = "", dim: int = 0,
                     config: Optional[config_pb2.TableConfig] = None,
                     **settings) -> config_pb2.TableConfig:
        """As Client.create_table: from `config`, or `name`, `dim` and settings."""
        if config is None:
            config = table_config(name, dim, **settings)
        elif settings or dim:
            raise ValueError("create_table takes a config or settings, not both")
        made = config_pb2.TableConfig.FromString(
            self._call(self._tables.create_table, config.SerializeToString()))
        self._configs[made.name] = made
        return made

    def alter_table(self, name: str, **optimizer_settings) -> config_pb2.TableConfig:
        """As Client.alter_table."""
        changes = optimizer_changes(**optimizer_settings)
        config = config_pb2.TableConfig.FromString(
            self._call(self._tables.alter_table, name, changes.SerializeToString()))
        self._configs[name] = config
        return config

    def tables(self) -> Dict[str, config_pb2.TableConfig]:
        listed = [config_pb2.TableConfig.FromString(b)
                  for b in self._call(self._tables.list_tables)]
        self._configs = {t.name: t for t in listed}
        return dict(self._configs)

    def drop_table(self, name: str):
        self._call(self._tables.drop_table, name)
        self._configs.pop(name, None)

    def stats(self, table: str = "") -> api.StatsResponse:
        """As Client.stats, of this process's tables (one shard): rows, memory_bytes and
        evictions of `table`, or of every table."""
        names = [table] if table else sorted(self.tables())
        out = api.StatsResponse()
        for name in names:
            usage = self._call(self._tables.usage, name)
            out.tables.add(table=name, rows=usage["rows"], memory_bytes=usage["memory_bytes"],
                           evictions=usage["evictions"])
        return out

    def trained_rows(self, tables: Sequence[str]) -> Dict[str, int]:
        """As Client.trained_rows: {name: stored rows} of those of `tables` holding any."""
        rows = {t.table: t.rows for t in self.stats().tables if t.table in tables}
        return {name: n for name, n in rows.items() if n > 0}

    # -- rows ----------------------------------------------------------------------------

    def lookup(self, table: str, ids, offsets: Optional[Sequence[int]] = None,
               pooling: str = "sum", weights=None, read_only: bool = False) -> np.ndarray:
        """As Client.lookup."""
        ids = as_ids(ids)
        offsets, weights = check_lookup(len(ids), offsets, weights, pooling, f"table '{table}'")
        rows = self._call(self._tables.lookup, table, ids, read_only)
        if offsets is None:
            return rows
        return _pool(rows, np.asarray(offsets, dtype=np.int64), weights, pooling)

    def lookup_many(self, tables: Dict[str, object], read_only: bool = False
                    ) -> Dict[str, np.ndarray]:
        """As Client.lookup_many: {table: ids} -> {table: rows}, the tables in parallel."""
        return self._call(self._tables.lookup_many,
                          {name: as_ids(ids) for name, ids in tables.items()}, read_only)

    def pooled_lookup(self, tables: Sequence[str], ids: Sequence[np.ndarray],
                      offsets: Sequence[np.ndarray], read_only: bool = False) -> np.ndarray:
        """The SUM of every bag (CSR `offsets`) of each table's `ids`, unweighted, as one
        (tables, bags, dim) array (one dim and bag count for every table): tessera.torch's
        fused forward."""
        return self._call(self._tables.pooled_lookup, list(tables), list(ids), list(offsets),
                          read_only)

    def pooled_gradients(self, tables: Sequence[str], ids: Sequence[np.ndarray],
                         offsets: Sequence[np.ndarray], grads: np.ndarray) -> Dict[str, tuple]:
        """What pooled_lookup's bags give their rows from `grads` (tables, bags, dim):
        {table: (distinct ids, their summed gradients)}, for push_many."""
        return self._call(self._tables.pooled_gradients, list(tables), list(ids), list(offsets),
                          grads)

    def next_request_id(self):
        with self._lock:
            return (0, next(self._sequence))

    def push(self, table: str, ids, gradients, step: int = 0, request_id=None) -> int:
        """As Client.push: repeated ids are summed and their row updated once."""
        return self.push_many({table: (ids, gradients)}, step)[table]

    def push_many(self, pushes: Dict[str, tuple], step: int = 0, request_id=None,
                  after_lookup: bool = False) -> Dict[str, int]:
        """As Client.push_many: every table checked before any is applied."""
        parts = []
        for table, (ids, gradients) in pushes.items():
            ids = as_ids(ids)
            parts.append((table, ids, _check_gradients(self._config(table), ids, gradients,
                                                       finite=False)))
        return self._call(self._tables.push_many, parts, step)

    def export(self, table: str, since_step: int = -1,
               with_state: bool = False) -> Dict[str, np.ndarray]:
        """As Client.export."""
        return self._call(self._tables.export, table, since_step, with_state)

    # -- checkpoints (with a data_dir) -----------------------------------------------------

    def checkpoint(self, step: int, model: str = "",
                   attachments: Optional[Dict[str, bytes]] = None) -> dict:
        """Checkpoint `step` of `model`'s tables ("" = every table) with `attachments`."""
        return self._call(self._tables.checkpoint, step, model, attachments or {})

    def restore(self, step: int = -1, model: str = "", all_models: bool = False):
        """Puts `model`'s tables back to its checkpoint `step` (-1: the newest): (info,
        attachments)."""
        restored = self._call(self._tables.restore, step, model, all_models)
        self._configs = {}
        return restored

    def checkpoints(self):
        return self._call(self._tables.list_checkpoints)

    def close(self):
        self._tables = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
