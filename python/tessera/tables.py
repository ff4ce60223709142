"""Table configs as create_table sends them: the settings it takes, and enum names in any
spelling (tessera-cli's and the proto's)."""
from typing import Dict, Optional

import numpy as np

from tessera.v1 import config_pb2

_OPTIMIZERS = {"sgd": config_pb2.SGD, "adagrad": config_pb2.ADAGRAD,
               "rowwise_adagrad": config_pb2.ROWWISE_ADAGRAD, "adam": config_pb2.ADAM,
               "ftrl": config_pb2.FTRL}
_DTYPES = {"fp32": config_pb2.FP32, "fp16": config_pb2.FP16, "bf16": config_pb2.BF16}
_DURABILITY = {"checkpoint": config_pb2.CHECKPOINT, "write_through": config_pb2.WRITE_THROUGH}
_EVICTION = {"none": config_pb2.EVICTION_NONE, "lru": config_pb2.EVICTION_LRU,
             "lfu": config_pb2.EVICTION_LFU}
_INITIALIZERS = {"uniform": config_pb2.UNIFORM, "normal": config_pb2.NORMAL,
                 "zeros": config_pb2.ZEROS}

# The optimizer settings create_table takes as keyword arguments (OptimizerConfig fields).
OPTIMIZER_SETTINGS = ("learning_rate", "epsilon", "beta1", "beta2", "initial_accumulator", "l1",
                      "l2", "learning_rate_power", "clip_norm", "clip_value", "weight_decay")
# Every keyword argument of create_table and table_config (besides name and dim).
TABLE_SETTINGS = ("optimizer", *OPTIMIZER_SETTINGS, "dtype", "seed", "max_rows", "initializer",
                  "init_scale", "durability", "eviction", "ttl_steps", "admit_min_count",
                  "admit_probability", "admit_sketch_width", "vocabulary_size")


def parse_enum(kind: str, value, names: Dict[str, int], prefix: str = "") -> int:
    """An enum value from its name as the README, the CLI or the proto spell it, in any case
    ("write_through", "WRITE_THROUGH", "write-through"; "lru" or "EVICTION_LRU"), or the
    proto's number. ValueError naming the choices otherwise."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        if int(value) in names.values():
            return int(value)
    elif isinstance(value, str):
        key = value.strip().lower().replace("-", "_")
        if prefix and key.startswith(prefix):
            key = key[len(prefix):]
        if key in names:
            return names[key]
    raise ValueError(f"unknown {kind} {value!r}: one of {sorted(names)}")


def _initializer_type(value: int) -> int:
    """UNIFORM is what the proto's unspecified initializer means, and is sent as that, so a
    table made here has the config of one made without an initializer."""
    return config_pb2.INITIALIZER_UNSPECIFIED if value == config_pb2.UNIFORM else value


def table_config(name: str, dim: int, optimizer: str = "adagrad", learning_rate: float = 0.05,
                 dtype: str = "fp32", seed: int = 1, max_rows: int = 0,
                 initializer: str = "uniform", init_scale: Optional[float] = 0.05,
                 durability: str = "checkpoint", eviction: str = "none", ttl_steps: int = 0,
                 admit_min_count: int = 0, admit_probability: float = 0.0,
                 admit_sketch_width: int = 0, vocabulary_size: int = 0,
                 **optimizer_settings) -> config_pb2.TableConfig:
    """The TableConfig create_table sends, with tessera-train's and tessera-cli create's
    defaults (Adagrad at 0.05, seed 1, rows U(-0.05, 0.05), fp32). Optimizer settings
    (OPTIMIZER_SETTINGS: epsilon, beta1, beta2, initial_accumulator, l1, l2,
    learning_rate_power, clip_norm, clip_value, weight_decay) left out keep the server's
    defaults; init_scale=None is 1/sqrt(dim). Feature admission (TableConfig.admission):
    admit_min_count=K gives an id a row once pushes of K steps carried it,
    admit_probability=p gives a new id a row with probability p (decided per id by the
    table's seed), admit_sketch_width sizes each shard's count sketch; 0 leaves each off.
    vocabulary_size=N makes a fixed-vocabulary table: ids in [0, N), rows addressed by id.
    Enum names in any case. ValueError for an unknown name or setting."""
    unknown = set(optimizer_settings) - set(OPTIMIZER_SETTINGS)
    if unknown:
        raise ValueError(f"table {name!r}: unknown settings {sorted(unknown)}; "
                         f"create_table takes {list(TABLE_SETTINGS)}")
    config = config_pb2.TableConfig(
        name=name, dim=dim, seed=seed, max_rows=max_rows, vocabulary_size=vocabulary_size,
        dtype=parse_enum("dtype", dtype, _DTYPES),
        durability=parse_enum("durability", durability, _DURABILITY),
        optimizer=config_pb2.OptimizerConfig(
            type=parse_enum("optimizer", optimizer, _OPTIMIZERS), learning_rate=learning_rate),
        initializer=config_pb2.InitializerConfig(
            type=_initializer_type(parse_enum("initializer", initializer, _INITIALIZERS))),
        eviction=config_pb2.EvictionConfig(
            policy=parse_enum("eviction", eviction, _EVICTION, prefix="eviction_"),
            ttl_steps=ttl_steps))
    if admit_min_count or admit_probability or admit_sketch_width:
        config.admission.min_count = admit_min_count
        config.admission.probability = admit_probability
        config.admission.sketch_width = admit_sketch_width
    for key, value in optimizer_settings.items():
        if value is not None:
            setattr(config.optimizer, key, value)
    if init_scale is not None:
        config.initializer.scale = init_scale
    return config


def optimizer_changes(**optimizer_settings) -> config_pb2.OptimizerConfig:
    """The OptimizerConfig that alter_table sends: the settings given (OPTIMIZER_SETTINGS),
    the others unset. ValueError for an unknown setting or none."""
    unknown = set(optimizer_settings) - set(OPTIMIZER_SETTINGS)
    if unknown or not optimizer_settings:
        raise ValueError(f"alter_table takes optimizer settings {list(OPTIMIZER_SETTINGS)}, "
                         f"got {sorted(optimizer_settings)}")
    changes = config_pb2.OptimizerConfig()
    for key, value in optimizer_settings.items():
        setattr(changes, key, value)
    return changes
