"""Which shard owns an id: the same function as embedding/sharding.h, vectorised.

shard = JumpConsistentHash(Mix64(id ^ table_seed), num_shards)
"""
import numpy as np

_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_JUMP = np.uint64(2862933555777941757)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over uint64 values (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x


def jump_consistent_hash(keys: np.ndarray, num_buckets: int) -> np.ndarray:
    """Lamping & Veach's jump consistent hash of each uint64 key into [0, num_buckets)."""
    key = np.asarray(keys, dtype=np.uint64).copy()
    b = np.full(key.shape, -1, dtype=np.int64)
    j = np.zeros(key.shape, dtype=np.int64)
    active = j < num_buckets
    with np.errstate(over="ignore"):
        while active.any():
            b[active] = j[active]
            k = key[active] * _JUMP + np.uint64(1)
            key[active] = k
            # The same double arithmetic as the C++: (b + 1) * (2^31 / ((key >> 33) + 1)).
            ratio = float(1 << 31) / ((k >> np.uint64(33)).astype(np.float64) + 1.0)
            j[active] = ((b[active] + 1).astype(np.float64) * ratio).astype(np.int64)
            active = j < num_buckets
    return b.astype(np.int32)


def shard_of_row(ids: np.ndarray, config, num_shards: int) -> np.ndarray:
    """The shard of each id of table `config` (a TableConfig): shard_of for a dynamic
    vocabulary; for a fixed one (vocabulary_size > 0) the id modulo num_shards, as the C++
    ShardOfRow routes it."""
    if config.vocabulary_size > 0:
        ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
        return (ids % np.uint64(num_shards)).astype(np.int32)
    return shard_of(ids, config.seed, num_shards)


def shard_of(ids: np.ndarray, table_seed: int, num_shards: int) -> np.ndarray:
    """The shard of each id of a table with `table_seed` among `num_shards` shards."""
    ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
    return jump_consistent_hash(mix64(ids ^ np.uint64(table_seed)), num_shards)
