"""A client of a serving replica (tessera-serve): scores and rows of a model it follows.

    import tessera
    replica = tessera.connect("127.0.0.1:7100")      # a tessera-serve address
    scores = replica.predict(dense, [ids_c1, (ids_c2, offsets_c2), ...])
    rows = replica.lookup("dlrm.C1", ids)
    replica.status()["serving_step"]

connect() returns a ServingClient when the address serves tessera.v1.Serving.
"""
from typing import Optional, Sequence

import grpc
import numpy as np

from tessera import wire
from tessera.checks import _POOLING, TesseraError, as_ids, check_lookup
from tessera.client import _RETRIES, _TIMEOUT, call_with_retries, channel_options
from tessera.v1 import embedding_service_pb2 as api
from tessera.v1 import serving_pb2, serving_pb2_grpc


def _channel(address: str, root_certs, cert_chain, private_key, server_name):
    options = channel_options(server_name)
    if root_certs:
        credentials = grpc.ssl_channel_credentials(root_certs, private_key, cert_chain)
        return grpc.secure_channel(address, credentials, options=options)
    return grpc.insecure_channel(address, options=options)


def serves_replica(address: str, token: Optional[str] = None, root_certs: Optional[bytes] = None,
                   cert_chain: Optional[bytes] = None, private_key: Optional[bytes] = None,
                   server_name: Optional[str] = None, timeout: float = _TIMEOUT) -> bool:
    """True when `address` answers tessera.v1.Serving (a tessera-serve); False otherwise (a
    coordinator answers UNIMPLEMENTED; an address not reached within `timeout` is left to
    the caller's own connect to report)."""
    channel = _channel(address, root_certs, cert_chain, private_key, server_name)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        stub = serving_pb2_grpc.ServingStub(channel)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        stub.Status(serving_pb2.ServingStatusRequest(), timeout=timeout, metadata=metadata)
        return True
    except (grpc.RpcError, grpc.FutureTimeoutError):
        return False
    finally:
        channel.close()


class ServingClient:
    """See the module's doc. Thread-safe."""

    def __init__(self, address: str, token: Optional[str] = None,
                 root_certs: Optional[bytes] = None, cert_chain: Optional[bytes] = None,
                 private_key: Optional[bytes] = None, server_name: Optional[str] = None,
                 timeout: float = _TIMEOUT, retries: int = _RETRIES):
        self.address = address
        self.timeout = timeout
        self.retries = retries
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._channel = _channel(address, root_certs, cert_chain, private_key, server_name)
        self._stub = serving_pb2_grpc.ServingStub(self._channel)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _call(self, method, request):
        return call_with_retries(method, request, self.timeout, self._metadata, self.retries)

    def predict(self, dense, features: Sequence, logits: bool = False) -> np.ndarray:
        """Click probabilities (float32, one per sample) of samples with `dense` features
        (samples, num_dense) and, per sparse feature in the model's order, either the ids
        (one per sample) or (ids, offsets) (CSR, samples + 1 offsets over the ids). With
        logits=True, the logits instead. TesseraError INVALID_ARGUMENT for shapes that do
        not fit the model, FAILED_PRECONDITION before a dense network is published."""
        dense = np.ascontiguousarray(dense, dtype=np.float32)
        if dense.ndim != 2:
            raise TesseraError(grpc.StatusCode.INVALID_ARGUMENT,
                               "dense must be (samples, num_dense)")
        request = serving_pb2.PredictRequest(samples=dense.shape[0], dense=dense.tobytes())
        for f, feature in enumerate(features):
            part = request.features.add()
            if isinstance(feature, tuple):
                ids, offsets = feature
                part.offsets = np.ascontiguousarray(offsets, dtype=np.int32).tobytes()
            else:
                ids = feature
            part.ids = as_ids(ids).tobytes()
        response = self._call(self._stub.Predict, request)
        out = response.logits if logits else response.scores
        return np.frombuffer(out, dtype=np.float32).copy()

    def lookup(self, table: str, ids, offsets: Optional[Sequence[int]] = None,
               pooling: str = "sum", weights=None) -> np.ndarray:
        """Rows of `ids` as the training cluster's lookup answers them (read-only: ids never
        trained read their initial rows), pooled per bag with `offsets`. NOT_FOUND for a
        table the replica does not serve."""
        ids = as_ids(ids)
        offsets, weights = check_lookup(len(ids), offsets, weights, pooling, f"table '{table}'")
        data = wire.encode_lookup_request(table, ids, 0, offsets, _POOLING[pooling], weights,
                                          True)
        response = self._call(self._stub.Lookup, api.LookupRequest.FromString(data))
        return np.asarray(response.values, dtype=np.float32).reshape(-1, response.dim)

    def status(self) -> dict:
        """The replica's progress: model, serving_step, dense_step, head_step, shards,
        shards_caught_up, seconds_since_caught_up, tables (rows, bytes, format), events,
        frozen (a replica of a checkpoint: serving_step is its step)."""
        s = self._call(self._stub.Status, serving_pb2.ServingStatusRequest())
        return {
            "model": s.model, "serving_step": s.serving_step, "dense_step": s.dense_step,
            "head_step": s.head_step, "shards": s.shards, "shards_caught_up": s.shards_caught_up,
            "seconds_since_caught_up": s.seconds_since_caught_up,
            "tables": {t.table: {"rows": t.rows, "bytes": t.bytes, "format": t.format}
                       for t in s.tables},
            "snapshots": s.snapshots, "rows_applied": s.rows_applied,
            "bytes_read": s.bytes_read, "events": list(s.events), "frozen": s.frozen}
