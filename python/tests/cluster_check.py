#!/usr/bin/env python3
"""The Python client against a running cluster (tests/python_client_test.sh starts one):
smart and coordinator modes agree, pooling, errors as TesseraError with gRPC codes,
read-only lookups, several tables in one lookup, checkpoints.

    PYTHONPATH=build/python /usr/bin/python3 python/tests/cluster_check.py 127.0.0.1:7000
"""
import sys

import grpc
import numpy as np

import tessera
from tessera.v1 import config_pb2, embedding_service_pb2 as api


def expect_error(code, call):
    try:
        call()
    except tessera.TesseraError as error:
        assert error.code == code, f"expected {code}, got {error}"
        return error
    raise AssertionError(f"expected {code}, the call succeeded")


def main(address: str) -> int:
    smart = tessera.connect(address)
    via = tessera.connect(address, mode="coordinator")
    version, shards = smart.shard_map()
    assert len(shards) >= 2 and version >= 1, (version, shards)

    smart.create_table("pyc", dim=6, optimizer="sgd", learning_rate=0.5, seed=99)
    expect_error(grpc.StatusCode.ALREADY_EXISTS, lambda: via.create_table("pyc", dim=6))
    # The same config again is OK: creates are idempotent.
    via.create_table("pyc", dim=6, optimizer="sgd", learning_rate=0.5, seed=99)
    rng = np.random.default_rng(3)
    ids = rng.integers(-10**12, 10**12, 3000)
    ids[::7] = ids[0]  # repeats
    a, b = smart.lookup("pyc", ids), via.lookup("pyc", ids)
    assert a.shape == (3000, 6) and a.dtype == np.float32
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a[0], a[7])

    # A push through either path moves the same rows the same way (repeats summed).
    grads = rng.standard_normal((3000, 6)).astype(np.float32)
    assert smart.push("pyc", ids, grads, step=1) == len(np.unique(ids))
    after = via.lookup("pyc", ids)
    summed = {}
    for k, i in enumerate(ids):
        summed[i] = summed.get(i, 0) + grads[k]
    np.testing.assert_allclose(after, a - 0.5 * np.array([summed[i] for i in ids]), rtol=1e-5,
                               atol=1e-5)

    # Pooled bags: the client pools smart lookups itself; the coordinator pools on shards.
    offsets = np.array([0, 3, 3, 10, 3000])
    weights = rng.random(3000).astype(np.float32)
    for pooling in ("sum", "mean"):
        np.testing.assert_allclose(
            smart.lookup("pyc", ids, offsets=offsets, pooling=pooling, weights=weights),
            via.lookup("pyc", ids, offsets=offsets, pooling=pooling, weights=weights),
            rtol=1e-4, atol=1e-5)

    # Read-only lookups of unseen ids create no rows.
    rows_before = sum(t.rows for t in smart.stats("pyc").tables)
    smart.lookup("pyc", np.arange(5 * 10**12, 5 * 10**12 + 500), read_only=True)
    assert sum(t.rows for t in smart.stats("pyc").tables) == rows_before

    expect_error(grpc.StatusCode.NOT_FOUND, lambda: smart.lookup("missing", [1]))
    bad = np.ones((2, 6), np.float32)
    bad[1, 3] = np.nan
    for client in (smart, via):
        error = expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: client.push("pyc", [4, 5], bad))
        assert "NaN" in error.message or "nan" in error.message, error.message
    np.testing.assert_array_equal(via.lookup("pyc", ids), after)  # nothing changed

    # Malformed lookups get the same refusal in both modes, before anything is sent.
    for client in (smart, via):
        for request in (dict(ids=[1, 2, 3], offsets=[0, 3], weights=[1.0, 2.0]),  # 2 for 3 ids
                        dict(ids=[1, 2], offsets=[0, 2], weights=[1.0, np.nan]),
                        dict(ids=[1, 2], weights=[1.0, 1.0]),                      # no offsets
                        dict(ids=[1, 2], offsets=[0, 1, 3]),
                        dict(ids=[1.5, 2.0])):                                     # float ids
            expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                         lambda: client.lookup("pyc", **request))
        expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                     lambda: client.push("pyc", [1, 2], np.ones((3, 6), np.float32)))
    # Gradients of a repeated id that sum to Inf: refused before any shard applies its part.
    unchanged = via.lookup("pyc", np.arange(40), read_only=True)
    huge = np.full((41, 6), 0.25, np.float32)
    huge[39] = huge[40] = -3e38
    for client in (smart, via):
        expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                     lambda: client.push("pyc", np.r_[np.arange(40), 39], huge, step=1))
        np.testing.assert_array_equal(via.lookup("pyc", np.arange(40), read_only=True), unchanged)
    # Ids are 64-bit patterns: an unsigned hash is the int64 of the same bits in both modes.
    top = via.lookup("pyc", [-1], read_only=True)
    np.testing.assert_array_equal(smart.lookup("pyc", np.array([2**64 - 1], np.uint64),
                                               read_only=True), top)
    np.testing.assert_array_equal(via.lookup("pyc", [2**64 - 1], read_only=True), top)
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: smart.lookup("pyc", [2**64]))

    # Shapes are checked, not element counts only, in both modes: a (6, 3) array for 3 ids
    # of dim 6 would otherwise be read row-major into the rows.
    three = np.array([7, 8, 9])
    before = via.lookup("pyc", three, read_only=True)
    for client in (smart, via):
        for bad in (np.ones((6, 3), np.float32), np.ones((3, 2, 3), np.float32),
                    np.ones(18, np.float32)):
            error = expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                                 lambda: client.push("pyc", three, bad))
            assert "shape (3, 6) expected" in error.message, error.message
        expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                     lambda: client.push("pyc", three.reshape(3, 1), np.ones((3, 6), np.float32)))
        error = expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                             lambda: client.lookup("pyc", np.array([[1, 2], [3, 4]])))
        assert "one-dimensional" in error.message, error.message
        error = expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                             lambda: client.import_rows("pyc", three, np.ones((3, 5), np.float32)))
        assert "weights of shape (3, 6) expected" in error.message, error.message
    np.testing.assert_array_equal(via.lookup("pyc", three, read_only=True), before)

    # Another config under a taken name: the refusal names each field and both values.
    error = expect_error(grpc.StatusCode.ALREADY_EXISTS,
                         lambda: via.create_table("pyc", dim=6, optimizer="sgd",
                                                  learning_rate=0.25, seed=99))
    assert "optimizer.learning_rate 0.5 (the table's) vs 0.25" in error.message, error.message

    # An existing table's optimizer settings change on every shard; pushes use them.
    smart.create_table("pyc_alt", dim=2, optimizer="sgd", learning_rate=0.5, seed=3)
    altered = via.alter_table("pyc_alt", learning_rate=0.25, clip_value=100.0)
    assert abs(altered.optimizer.learning_rate - 0.25) < 1e-7, altered
    w0 = smart.lookup("pyc_alt", [5, 6])
    smart.push("pyc_alt", [5, 6], np.ones((2, 2), np.float32), step=1)
    np.testing.assert_allclose(smart.lookup("pyc_alt", [5, 6]), w0 - 0.25, atol=1e-6)
    expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                 lambda: smart.alter_table("pyc_alt", learning_rate=-1.0))
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: via.alter_table("nope", learning_rate=1.0))
    smart.drop_table("pyc_alt")

    # Durability names: both spellings, and nothing silently different.
    made = smart.create_table("pyc_wt", dim=2, durability="write-through")
    assert made.durability == config_pb2.WRITE_THROUGH, made
    try:
        smart.create_table("pyc_odd", dim=2, durability="sometimes")
        raise AssertionError("an unknown durability was accepted")
    except ValueError:
        pass

    # Pointed at a shard, the client says so.
    error = expect_error(grpc.StatusCode.FAILED_PRECONDITION, lambda: tessera.connect(shards[0]))
    assert "is it a tessera-shard?" in error.message, error.message

    # Export: a snapshot, then deltas; an import into a fresh table serves the same rows.
    rows = via.export("pyc", with_state=True)
    assert sorted(rows) == ["ids", "last_step", "state", "update_count", "weights"], sorted(rows)
    assert len(rows["ids"]) == len(np.unique(ids)) and rows["weights"].shape[1] == 6
    np.testing.assert_array_equal(smart.lookup("pyc", rows["ids"], read_only=True), rows["weights"])
    assert set(smart.export("pyc", since_step=1)["ids"]) == set(np.unique(ids))
    assert len(smart.export("pyc", since_step=2)["ids"]) == 0  # nothing updated since
    smart.create_table("pyc_copy", dim=6, optimizer="sgd", learning_rate=0.5, seed=99)
    assert smart.import_rows("pyc_copy", rows["ids"], rows["weights"], state=rows["state"],
                             last_step=rows["last_step"],
                             update_count=rows["update_count"]) == len(rows["ids"])
    np.testing.assert_array_equal(via.lookup("pyc_copy", ids), via.lookup("pyc", ids))
    smart.drop_table("pyc_copy")
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: via.lookup("pyc_copy", [1]))

    # Several tables in one request per shard: the rows one lookup per table reads, in
    # both modes; read-only creates nothing.
    smart.create_table("pyc_b", dim=3, optimizer="sgd", learning_rate=0.5, seed=5)
    other = rng.integers(0, 50, 400)
    for client in (smart, via):
        many = client.lookup_many({"pyc": ids, "pyc_b": other})
        np.testing.assert_array_equal(many["pyc"], client.lookup("pyc", ids))
        np.testing.assert_array_equal(many["pyc_b"], client.lookup("pyc_b", other))
    rows_before = sum(t.rows for t in smart.stats("pyc_b").tables)
    fresh = np.arange(10**6, 10**6 + 20)
    np.testing.assert_array_equal(via.lookup_many({"pyc_b": fresh}, read_only=True)["pyc_b"],
                                  smart.lookup_many({"pyc_b": fresh}, read_only=True)["pyc_b"])
    assert sum(t.rows for t in smart.stats("pyc_b").tables) == rows_before
    expect_error(grpc.StatusCode.NOT_FOUND, lambda: smart.lookup_many({"nope": [1]}))
    # ... and several tables' pushes in one request per shard: the rows move as one push
    # per table moves them, under one request id (a repeat applies nothing).
    g1 = rng.standard_normal((len(ids), 6)).astype(np.float32)
    g2 = rng.standard_normal((len(other), 3)).astype(np.float32)
    for client in (smart, via):
        a0, b0 = client.lookup("pyc", ids), client.lookup("pyc_b", other)
        rid = client.next_request_id()
        updated = client.push_many({"pyc": (ids, g1), "pyc_b": (other, g2)}, step=3,
                                   request_id=rid)
        assert updated == {"pyc": len(np.unique(ids)), "pyc_b": len(np.unique(other))}, updated
        a1, b1 = client.lookup("pyc", ids), client.lookup("pyc_b", other)
        client.push_many({"pyc": (ids, g1), "pyc_b": (other, g2)}, step=3, request_id=rid)
        np.testing.assert_array_equal(client.lookup("pyc", ids), a1)
        np.testing.assert_array_equal(client.lookup("pyc_b", other), b1)
        client.push("pyc", ids, -g1, step=4)  # undone table by table: back where it was
        client.push("pyc_b", other, -g2, step=4)
        np.testing.assert_allclose(client.lookup("pyc", ids), a0, atol=1e-5)
        np.testing.assert_allclose(client.lookup("pyc_b", other), b0, atol=1e-5)
    bad = np.full((len(other), 3), np.nan, dtype=np.float32)
    before_bad = smart.lookup("pyc", ids)
    expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                 lambda: smart.push_many({"pyc": (ids, g1), "pyc_b": (other, bad)}))
    np.testing.assert_array_equal(smart.lookup("pyc", ids), before_bad)  # nothing applied

    # Feature admission on the shards: an id gets its row at the push of its third step;
    # a push sent again under its request id counts nothing again.
    smart.create_table("pyc_adm", dim=4, optimizer="sgd", learning_rate=0.5, admit_min_count=3)
    fresh = np.arange(7 * 10**9, 7 * 10**9 + 300)
    initial = smart.lookup("pyc_adm", fresh)
    ones = np.ones((len(fresh), 4), np.float32)
    for client in (smart, via):
        rid = client.next_request_id()
        client.push("pyc_adm", fresh, ones, step=20, request_id=rid)
        client.push("pyc_adm", fresh, ones, step=20, request_id=rid)
        assert sum(t.rows for t in smart.stats("pyc_adm").tables) == 0
        np.testing.assert_array_equal(smart.lookup("pyc_adm", fresh), initial)
    # Each client's push was dropped once per id (its repeat was recognised, not counted).
    assert sum(t.admission_refused for t in smart.stats("pyc_adm").tables) == 600
    smart.push("pyc_adm", fresh[:100], ones[:100], step=21)  # their 3rd step: admitted
    assert sum(t.rows for t in smart.stats("pyc_adm").tables) == 100
    np.testing.assert_allclose(via.lookup("pyc_adm", fresh[:100]), initial[:100] - 0.5, atol=1e-6)
    np.testing.assert_array_equal(via.lookup("pyc_adm", fresh[100:]), initial[100:])
    assert smart.tables()["pyc_adm"].admission.min_count == 3

    # A fixed vocabulary: ids in [0, 1000) on every shard, others refused before any
    # shard changes.
    smart.create_table("pyc_fixed", dim=4, optimizer="sgd", learning_rate=0.5,
                       vocabulary_size=1000)
    vocab_ids = np.arange(0, 1000, 3)
    start = smart.lookup("pyc_fixed", vocab_ids)
    np.testing.assert_array_equal(start, via.lookup("pyc_fixed", vocab_ids))
    smart.push("pyc_fixed", vocab_ids, np.ones((len(vocab_ids), 4), np.float32), step=30)
    np.testing.assert_allclose(via.lookup("pyc_fixed", vocab_ids), start - 0.5, atol=1e-6)
    for client in (smart, via):
        error = expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                             lambda: client.push("pyc_fixed", [1, 1000], np.ones((2, 4), np.float32)))
        assert "outside its vocabulary" in error.message, error.message
        expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: client.lookup("pyc_fixed", [-1]))
    np.testing.assert_allclose(smart.lookup("pyc_fixed", vocab_ids), start - 0.5, atol=1e-6)
    assert sum(t.rows for t in smart.stats("pyc_fixed").tables) == len(vocab_ids)

    # A push refused by one shard changes no row on any: every shard checks its part first.
    # A row budget of 40 (20 a shard) cannot take 30 new rows on shard 0; shard 1's 5 fit.
    smart.create_table("pyc_budget", dim=2, optimizer="sgd", learning_rate=0.5, max_rows=40)
    candidates = np.arange(1, 2000, dtype=np.int64)
    owners = tessera.shard_of(candidates, smart.tables()["pyc_budget"].seed, 2)
    both = np.concatenate([candidates[owners == 0][:30], candidates[owners == 1][:5]])
    before = smart.lookup("pyc_budget", both, read_only=True)
    for client in (smart, via):
        expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED,
                     lambda: client.push("pyc_budget", both, np.ones((len(both), 2))))
        expect_error(grpc.StatusCode.RESOURCE_EXHAUSTED, lambda: client.push_many(
            {"pyc_budget": (both, np.ones((len(both), 2)))}))
    np.testing.assert_array_equal(smart.lookup("pyc_budget", both, read_only=True), before)
    assert sum(t.rows for t in smart.stats("pyc_budget").tables) == 0

    smart.checkpoint(12)
    assert 12 in [c.step for c in smart.checkpoints().checkpoints]
    # A restore of every model needs all_models: in the client and on the coordinator.
    expect_error(grpc.StatusCode.INVALID_ARGUMENT, lambda: smart.restore(12))
    error = expect_error(grpc.StatusCode.INVALID_ARGUMENT,
                         lambda: smart._call(smart._stub.Restore, api.RestoreRequest(step=12)))
    assert "--all_models" in error.message, error.message
    smart.create_table("pyc_late", dim=2)
    smart.drop_table("pyc_b")
    restored = smart.restore(12, all_models=True)
    assert restored.checkpoint.step == 12, restored
    assert "pyc_late" in restored.dropped and "pyc_b" in restored.brought_back, restored
    assert "pyc" in restored.rolled_back and "pyc" not in restored.dropped, restored
    assert "pyc_late" not in smart.tables() and "pyc_b" in smart.tables()
    smart.close()
    via.close()
    print("python cluster check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7000"))
