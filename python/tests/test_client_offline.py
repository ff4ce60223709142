"""Parts of the client that need no server: routing, wire encoding, pooling."""
import os
import unittest

import grpc
import numpy as np

from tessera import client, sharding, wire
from tessera.checks import TesseraError, _check_gradients, _pool, as_ids, check_lookup
from tessera.tables import parse_enum, table_config
from tessera.v1 import config_pb2
from tessera.v1 import embedding_service_pb2 as api


GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data",
                      "shard_of_golden.txt")
CRITEO_GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data",
                             "criteo_golden.txt")
CHECKS_GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data",
                             "lookup_checks_golden.txt")


def golden_checks():
    """The lines of lookup_checks_golden.txt: (kind, ids, offsets or [dim], values, message),
    with None for a list given as "-"."""
    def numbers(field, kind):
        return None if field == "-" else [kind(v) for v in field.split(",")]
    with open(CHECKS_GOLDEN) as golden:
        for line in golden:
            if not line.strip() or line.startswith("#"):
                continue
            kind, ids, shape, values, message = line.rstrip("\n").split("\t")
            yield kind, numbers(ids, int), numbers(shape, int), numbers(values, float), message


class CriteoTest(unittest.TestCase):
    def test_lines_read_as_the_golden_values_the_cpp_reader_checks_too(self):
        from tessera import criteo
        lines = held = 0
        with open(CRITEO_GOLDEN) as golden:
            for text in golden:
                if not text.strip() or text.startswith("#"):
                    continue
                kind, _, rest = text.rstrip("\n").partition(" ")
                if kind == "line":
                    _, dense, ids = criteo.parse_line(rest.replace("|", "\t"))
                    lines += 1
                elif kind == "dense":
                    want = np.array([float(x) for x in rest.split()], dtype=np.float32)
                    self.assertEqual(np.array(dense, dtype=np.float32).tobytes(), want.tobytes())
                elif kind == "ids":
                    self.assertEqual(ids, [int(x) for x in rest.split()])
                elif kind == "held_out":
                    seed, fraction, *numbers = rest.split()
                    got = [n for n in range(1, 2001)
                           if criteo.held_out_line(n, int(seed), float(fraction))]
                    self.assertEqual(got, [int(n) for n in numbers])
                    held += 1
        self.assertEqual((lines, held), (3, 2))


class ShardingTest(unittest.TestCase):
    def test_shard_of_matches_the_golden_values_the_cpp_tests_check_too(self):
        checked = 0
        with open(GOLDEN) as golden:
            for line in golden:
                if not line.strip() or line.startswith("#"):
                    continue
                id_, seed, shards, shard = (int(f) for f in line.split())
                got = int(sharding.shard_of(np.array([id_], np.int64), seed, shards)[0])
                self.assertEqual(got, shard, line)
                checked += 1
        self.assertGreater(checked, 300)

    def test_mix64_matches_splitmix64_reference_values(self):
        # splitmix64's finaliser of 0 and 1, as the C++ Mix64 computes them.
        self.assertEqual(int(sharding.mix64(np.array([0], np.uint64))[0]), 0)
        self.assertEqual(int(sharding.mix64(np.array([1], np.uint64))[0]), 0x5692161D100B05E5)

    def test_jump_hash_matches_the_papers_reference(self):
        # Values from Lamping & Veach's reference implementation.
        self.assertEqual(int(sharding.jump_consistent_hash(np.array([0], np.uint64), 10)[0]), 0)
        keys = np.arange(1000, dtype=np.uint64)
        for n in (1, 2, 7, 100):
            b = sharding.jump_consistent_hash(keys, n)
            self.assertTrue(np.all((b >= 0) & (b < n)))
        # Growing from n to n+1 buckets moves keys only to the new bucket.
        before = sharding.jump_consistent_hash(keys, 5)
        after = sharding.jump_consistent_hash(keys, 6)
        moved = before != after
        self.assertTrue(np.all(after[moved] == 5))
        self.assertLess(moved.mean(), 0.3)

    def test_shard_of_spreads_ids_evenly(self):
        ids = np.arange(-50000, 50000, dtype=np.int64)
        counts = np.bincount(sharding.shard_of(ids, 1234, 4), minlength=4)
        self.assertTrue(np.all(np.abs(counts - 25000) < 1000), counts)


class WireTest(unittest.TestCase):
    def test_lookup_response_bytes_decode_to_the_same_array(self):
        values = np.random.default_rng(1).standard_normal(300).astype(np.float32)
        message = api.LookupResponse(dim=3, values=values.tolist())
        dim, decoded = wire.decode_lookup_response(message.SerializeToString())
        self.assertEqual(dim, 3)
        np.testing.assert_array_equal(decoded, values)
        dim, empty = wire.decode_lookup_response(api.LookupResponse(dim=3).SerializeToString())
        self.assertEqual(len(empty), 0)

    def test_push_request_bytes_parse_as_the_message(self):
        ids = np.array([5, -7, 1 << 60], dtype=np.int64)
        grads = np.arange(6, dtype=np.float32).reshape(3, 2)
        data = wire.encode_push_request("user", ids, grads, step=9, shard_map_version=4)
        message = api.PushGradientsRequest.FromString(data)
        self.assertEqual(message.table, "user")
        self.assertEqual(list(message.ids), ids.tolist())
        self.assertEqual(list(message.gradients), grads.ravel().tolist())
        self.assertEqual((message.step, message.shard_map_version), (9, 4))


class PoolTest(unittest.TestCase):
    def test_sum_mean_weights_and_empty_bags(self):
        rows = np.array([[1, 2], [3, 4], [5, 6]], dtype=np.float32)
        offsets = np.array([0, 2, 2, 3])
        np.testing.assert_array_equal(_pool(rows, offsets, None, "sum"), [[4, 6], [0, 0], [5, 6]])
        np.testing.assert_array_equal(_pool(rows, offsets, None, "mean"), [[2, 3], [0, 0], [5, 6]])
        # sqrtn: the sum times float32(1 / sqrt(count)), as the servers compute it.
        half = np.float32(1) / np.sqrt(np.float32(2))
        np.testing.assert_array_equal(_pool(rows, offsets, None, "sqrtn"),
                                      np.array([[4 * half, 6 * half], [0, 0], [5, 6]], np.float32))
        four = np.array([[1, 2]] * 4, dtype=np.float32)
        np.testing.assert_array_equal(_pool(four, np.array([0, 4]), None, "sqrtn"), [[2, 4]])
        np.testing.assert_array_equal(_pool(rows, offsets, [1, 0.5, 2], "sum"),
                                      [[2.5, 4], [0, 0], [10, 12]])
        with self.assertRaises(TesseraError):
            _pool(rows, np.array([0, 2]), None, "sum")


class RequestCheckTest(unittest.TestCase):
    def test_ids_are_64_bit_patterns_and_floats_are_refused(self):
        self.assertEqual(as_ids(np.array([2**64 - 1, 5], np.uint64)).tolist(), [-1, 5])
        self.assertEqual(as_ids([2**64 - 1]).tolist(), [-1])
        self.assertEqual(as_ids(np.uint64(2**63)).tolist(), [-2**63])
        self.assertEqual(as_ids([-3, 7]).tolist(), [-3, 7])
        self.assertEqual(as_ids([]).dtype, np.int64)
        for bad in ([1.5], np.array([1.0]), [2**64], [-2**63 - 1], ["7"], [True]):
            with self.assertRaises(TesseraError, msg=repr(bad)):
                as_ids(bad)

    def test_ids_of_more_than_one_dimension_are_refused(self):
        for bad in (np.array([[1, 2], [3, 4]]), [[1], [2]], np.zeros((2, 1, 1), np.uint64)):
            with self.assertRaises(TesseraError, msg=repr(bad)) as raised:
                as_ids(bad)
            self.assertIn("one-dimensional", raised.exception.message)

    def test_gradients_must_have_the_shape_of_the_rows(self):
        config = config_pb2.TableConfig(name="t", dim=4)
        ids = np.array([1, 2, 3])
        grads = np.arange(12, dtype=np.float32).reshape(3, 4)
        np.testing.assert_array_equal(_check_gradients(config, ids, grads), grads)
        # Same element count, other shapes: a transposed array is not read row-major.
        for bad in (grads.reshape(4, 3), grads.reshape(3, 2, 2), grads.ravel(), grads[:2]):
            with self.assertRaises(TesseraError, msg=repr(bad.shape)) as raised:
                _check_gradients(config, ids, bad)
            self.assertIn("shape (3, 4) expected", raised.exception.message)

    def test_lookup_checks_match_the_servers(self):
        offsets, weights = check_lookup(3, [0, 1, 3], [1, 2, 3], "mean")
        self.assertEqual(offsets.tolist(), [0, 1, 3])
        self.assertEqual(weights.dtype, np.float32)
        for offsets, weights, pooling in (([0, 1], None, "sum"),        # ends short of 3 ids
                                          ([1, 3], None, "sum"),        # starts past 0
                                          ([0, 2, 1, 3], None, "sum"),  # decreases
                                          ([0, 3], [1, 2], "sum"),      # 2 weights, 3 ids
                                          ([0, 3], [1, np.inf, 2], "sum"),
                                          (None, [1, 1, 1], "sum"),     # weights, no bags
                                          ([0, 3], None, "max")):
            with self.assertRaises(TesseraError, msg=repr((offsets, weights, pooling))):
                check_lookup(3, offsets, weights, pooling)
        # The servers' words (embedding/batch_ops.cc), with where it happened in front: the
        # golden file the C++ tests check the servers against too.
        checked = 0
        for kind, ids, shape, values, message in golden_checks():
            with self.assertRaises(TesseraError, msg=message) as raised:
                if kind == "lookup":
                    check_lookup(len(ids), shape, values, "sum", "table 'ads'")
                else:
                    dim = int(shape[0])
                    _check_gradients(table_config("ads", dim=dim), as_ids(ids),
                                     np.array(values, dtype=np.float32).reshape(-1, dim))
            self.assertEqual(raised.exception.message, "table 'ads': " + message)
            checked += 1
        self.assertGreaterEqual(checked, 8)


class TableConfigTest(unittest.TestCase):
    def test_enum_names_in_any_case_and_the_trainers_defaults(self):
        for name in ("write_through", "WRITE_THROUGH", "write-through", "Write_Through"):
            self.assertEqual(parse_enum("durability", name, {"write_through": 1}), 1)
        with self.assertRaises(ValueError):
            parse_enum("durability", "sometimes", {"write_through": 1})
        config = table_config("t", 8, durability="WRITE_THROUGH", eviction="EVICTION_LRU",
                              optimizer="ADAM", dtype="BF16", beta1=0.8, clip_norm=1.5,
                              ttl_steps=100, initializer="normal", init_scale=0.1)
        self.assertEqual(config.durability, config_pb2.WRITE_THROUGH)
        self.assertEqual(config.eviction.policy, config_pb2.EVICTION_LRU)
        self.assertEqual(config.eviction.ttl_steps, 100)
        self.assertFalse(config.HasField("admission"))
        admitted = table_config("t", 8, admit_min_count=4, admit_probability=0.5)
        self.assertEqual(admitted.admission.min_count, 4)
        self.assertAlmostEqual(admitted.admission.probability, 0.5)
        self.assertEqual(config.optimizer.type, config_pb2.ADAM)
        self.assertEqual(config.dtype, config_pb2.BF16)
        self.assertAlmostEqual(config.optimizer.beta1, 0.8, places=6)
        self.assertAlmostEqual(config.optimizer.clip_norm, 1.5)
        self.assertFalse(config.optimizer.HasField("beta2"))  # the server's default
        self.assertEqual(config.initializer.type, config_pb2.NORMAL)
        # tessera-train's and tessera-cli create's defaults.
        default = table_config("t", 8)
        self.assertEqual(default.optimizer.type, config_pb2.ADAGRAD)
        self.assertAlmostEqual(default.optimizer.learning_rate, 0.05)
        self.assertEqual(default.seed, 1)
        self.assertAlmostEqual(default.initializer.scale, 0.05)
        with self.assertRaises(ValueError):
            table_config("t", 8, momentum=0.9)


class _Failure(grpc.RpcError):
    def __init__(self, code):
        super().__init__()
        self._code = code

    def code(self):
        return self._code

    def details(self):
        return "injected"


class RetryTest(unittest.TestCase):
    def failing(self, codes):
        """A method that fails with `codes`, one a call, then answers "done"."""
        calls = []

        def method(request, timeout, metadata):
            calls.append(request)
            if len(calls) <= len(codes):
                raise _Failure(codes[len(calls) - 1])
            return "done"
        return method, calls

    def test_unavailable_and_a_shutting_down_servers_cancelled_are_retried(self):
        method, calls = self.failing([grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED])
        self.assertEqual(client.call_with_retries(method, "r", 1.0, (), retries=2), "done")
        self.assertEqual(calls, ["r"] * 3)

    def test_other_codes_and_spent_retries_fail_with_the_servers_code(self):
        method, calls = self.failing([grpc.StatusCode.INVALID_ARGUMENT])
        with self.assertRaises(TesseraError) as failed:
            client.call_with_retries(method, "r", 1.0, (), retries=2)
        self.assertEqual(failed.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertEqual(len(calls), 1)
        method, calls = self.failing([grpc.StatusCode.CANCELLED] * 3)
        with self.assertRaises(TesseraError) as failed:
            client.call_with_retries(method, "r", 1.0, (), retries=2)
        self.assertEqual(failed.exception.code, grpc.StatusCode.CANCELLED)
        self.assertEqual(len(calls), 3)


if __name__ == "__main__":
    unittest.main()
