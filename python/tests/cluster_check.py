#!/usr/bin/env python3
"""The Python client against a running cluster (tests/python_client_test.sh starts one):
smart and coordinator modes agree, pooling, errors as TesseraError with gRPC codes,
read-only lookups, checkpoints.

    python3 python/tests/cluster_check.py 127.0.0.1:7000
"""
import sys

import grpc
import numpy as np

import tessera


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

    smart.checkpoint(12)
    assert 12 in [c.step for c in smart.checkpoints().checkpoints]
    smart.close()
    via.close()
    print("python cluster check: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7000"))
