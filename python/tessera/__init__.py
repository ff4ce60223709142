"""Tessera's Python client: look up and push embedding rows with NumPy arrays."""
from tessera.client import Client, TesseraError, as_ids, connect
from tessera.sharding import shard_of

__all__ = ["Client", "TesseraError", "as_ids", "connect", "shard_of"]
