#!/usr/bin/env python3
"""Calls a Tessera coordinator from Python with stock gRPC and stubs generated from
proto/: creates a table, looks rows up, pushes gradients and reads the update back.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/embedding_client.py 127.0.0.1:7000

The stubs (tessera/v1/*_pb2*.py) are generated into build/python by the build; put that
folder on PYTHONPATH.
"""
import sys

import grpc

from tessera.v1 import config_pb2, embedding_service_pb2 as api, embedding_service_pb2_grpc


def main(address: str) -> int:
    channel = grpc.insecure_channel(address)
    grpc.channel_ready_future(channel).result(timeout=10)
    stub = embedding_service_pb2_grpc.CoordinatorStub(channel)

    dim, lr = 4, 0.5
    config = config_pb2.TableConfig(
        name="py_user", dim=dim, seed=7,
        optimizer=config_pb2.OptimizerConfig(type=config_pb2.SGD, learning_rate=lr))
    stub.CreateTable(api.CreateTableRequest(config=config), timeout=5)

    ids = [11, 22, 11]
    before = stub.Lookup(api.LookupRequest(table="py_user", ids=ids), timeout=5)
    assert before.dim == dim and len(before.values) == len(ids) * dim
    rows = [before.values[i * dim:(i + 1) * dim] for i in range(len(ids))]
    assert rows[0] == rows[2], "the same id reads the same row"

    # Repeated ids are summed: id 11 moves by lr * (1 + 1), id 22 by lr * 2 in every column.
    grads = [1.0] * dim + [2.0] * dim + [1.0] * dim
    pushed = stub.PushGradients(
        api.PushGradientsRequest(table="py_user", ids=ids, gradients=grads, step=1), timeout=5)
    assert pushed.rows_updated == 2, pushed
    after = stub.Lookup(api.LookupRequest(table="py_user", ids=[11, 22]), timeout=5)
    for j in range(dim):
        assert abs(after.values[j] - (rows[0][j] - 2 * lr)) < 1e-6
        assert abs(after.values[dim + j] - (rows[1][j] - 2 * lr)) < 1e-6

    # Pooled bags: one bag of both ids, mean pooling.
    pooled = stub.Lookup(api.LookupRequest(table="py_user", ids=[11, 22], offsets=[0, 2],
                                           pooling=config_pb2.MEAN), timeout=5)
    for j in range(dim):
        assert abs(pooled.values[j] - (after.values[j] + after.values[dim + j]) / 2) < 1e-6

    # Errors arrive as gRPC status codes.
    try:
        stub.Lookup(api.LookupRequest(table="missing", ids=[1]), timeout=5)
        raise AssertionError("unknown table must fail")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.NOT_FOUND, e
    try:
        stub.PushGradients(api.PushGradientsRequest(table="py_user", ids=[11],
                                                    gradients=[float("nan")] * dim), timeout=5)
        raise AssertionError("NaN gradient must fail")
    except grpc.RpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e

    print("python client: ok (table py_user, %d rows checked)" % len(ids))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7000"))
