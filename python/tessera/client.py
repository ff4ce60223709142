"""A Tessera client for Python training jobs: NumPy in, NumPy out.

    import tessera
    client = tessera.connect("127.0.0.1:7000")          # smart: straight to the shards
    client.create_table("user", dim=16, optimizer="adagrad", learning_rate=0.05)
    rows = client.lookup("user", ids)                     # (len(ids), 16) float32
    client.push("user", ids, grads, step=1)               # grads (len(ids), 16)

Built on grpcio and stubs generated from proto/ at build time. In smart mode the client
fetches the shard map once, deduplicates each batch, routes ids with the same
ShardOf() as the C++ core and calls the shards in parallel; a shard that answers
FAILED_PRECONDITION (the map moved on) makes it refresh the map and retry once.

Every push carries a request id (this client's random id and a sequence number); shards
apply an id at most once, so retries (of the shards that failed only, in smart mode) never
apply a push twice. A push that raised may have been applied on some shards: calling
push() again with the same request_id (see next_request_id()) completes it.
"""
import itertools
import secrets
import threading
import time
from typing import Dict, List, Optional, Sequence

import grpc
import numpy as np

from tessera import sharding, wire
from tessera.checks import (_POOLING, TableConfigs, TesseraError, _check_gradients, _invalid, _pool,
                            _raise, _sum_repeats, as_ids, check_lookup)
from tessera.tables import optimizer_changes, table_config
from tessera.v1 import config_pb2, embedding_service_pb2 as api

_MAX_MESSAGE = 256 << 20
_CHECKPOINT_TIMEOUT = 1800.0  # s: checkpoints, restores, exports (C++: kCheckpointDeadline)
# The C++ client's RetryPolicy (client/retry_policy.h): retries of a call that finds a
# server unavailable, with a backoff of 50 ms doubling up to 1 s, and a per-call deadline.
_RETRIES = 8
_INITIAL_BACKOFF = 0.05  # s
_MAX_BACKOFF = 1.0  # s
_TIMEOUT = 10.0  # s (C++: ClientOptions::deadline)

def _identity(data: bytes) -> bytes:
    return data


def channel_options(server_name: Optional[str] = None) -> list:
    """The channel arguments of every Tessera client: the message limit, and a restarted
    server dialled again within a second (gRPC's own reconnect backoff, up to two minutes,
    would otherwise outlast the retries); `server_name` overrides TLS's expected name."""
    options = [("grpc.max_receive_message_length", _MAX_MESSAGE),
               ("grpc.max_send_message_length", _MAX_MESSAGE),
               ("grpc.initial_reconnect_backoff_ms", 100),
               ("grpc.min_reconnect_backoff_ms", 100),
               ("grpc.max_reconnect_backoff_ms", 1000)]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return options


# What a retry can fix (C++: client::RetryCanFix): a server not reached or a connection
# lost, or CANCELLED, which a gRPC server shutting down answers for calls it had received
# and not begun. This client never cancels a call it retries; what it retries is safe to
# repeat.
_RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)


def call_with_retries(method, request, timeout: float, metadata, retries: int):
    """One call with retries of UNAVAILABLE or CANCELLED (exponential backoff);
    TesseraError else."""
    delay = _INITIAL_BACKOFF
    for attempt in range(retries + 1):
        try:
            return method(request, timeout=timeout, metadata=metadata)
        except grpc.RpcError as error:
            if error.code() not in _RETRYABLE or attempt == retries:
                _raise(error)
            time.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF)


class _Endpoint:
    """One server's channel with raw-bytes Lookup and PushGradients and typed stubs."""

    def __init__(self, address: str, service: str, credentials, options):
        if credentials is None:
            self.channel = grpc.insecure_channel(address, options=options)
        else:
            self.channel = grpc.secure_channel(address, credentials, options=options)
        self.address = address
        prefix = f"/tessera.v1.{service}/"
        self.lookup = self.channel.unary_unary(prefix + "Lookup", request_serializer=_identity,
                                               response_deserializer=_identity)
        self.push = self.channel.unary_unary(
            prefix + "PushGradients", request_serializer=_identity,
            response_deserializer=api.PushGradientsResponse.FromString)
        self.batch_push = self.channel.unary_unary(
            prefix + "BatchPush", request_serializer=_identity,
            response_deserializer=api.BatchPushResponse.FromString)
        self.batch_lookup = self.channel.unary_unary(
            prefix + "BatchLookup", request_serializer=_identity,
            response_deserializer=api.BatchLookupResponse.FromString)

    def close(self):
        self.channel.close()


class Client(TableConfigs):
    """See connect(). Thread-safe for concurrent calls once connected."""

    def __init__(self, address: str, mode: str = "smart", token: Optional[str] = None,
                 root_certs: Optional[bytes] = None, cert_chain: Optional[bytes] = None,
                 private_key: Optional[bytes] = None, server_name: Optional[str] = None,
                 timeout: float = _TIMEOUT, retries: int = _RETRIES):
        if mode not in ("smart", "coordinator"):
            raise ValueError("mode must be 'smart' or 'coordinator'")
        self.mode = mode
        self.timeout = timeout
        self.retries = retries
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._options = channel_options(server_name)
        self._credentials = (grpc.ssl_channel_credentials(root_certs, private_key, cert_chain)
                             if root_certs else None)
        self._coordinator = _Endpoint(address, "Coordinator", self._credentials, self._options)
        # What an UNAVAILABLE coordinator most often means here.
        if not root_certs:
            hint = " (this client is plaintext: if the server uses TLS, pass root_certs)"
        elif not cert_chain:
            hint = (" (this client uses TLS without a client certificate: a server started "
                    "with --tls_require_client_cert refuses it, pass cert_chain and "
                    "private_key; else check that root_certs signed the server's certificate "
                    "and that the server uses TLS)")
        else:
            hint = (" (this client uses TLS: check that root_certs signed the server's "
                    "certificate, that the server trusts this client's, and that the server "
                    "uses TLS)")
        try:
            grpc.channel_ready_future(self._coordinator.channel).result(timeout=timeout)
        except grpc.FutureTimeoutError:
            self._coordinator.close()
            raise TesseraError(grpc.StatusCode.UNAVAILABLE,
                               f"coordinator {address} not reachable within {timeout} s"
                               + hint) from None
        from tessera.v1 import embedding_service_pb2_grpc as stubs
        self._stub = stubs.CoordinatorStub(self._coordinator.channel)
        self._configs: Dict[str, config_pb2.TableConfig] = {}
        self._client_id = secrets.randbits(64) | 1
        self._sequence = itertools.count(1)
        self._sequence_lock = threading.Lock()
        self._shards: List[_Endpoint] = []
        self._version = 0
        try:
            self.refresh_shard_map()
        except TesseraError as error:
            self._coordinator.close()
            if error.code == grpc.StatusCode.UNIMPLEMENTED:
                raise TesseraError(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"{address} does not serve the tessera.v1.Coordinator API: is it a "
                    f"tessera-shard? connect() takes the coordinator's host:port") from None
            if error.code == grpc.StatusCode.UNAVAILABLE:
                raise TesseraError(error.code, error.message + hint) from None
            raise

    # -- admin ---------------------------------------------------------------------------

    def create_table(self, name: str = "", dim: int = 0, config: Optional[config_pb2.TableConfig] = None,
                     **settings) -> config_pb2.TableConfig:
        """Creates a table on every shard: from `config` (a TableConfig), or from `name`,
        `dim` and keyword settings as table_config() takes them (every TableConfig field:
        optimizer and its settings, dtype, seed, max_rows, initializer, init_scale,
        durability, eviction, ttl_steps; tessera-train's defaults). The same config again is
        OK (a retry completes a create that failed on some shard); TesseraError
        ALREADY_EXISTS, naming the fields that differ, if the name is taken by another
        config. ValueError for an unknown setting or name."""
        if config is None:
            config = table_config(name, dim, **settings)
        elif settings or dim:
            raise ValueError("create_table takes a config or settings, not both")
        response = self._call(self._stub.CreateTable, api.CreateTableRequest(config=config))
        self._configs[config.name] = response.config
        return response.config

    def alter_table(self, name: str, **optimizer_settings) -> config_pb2.TableConfig:
        """Changes an existing table's optimizer settings (OPTIMIZER_SETTINGS, e.g.
        learning_rate=0.01, clip_norm=1.0): the next pushes use them and checkpoints hold
        them. The optimizer's type cannot change. Returns the table's config now. Safe to
        repeat. TesseraError NOT_FOUND for an unknown table, INVALID_ARGUMENT for a bad
        value; ValueError for an unknown setting or none."""
        changes = optimizer_changes(**optimizer_settings)
        response = self._call(self._stub.AlterTable,
                              api.AlterTableRequest(table=name, optimizer=changes))
        self._configs[name] = response.config
        return response.config

    def tables(self) -> Dict[str, config_pb2.TableConfig]:
        response = self._call(self._stub.ListTables, api.ListTablesRequest())
        self._configs = {t.name: t for t in response.tables}
        return dict(self._configs)

    def stats(self, table: str = "") -> api.StatsResponse:
        return self._call(self._stub.Stats, api.StatsRequest(table=table))

    def trained_rows(self, tables: Sequence[str]) -> Dict[str, int]:
        """The stored rows of each of `tables` that exists and holds any: {name: rows}. An
        empty dict means every one is missing or untouched, so a job may start on them as
        new; anything else is a previous run's training."""
        rows = dict.fromkeys(tables, 0)
        for t in self.stats().tables:  # every table's shards, in one call
            if t.table in rows:
                rows[t.table] += t.rows
        return {name: n for name, n in rows.items() if n > 0}

    def drop_table(self, name: str):
        """Removes table `name` and every row of it on every shard. TesseraError NOT_FOUND
        for an unknown table. Checkpoints that hold it keep it."""
        self._call(self._stub.DropTable, api.DropTableRequest(table=name))
        self._configs.pop(name, None)

    def export(self, table: str, since_step: int = -1,
               with_state: bool = False) -> Dict[str, np.ndarray]:
        """Every stored row of `table` (or those updated at or after `since_step`), for a
        serving system's snapshot and deltas: a dict with "ids" (int64), "weights" (float32,
        (n, dim)), "last_step" and "update_count" (int64), and "state" (float32, (n, state
        floats)) when `with_state`. np.savez(path, **rows) writes what `tessera-cli import`
        reads. TesseraError NOT_FOUND for an unknown table."""
        dim = self._config(table).dim
        parts = {"ids": [], "weights": [], "last_step": [], "update_count": [], "state": []}
        state_floats = 0
        request = api.ExportRowsRequest(table=table, since_step=since_step, with_state=with_state)
        try:
            for chunk in self._stub.ExportRows(request, timeout=_CHECKPOINT_TIMEOUT,
                                               metadata=self._metadata):
                dim, state_floats = chunk.dim or dim, chunk.state_floats or state_floats
                parts["ids"].append(np.frombuffer(chunk.ids, dtype="<i8"))
                parts["weights"].append(np.frombuffer(chunk.weights, dtype="<f4"))
                parts["last_step"].append(np.frombuffer(chunk.last_steps, dtype="<i8"))
                parts["update_count"].append(np.frombuffer(chunk.update_counts, dtype="<i8"))
                parts["state"].append(np.frombuffer(chunk.state, dtype="<f4"))
        except grpc.RpcError as error:
            _raise(error)
        join = lambda arrays, dtype: (np.concatenate(arrays) if arrays
                                      else np.zeros(0, dtype=dtype))
        rows = {"ids": join(parts["ids"], np.int64),
                "weights": join(parts["weights"], np.float32).reshape(-1, dim),
                "last_step": join(parts["last_step"], np.int64),
                "update_count": join(parts["update_count"], np.int64)}
        if with_state:
            rows["state"] = join(parts["state"], np.float32).reshape(len(rows["ids"]),
                                                                     state_floats)
        return rows

    def import_rows(self, table: str, ids, weights, state=None, last_step=None,
                    update_count=None, chunk_rows: int = 1 << 16) -> int:
        """Stores rows exactly as given (what export() returned, or your own): weights
        (len(ids), dim), optionally optimizer state, last steps and update counts. Returns
        the rows stored. Safe to repeat."""
        ids = as_ids(ids)
        dim = self._config(table).dim
        weights = np.ascontiguousarray(weights, dtype="<f4")
        if weights.shape != (len(ids), dim):
            _invalid(f"table '{table}': weights of shape ({len(ids)}, {dim}) expected "
                     f"({len(ids)} ids x dim {dim}), got {weights.shape}")
        state = None if state is None else np.ascontiguousarray(state, dtype="<f4")
        if state is not None:
            if state.ndim != 2 or state.shape[0] != len(ids):
                _invalid(f"table '{table}': state of shape ({len(ids)}, state floats) expected, "
                         f"got {state.shape}")
        for what, values in (("last_step", last_step), ("update_count", update_count)):
            if values is not None and np.shape(values) != (len(ids),):
                _invalid(f"table '{table}': {what} of shape ({len(ids)},) expected, got "
                         f"{np.shape(values)}")
        steps = None if last_step is None else np.ascontiguousarray(last_step, dtype="<i8")
        counts = None if update_count is None else np.ascontiguousarray(update_count, dtype="<i8")
        for begin in range(0, len(ids), chunk_rows):
            end = min(len(ids), begin + chunk_rows)
            rows = api.RowChunk(dim=dim, ids=ids[begin:end].tobytes(),
                                weights=weights[begin:end].tobytes())
            if state is not None:
                rows.state_floats = state.shape[1]
                rows.state = state[begin:end].tobytes()
            if steps is not None:
                rows.last_steps = steps[begin:end].tobytes()
            if counts is not None:
                rows.update_counts = counts[begin:end].tobytes()
            self._call(self._stub.ImportRows, api.ImportRowsRequest(table=table, rows=rows))
        return len(ids)

    def checkpoint(self, step: int, model: str = "",
                   attachments: Optional[Dict[str, bytes]] = None) -> api.CheckpointResponse:
        """Checkpoint `step` of `model`'s tables ("<model>.*"; "" = every table), with named
        byte `attachments`. TesseraError ALREADY_EXISTS for a step the model has one of
        (checkpoints are never overwritten)."""
        return self._call(self._stub.Checkpoint,
                          api.CheckpointRequest(step=step, model=model,
                                                attachments=attachments or {}),
                          timeout=_CHECKPOINT_TIMEOUT)

    def restore(self, step: int = -1, model: str = "",
                all_models: bool = False) -> api.RestoreResponse:
        """Puts `model`'s tables back to its checkpoint `step` (-1: its newest); other
        tables are untouched, the model's tables created since are dropped. Without a model,
        every model of the cluster goes back to a whole-cluster checkpoint: that needs
        all_models=True (TesseraError INVALID_ARGUMENT otherwise, nothing restored). The
        response lists the tables rolled_back, brought_back and dropped."""
        if not model and not all_models:
            _invalid("restore() without a model rolls back every model of the cluster: name "
                     "the model, or pass all_models=True")
        response = self._call(self._stub.Restore,
                              api.RestoreRequest(step=step, model=model, all_models=all_models),
                              timeout=_CHECKPOINT_TIMEOUT)
        self._configs = {}
        return response

    def checkpoints(self) -> api.ListCheckpointsResponse:
        return self._call(self._stub.ListCheckpoints, api.ListCheckpointsRequest())

    def shard_map(self):
        """(version, [shard addresses])."""
        return self._version, [s.address for s in self._shards]

    def refresh_shard_map(self):
        shard_map = self._call(self._stub.GetShardMap, api.GetShardMapRequest())
        for shard in self._shards:
            shard.close()
        self._version = shard_map.version
        self._incarnations = getattr(self, "_incarnations", {})  # shard address -> last heard
        self._shards = ([_Endpoint(s.address, "EmbeddingShard", self._credentials, self._options)
                         for s in shard_map.shards] if self.mode == "smart" else [])

    def close(self):
        for shard in self._shards:
            shard.close()
        self._coordinator.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- data ----------------------------------------------------------------------------

    def lookup(self, table: str, ids, offsets: Optional[Sequence[int]] = None,
               pooling: str = "sum", weights=None, read_only: bool = False) -> np.ndarray:
        """Rows of `ids`: (len(ids), dim) float32; with CSR `offsets` (bags + 1 entries),
        one pooled row per bag ("sum", "mean" or "sqrtn" of weight x row: the sum, divided
        by the bag's id count or by its square root; weights finite, one per id). Ids as as_ids() takes them. TesseraError INVALID_ARGUMENT for a malformed
        request (in both modes, before anything is sent), NOT_FOUND for an unknown table."""
        ids = as_ids(ids)
        offsets, weights = check_lookup(len(ids), offsets, weights, pooling, f"table '{table}'")
        config = self._config(table)
        if self.mode == "coordinator":
            data = wire.encode_lookup_request(table, ids, 0, offsets, _POOLING[pooling], weights,
                                              read_only)
            dim, values = wire.decode_lookup_response(
                self._call(self._coordinator.lookup, data))
            return values.reshape(-1, dim)
        unique, inverse = np.unique(ids, return_inverse=True)
        rows = self._with_map_refresh(lambda: self._lookup_unique(config, unique, read_only))
        rows = rows[inverse]
        if offsets is None:
            return rows
        return _pool(rows, np.asarray(offsets, dtype=np.int64), weights, pooling)

    def lookup_many(self, tables: Dict[str, object], read_only: bool = False
                    ) -> Dict[str, np.ndarray]:
        """Rows of several tables at once: {table: ids} -> {table: (len(ids), dim) float32},
        in one request per shard (smart mode) or one to the coordinator (the batched
        BatchLookup RPC), where lookup() sends one per table. Ids and errors as lookup()."""
        configs = {name: self._config(name) for name in tables}
        unique, inverse = {}, {}
        for name, ids in tables.items():
            unique[name], inverse[name] = np.unique(as_ids(ids), return_inverse=True)
        rows = self._with_map_refresh(lambda: self._lookup_many_unique(configs, unique, read_only))
        return {name: rows[name][inverse[name]] for name in tables}

    def next_request_id(self):
        """A fresh (client id, sequence) request id of this client's."""
        with self._sequence_lock:
            return (self._client_id, next(self._sequence))

    def push(self, table: str, ids, gradients, step: int = 0, request_id=None) -> int:
        """Applies gradients (len(ids), dim); repeated ids are summed and updated once.
        Returns the number of distinct rows updated. Applied exactly once however often it
        is retried; pass the request_id of a push that raised to complete it.
        TesseraError INVALID_ARGUMENT for gradients of another shape or not finite."""
        ids = as_ids(ids)
        config = self._config(table)
        gradients = _check_gradients(config, ids, gradients)
        if request_id is None:
            request_id = self.next_request_id()
        if self.mode == "coordinator":
            data = wire.encode_push_request(table, ids, gradients, step, 0, request_id)
            return self._call(self._coordinator.push, data).rows_updated
        unique, summed = _sum_repeats(table, ids, gradients)
        return self._with_map_refresh(
            lambda: self._push_unique(config, unique, summed, step, request_id))

    def push_many(self, pushes: Dict[str, tuple], step: int = 0,
                  request_id=None, after_lookup: bool = False) -> Dict[str, int]:
        """Several tables' gradients at once: {table: (ids, gradients)}, in one request per
        shard (smart mode) or one to the coordinator (the batched BatchPush RPC), under one
        request id; every table is checked as push() checks it before anything is sent.
        A push spanning shards is one unit: each shard checks its part first (a check
        round), so a push refused anywhere changes no row anywhere; `after_lookup=True`
        (every id was looked up by this client in the same step, creating its rows) skips
        the round. Returns {table: distinct rows updated}."""
        configs, unique, summed = {}, {}, {}
        for table, (ids, gradients) in pushes.items():
            ids = as_ids(ids)
            configs[table] = self._config(table)
            gradients = _check_gradients(configs[table], ids, gradients)
            unique[table], summed[table] = _sum_repeats(table, ids, gradients)
        if request_id is None:
            request_id = self.next_request_id()
        return self._with_map_refresh(
            lambda: self._push_many_unique(configs, unique, summed, step, request_id,
                                           after_lookup))

    # -- internals -------------------------------------------------------------------------

    def _call(self, method, request, timeout: Optional[float] = None):
        """One call with retries of UNAVAILABLE or CANCELLED (exponential backoff)."""
        return call_with_retries(method, request, timeout or self.timeout, self._metadata,
                                 self.retries)

    def _with_map_refresh(self, call):
        # A stale map: refresh and retry, again while the map keeps changing (the shards of
        # a reshard take the new map's requests once they commit to it).
        for attempt in range(5):
            try:
                return call()
            except TesseraError as error:
                if error.code != grpc.StatusCode.FAILED_PRECONDITION or attempt == 4:
                    raise
                was = self._version
                self.refresh_shard_map()
                if attempt > 0 and self._version == was:
                    raise

    def _restarted(self, shard: int, call) -> bool:
        """Records the incarnation a shard's answer (or refusal) carries; True when it
        differs from the one heard before: the shard restarted."""
        for key, value in call.trailing_metadata() or ():
            if key == "tessera-incarnation":
                address = self._shards[shard].address
                before = self._incarnations.get(address)
                self._incarnations[address] = value
                return before is not None and before != value
        return False

    def _reprovision(self):
        """Asks the coordinator to create its registry's tables again on every shard that
        lacks them (a memory-only shard that restarted is empty): the same config again
        is OK there."""
        for config in self._call(self._stub.ListTables, api.ListTablesRequest()).tables:
            self._call(self._stub.CreateTable, api.CreateTableRequest(config=config))

    def _fan_out(self, requests):
        """[(shard, method name, bytes)] -> answers, the calls in flight together. Calls
        that fail with UNAVAILABLE, CANCELLED or DEADLINE_EXCEEDED are sent again, alone
        (with backoff, up to `retries` times); the others' answers are kept. A NOT_FOUND from a shard that
        restarted (a new incarnation) has its tables made again and is sent again, once."""
        answers = [None] * len(requests)
        pending = list(range(len(requests)))
        reprovisioned = set()
        delay = _INITIAL_BACKOFF
        for attempt in range(self.retries + 1):
            futures = []
            for i in pending:
                shard, method, data = requests[i]
                callable_ = getattr(self._shards[shard], method)
                futures.append((i, callable_.future(data, timeout=self.timeout,
                                                    metadata=self._metadata)))
            failed, last, at_once = [], None, False
            for i, future in futures:
                try:
                    answers[i] = future.result()
                    self._restarted(requests[i][0], future)
                except grpc.RpcError as error:
                    shard = requests[i][0]
                    if (self._restarted(shard, error) and shard not in reprovisioned
                            and error.code() == grpc.StatusCode.NOT_FOUND):
                        reprovisioned.add(shard)
                        self._reprovision()
                        failed.append(i)
                        at_once = True
                        continue
                    if error.code() not in _RETRYABLE + (grpc.StatusCode.DEADLINE_EXCEEDED,):
                        _raise(error)
                    failed.append(i)
                    last = error
            if not failed:
                return answers
            if at_once and last is None and attempt < self.retries:
                pending = failed
                continue
            if attempt == self.retries:
                if last is None:
                    raise TesseraError(grpc.StatusCode.NOT_FOUND,
                                       "a restarted shard still lacks a table after the "
                                       "coordinator made its tables again")
                _raise(last)
            # A channel that found its server down may stay failed after it is back: a
            # fresh one dials at once. The old one is left to the garbage collector, not
            # closed, so calls other threads still make on it finish.
            for k in {requests[i][0] for i in failed}:
                self._shards[k] = _Endpoint(self._shards[k].address, "EmbeddingShard",
                                            self._credentials, self._options)
            pending = failed
            time.sleep(delay)
            delay = min(delay * 2, _MAX_BACKOFF)
        return answers

    def _split(self, config, unique: np.ndarray):
        if config.vocabulary_size > 0 and len(unique) and (
                unique.min() < 0 or unique.max() >= config.vocabulary_size):
            bad = unique[(unique < 0) | (unique >= config.vocabulary_size)][0]
            _invalid(f"table '{config.name}': id {bad} is outside its vocabulary "
                     f"[0, {config.vocabulary_size})")
        owner = sharding.shard_of_row(unique, config, len(self._shards))
        return [(k, np.flatnonzero(owner == k)) for k in range(len(self._shards))
                if np.any(owner == k)]

    def _lookup_unique(self, config, unique: np.ndarray, read_only: bool) -> np.ndarray:
        rows = np.empty((len(unique), config.dim), dtype=np.float32)
        parts = self._split(config, unique)
        requests = [(k, "lookup", wire.encode_lookup_request(config.name, unique[at], self._version,
                                                              read_only=read_only))
                    for k, at in parts]
        for (k, at), answer in zip(parts, self._fan_out(requests)):
            _, values = wire.decode_lookup_response(answer)
            rows[at] = values.reshape(len(at), config.dim)
        return rows

    def _lookup_many_unique(self, configs, unique, read_only: bool):
        """{table: distinct ids} -> {table: rows}, one BatchLookup per shard (or one to the
        coordinator) carrying every table's ids there."""
        rows = {name: np.empty((len(u), configs[name].dim), dtype=np.float32)
                for name, u in unique.items()}
        places = self._places(configs, unique)
        requests = []
        for k, parts in places.items():
            request = api.BatchLookupRequest(shard_map_version=0 if k is None else self._version,
                                             read_only=read_only)
            for name, at in parts:
                request.tables.add(table=name,
                                   ids=np.ascontiguousarray(unique[name][at], dtype="<i8").tobytes())
            requests.append((k, request))
        answers = self._send_batches(requests, self._stub.BatchLookup, "batch_lookup")
        for (k, _), answer in zip(requests, answers):
            for (name, at), values in zip(places[k], answer.tables):
                rows[name][at] = np.frombuffer(values.values, dtype="<f4").reshape(
                    len(at), configs[name].dim)
        return rows

    def _send_batches(self, requests, coordinator_method, shard_method: str):
        """[(shard or None, request)] -> answers: the one request to the coordinator, or
        every shard's at once (_fan_out)."""
        if self.mode == "coordinator":
            return [self._call(coordinator_method, request) for _, request in requests]
        return self._fan_out([(k, shard_method, r.SerializeToString()) for k, r in requests])

    def _places(self, configs, unique):
        """{shard (None: the coordinator): [(table, positions of its distinct ids there)]}."""
        if self.mode == "coordinator":
            return {None: [(name, np.arange(len(u))) for name, u in unique.items()]}
        places = {}
        for name, u in unique.items():
            for k, at in self._split(configs[name], u):
                places.setdefault(k, []).append((name, at))
        return places

    def _push_many_unique(self, configs, unique, summed, step: int, request_id,
                          after_lookup: bool = False):
        places = self._places(configs, unique)
        requests = []
        for k, parts in places.items():
            request = api.BatchPushRequest(step=step,
                                           shard_map_version=0 if k is None else self._version,
                                           after_lookup=after_lookup)
            request.request_id.client_id, request.request_id.sequence = request_id
            for name, at in parts:
                request.tables.add(
                    table=name, ids=np.ascontiguousarray(unique[name][at], dtype="<i8").tobytes(),
                    gradients=np.ascontiguousarray(summed[name][at], dtype="<f4").tobytes())
            requests.append((k, request))
        if self.mode != "coordinator" and len(requests) > 1 and not after_lookup:
            self._check_push(requests)
        answers = self._send_batches(requests, self._stub.BatchPush, "batch_push")
        updated = {name: 0 for name in unique}
        for (k, _), answer in zip(requests, answers):
            for (name, _), rows in zip(places[k], answer.rows_updated):
                updated[name] += rows
        return updated

    def _check_push(self, requests):
        """A push's check round: every shard checks its part (BatchPushRequest.check_only,
        room for its new rows included), applying nothing; raises the first refusal, with
        no row changed anywhere."""
        checks = []
        for k, request in requests:
            check = api.BatchPushRequest()
            check.CopyFrom(request)
            check.check_only = True
            checks.append((k, "batch_push", check.SerializeToString()))
        self._fan_out(checks)

    def _push_unique(self, config, unique: np.ndarray, summed: np.ndarray, step: int,
                     request_id) -> int:
        parts = self._split(config, unique)
        if len(parts) > 1:
            self._check_push([(k, _batch_push_request(config.name, unique[at], summed[at], step,
                                                      self._version, request_id))
                              for k, at in parts])
        requests = [(k, "push", wire.encode_push_request(config.name, unique[at], summed[at], step,
                                                          self._version, request_id))
                    for k, at in parts]
        return sum(answer.rows_updated for answer in self._fan_out(requests))


def _batch_push_request(table: str, ids, gradients, step: int, version: int, request_id):
    request = api.BatchPushRequest(step=step, shard_map_version=version)
    request.request_id.client_id, request.request_id.sequence = request_id
    request.tables.add(table=table, ids=np.ascontiguousarray(ids, dtype="<i8").tobytes(),
                       gradients=np.ascontiguousarray(gradients, dtype="<f4").tobytes())
    return request


def connect(address: str, mode: str = "smart", **kwargs):
    """Connects to the coordinator at host:port. mode "smart" talks to the shards directly
    on the hot path; "coordinator" sends everything through the coordinator. Keyword
    arguments: token, root_certs / cert_chain / private_key (PEM bytes, for TLS),
    server_name, timeout (seconds per call), retries (of UNAVAILABLE calls).
    An address of a serving replica (tessera-serve) gives a tessera.serving.ServingClient
    (predict, lookup, status) instead."""
    from tessera import serving
    probe = {k: v for k, v in kwargs.items() if k != "retries"}
    if serving.serves_replica(address, **probe):
        return serving.ServingClient(address, **kwargs)
    return Client(address, mode=mode, **kwargs)
