"""Tessera's Python client: look up and push embedding rows with NumPy arrays, and query
serving replicas; or Tessera's tables in this process (local)."""
from tessera.checks import TesseraError, as_ids
from tessera.client import Client, connect
from tessera.local_tables import LocalTables, local
from tessera.serving import ServingClient
from tessera.sharding import shard_of

__all__ = ["Client", "LocalTables", "ServingClient", "TesseraError", "as_ids", "connect", "local",
           "shard_of"]
