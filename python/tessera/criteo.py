"""tessera-train's reading of Criteo-format TSV lines, for scoring the same samples
elsewhere (a serving replica's Predict): the same ids, dense values and held-out lines.

    labels, dense, ids = tessera.criteo.read("clicks.tsv", held_out=True)
    scores = replica.predict(dense, list(ids))
"""
import math
from typing import Tuple

import numpy as np

from tessera.sharding import mix64

NUM_DENSE, NUM_SPARSE = 13, 26


def _u64(x: int) -> np.uint64:
    return np.uint64(x & 0xFFFFFFFFFFFFFFFF)


def feature_id(feature: int, value: int, missing: bool) -> int:
    """The id of categorical column C<feature + 1> holding hex `value` (or none):
    trainer/criteo_reader.cc's CriteoFeatureId."""
    salt = mix64(_u64(0x63726974656F + feature))
    inner = _u64(0x4D495353494E47) if missing else mix64(_u64(value + 1))
    return int(mix64(np.uint64(salt ^ inner)).astype(np.int64))


def held_out_line(number: int, seed: int = 1, fraction: float = 0.1) -> bool:
    """Whether line `number` (from 1) of a run's first file is held out for evaluation, for
    tessera-train --seed and --held_out_fraction: trainer/criteo_reader.cc's IsHeldOutLine."""
    h = int(mix64(np.uint64(_u64(number) ^ mix64(_u64(seed + 77)))))
    return (h >> 11) * 2.0 ** -53 < fraction


def parse_line(line: str) -> Tuple[float, list, list]:
    """(label, dense (13 floats), ids (26 int64)) of one well-formed Criteo-format line, as
    trainer/criteo_reader.cc's ParseCriteoLine reads it: dense log(1 + max(x, 0)) (empty:
    0), ids CriteoFeatureId of the hex value (empty: the feature's missing id)."""
    cols = line.rstrip("\n").split("\t")
    dense = [math.log1p(max(int(c), 0)) if c else 0.0 for c in cols[1:1 + NUM_DENSE]]
    ids = [feature_id(f, int(c, 16) if c else 0, not c)
           for f, c in enumerate(cols[1 + NUM_DENSE:1 + NUM_DENSE + NUM_SPARSE])]
    return float(cols[0]), dense, ids


def read(path: str, held_out: bool = True, seed: int = 1, fraction: float = 0.1,
         limit: int = 200000) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(labels (n,) float32, dense (n, 13) float32, ids (26, n) int64) of the held-out lines
    of `path` (or the training lines), in file order, at most `limit` (tessera-train's
    --max_held_out)."""
    labels, dense, ids = [], [], []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if held_out_line(number, seed, fraction) != held_out:
                continue
            label, d, i = parse_line(line)
            labels.append(label)
            dense.append(d)
            ids.append(i)
            if len(labels) == limit:
                break
    return (np.array(labels, dtype=np.float32),
            np.array(dense, dtype=np.float32).reshape(-1, NUM_DENSE),
            np.array(ids, dtype=np.int64).reshape(-1, NUM_SPARSE).T.copy())


def exact_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """The AUC tessera-train reports (trainer/metrics.cc's ExactAuc: ties count a half)."""
    order = np.argsort(scores, kind="stable")
    s, y = scores[order], labels[order] > 0.5
    pos = float(y.sum())
    neg = len(y) - pos
    if pos == 0 or neg == 0:
        return 0.5
    rank_sum, i = 0.0, 0
    while i < len(s):
        j = i
        while j < len(s) and s[j] == s[i]:
            j += 1
        rank_sum += (i + 1 + j) / 2.0 * float(y[i:j].sum())
        i = j
    return (rank_sum - pos * (pos + 1) / 2.0) / (pos * neg)


def log_loss(probs: np.ndarray, labels: np.ndarray) -> float:
    """The logloss tessera-train reports (probabilities clamped to [1e-7, 1 - 1e-7])."""
    p = np.clip(probs.astype(np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(np.where(labels > 0.5, np.log(p), np.log(1 - p))))
