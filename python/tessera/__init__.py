"""Tessera's Python client: look up and push embedding rows with NumPy arrays, and query
serving replicas."""
from tessera.checks import TesseraError, as_ids
from tessera.client import Client, connect
from tessera.serving import ServingClient
from tessera.sharding import shard_of

__all__ = ["Client", "ServingClient", "TesseraError", "as_ids", "connect", "shard_of"]
