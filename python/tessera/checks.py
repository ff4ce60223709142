"""The checks a request passes before it is sent, in the servers' words (pinned by
tests/data/lookup_checks_golden.txt), so that both client modes refuse what a server would;
and the pooling the client computes itself."""
from typing import Optional

import grpc
import numpy as np

from tessera.v1 import config_pb2

_POOLING = {"sum": config_pb2.SUM, "mean": config_pb2.MEAN, "sqrtn": config_pb2.SQRTN}


class TesseraError(Exception):
    """A call that failed: `code` is the grpc.StatusCode, the message names the cause."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class TableConfigs:
    """The table configs a client keeps (`_configs`, by name), which its tables() lists
    again: _config(table) is a table's, NOT_FOUND for one that is not listed."""

    def _config(self, table: str) -> config_pb2.TableConfig:
        if table not in self._configs:
            self.tables()
        if table not in self._configs:
            raise TesseraError(grpc.StatusCode.NOT_FOUND, f"table '{table}' not found")
        return self._configs[table]


def _raise(error: grpc.RpcError):
    raise TesseraError(error.code(), error.details()) from None


def _invalid(message: str):
    raise TesseraError(grpc.StatusCode.INVALID_ARGUMENT, message)


def as_ids(ids) -> np.ndarray:
    """`ids` as the int64 array the wire carries. Ids are 64-bit patterns: int64 values as
    they are, uint64 values (feature hashes) bit for bit, as the C++ client's static_cast
    does (2**64 - 1 and -1 are the same id). Python ints must lie in [-2**63, 2**64);
    floats, booleans and other types are refused (TesseraError INVALID_ARGUMENT), and so
    are ids of more than one dimension (flatten them yourself: the rows come back in that
    order)."""
    array = ids if isinstance(ids, np.ndarray) else np.asarray(ids)
    if array.ndim > 1:
        _invalid(f"ids must be one-dimensional, got shape {array.shape} (pass ids.ravel() "
                 f"and reshape the rows)")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype == np.uint64:
        return np.ascontiguousarray(array).ravel().view(np.int64)
    if array.dtype.kind in "iu":
        return np.ascontiguousarray(array, dtype=np.int64).ravel()
    if array.dtype == object:  # Python ints too large for int64
        flat = array.ravel()
        if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in flat):
            _invalid("ids must be integers")
        if any(v < -(1 << 63) or v >= (1 << 64) for v in flat):
            _invalid("ids must lie in [-2**63, 2**64)")
        return np.array([v - (1 << 64) if v >= (1 << 63) else v for v in flat], dtype=np.int64)
    _invalid(f"ids must be integers, got {array.dtype} values")


def _check_bags(n: int, offsets: np.ndarray, num_weights: int) -> Optional[str]:
    """What ValidateBags (embedding/batch_ops.cc) says of CSR `offsets` over n ids, in its
    words; None when they are well formed."""
    if len(offsets) == 0:
        return "offsets must have bags+1 entries, got none"
    if offsets[0] != 0:
        return f"offsets must start at 0, got offsets[0] = {offsets[0]}"
    for b in np.flatnonzero(np.diff(offsets) < 0)[:1] + 1:
        return (f"offsets not monotone: offsets[{b}] = {offsets[b]} < offsets[{b - 1}] = "
                f"{offsets[b - 1]}")
    if offsets[-1] != n:
        return f"offsets out of range: last offset {offsets[-1]} but there are {n} ids"
    if num_weights not in (0, n):
        return f"weights has {num_weights} entries; expected 0 or one per id ({n})"
    return None


def check_lookup(n: int, offsets, weights, pooling: str, where: str = "lookup"):
    """The checks a shard applies to a lookup (embedding::CheckLookupShape), made before
    anything is sent so both modes refuse the same requests with the servers' messages,
    prefixed with `where` ("table 'T'"). Returns offsets and weights as arrays (or None)."""
    if pooling not in _POOLING:
        _invalid(f"{where}: pooling must be 'sum', 'mean' or 'sqrtn', got '{pooling}'")
    if offsets is not None:
        offsets = np.asarray(offsets)
        if offsets.dtype.kind not in "iu":
            _invalid(f"{where}: offsets must be integers")
        offsets = offsets.astype(np.int64).ravel()
    if weights is not None:
        if offsets is None:
            _invalid(f"{where}: weights need bag offsets")
        weights = np.ascontiguousarray(weights, dtype=np.float32).ravel()
    if offsets is not None:
        broken = _check_bags(n, offsets, 0 if weights is None else len(weights))
        if broken is not None:
            _invalid(f"{where}: {broken}")
    if weights is not None:
        for i in np.flatnonzero(~np.isfinite(weights))[:1]:
            _invalid(f"{where}: weight {i} is {weights[i]}")
    return offsets, weights


def _nonfinite_gradient(table: str, ids: np.ndarray, gradients: np.ndarray) -> Optional[str]:
    """What CheckFiniteGradients (embedding/batch_ops.cc) says of the first value of
    `gradients` (len(ids), dim) that is not finite; None when all are."""
    bad = np.flatnonzero(~np.isfinite(gradients.ravel()))
    if len(bad) == 0:
        return None
    dim = gradients.shape[1] if gradients.ndim == 2 else 1
    row, column = divmod(int(bad[0]), dim)
    return (f"table '{table}': gradient for id {ids[row]} (position {row}, column {column}) "
            f"is {gradients.ravel()[bad[0]]}; batch rejected")


def _check_gradients(config, ids: np.ndarray, gradients, finite: bool = True) -> np.ndarray:
    """`gradients` as a (len(ids), dim) float32 array; INVALID_ARGUMENT for another shape
    (a transposed or flattened array is not read row-major into the rows) or, unless
    `finite` is False (the core in this process checks them itself, with the same
    message), a value that is not finite."""
    table = config.name
    gradients = np.ascontiguousarray(gradients, dtype=np.float32)
    if gradients.shape != (len(ids), config.dim):
        _invalid(f"table '{table}': gradients of shape ({len(ids)}, {config.dim}) expected "
                 f"({len(ids)} ids x dim {config.dim}), got {gradients.shape}")
    broken = _nonfinite_gradient(table, ids, gradients) if finite else None
    if broken is not None:
        _invalid(broken)
    return gradients


def _sum_repeats(table: str, ids: np.ndarray, gradients: np.ndarray):
    """(distinct ids, their gradients summed in the caller's order); INVALID_ARGUMENT when
    a sum is not finite (refused before any shard applies its part)."""
    unique, inverse = np.unique(ids, return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(inverse[order]) != 0])
    with np.errstate(over="ignore"):
        summed = np.add.reduceat(gradients[order], starts, axis=0) if len(ids) else gradients
    broken = _nonfinite_gradient(table, unique, summed)
    if broken is not None:
        _invalid(f"summed over repeated ids: {broken}")
    return unique, summed


def _pool(rows: np.ndarray, offsets: np.ndarray, weights, pooling: str) -> np.ndarray:
    offsets, weights = check_lookup(len(rows), offsets, weights, pooling)
    counts = np.diff(offsets)
    bag = np.repeat(np.arange(len(counts)), counts)
    if weights is not None:
        rows = rows * np.asarray(weights, dtype=np.float32)[:, None]
    pooled = np.zeros((len(counts), rows.shape[1]), dtype=np.float32)
    np.add.at(pooled, bag, rows)
    if pooling == "mean":
        pooled /= np.maximum(counts, 1)[:, None]
    elif pooling == "sqrtn":
        pooled *= sqrtn_scale(counts)[:, None]
    return pooled


def sqrtn_scale(counts: np.ndarray) -> np.ndarray:
    """What a bag of each count is multiplied by under "sqrtn" pooling: 1 / sqrt(count) in
    float32, as the servers compute it (1 for an empty bag)."""
    counts = np.asarray(counts).astype(np.float32)
    return np.where(counts > 0, np.float32(1) / np.sqrt(np.maximum(counts, np.float32(1))),
                    np.float32(1)).astype(np.float32)
