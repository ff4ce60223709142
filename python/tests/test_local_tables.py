"""tessera.local: the C++ core in this process (tessera._core), without a server."""
import tempfile
import unittest

import grpc
import numpy as np

import tessera


class LocalTablesTest(unittest.TestCase):
    def test_pushes_apply_the_tables_optimizer_once_per_distinct_id(self):
        tables = tessera.local()
        tables.create_table("m.a", 4, optimizer="sgd", learning_rate=0.5)
        before = tables.lookup("m.a", [1, 2, 3])
        updated = tables.push_many({"m.a": ([1, 1, 2], np.ones((3, 4)))}, step=0)
        self.assertEqual(updated, {"m.a": 2})
        after = tables.lookup("m.a", [1, 2, 3])
        np.testing.assert_array_equal(after[0], before[0] - np.float32(1.0))  # 2 x 0.5
        np.testing.assert_array_equal(after[1], before[1] - np.float32(0.5))
        np.testing.assert_array_equal(after[2], before[2])  # looked up, not pushed
        pooled = tables.lookup("m.a", [1, 2, 3], offsets=[0, 2, 3])
        np.testing.assert_allclose(pooled[0], after[0] + after[1], rtol=1e-6)

    def test_read_only_lookups_create_no_row(self):
        tables = tessera.local()
        tables.create_table("m.r", 8)
        tables.lookup("m.r", np.arange(10), read_only=True)
        self.assertEqual(tables.trained_rows(["m.r"]), {})
        tables.lookup("m.r", np.arange(10))
        self.assertEqual(tables.stats("m.r").tables[0].rows, 10)

    def test_errors_carry_the_cores_codes_and_change_nothing(self):
        tables = tessera.local()
        tables.create_table("m.e", 4, vocabulary_size=100)
        cases = [(lambda: tables.lookup("m.none", [1]), grpc.StatusCode.NOT_FOUND, "not found"),
                 (lambda: tables.lookup("m.e", [100]), grpc.StatusCode.INVALID_ARGUMENT, "100"),
                 (lambda: tables.push_many({"m.e": ([1], np.ones((1, 3)))}),
                  grpc.StatusCode.INVALID_ARGUMENT, "gradients of shape"),
                 (lambda: tables.push_many({"m.e": ([1, 2], [[0, 0, 0, 0], [np.inf, 0, 0, 0]])}),
                  grpc.StatusCode.INVALID_ARGUMENT, "is inf"),
                 (lambda: tables.checkpoint(1), grpc.StatusCode.FAILED_PRECONDITION, "data_dir"),
                 (lambda: tables.create_table("m.e", 8), grpc.StatusCode.ALREADY_EXISTS, "m.e")]
        for call, code, words in cases:
            with self.assertRaises(tessera.TesseraError) as raised:
                call()
            self.assertEqual(raised.exception.code, code, raised.exception)
            self.assertIn(words, raised.exception.message)
        self.assertEqual(tables.trained_rows(["m.e"]), {})

    def test_pooled_lookups_and_their_gradients_of_several_tables(self):
        tables = tessera.local()
        for name in ("m.p", "m.q"):
            tables.create_table(name, 4, optimizer="sgd", learning_rate=1.0)
        tables.create_table("m.wide", 8)
        ids = [np.array([3, 4, 3, 9]), np.array([1, 2, 2, 2])]
        offsets = [np.array([0, 1, 4]), np.array([0, 2, 4])]
        pooled = tables.pooled_lookup(["m.p", "m.q"], ids, offsets)
        self.assertEqual(pooled.shape, (2, 2, 4))
        rows = tables.lookup("m.p", [3, 4, 9])
        np.testing.assert_array_equal(pooled[0, 1], (rows[1] + rows[0]) + rows[2])
        grads = np.arange(16, dtype=np.float32).reshape(2, 2, 4)
        summed = tables.pooled_gradients(["m.p", "m.q"], ids, offsets, grads)
        unique, g = summed["m.p"]
        np.testing.assert_array_equal(unique, [3, 4, 9])  # in order of first sight
        np.testing.assert_array_equal(g[0], grads[0, 0] + grads[0, 1])  # 3 is in both bags
        np.testing.assert_array_equal(g[1], grads[0, 1])
        unique, g = summed["m.q"]
        np.testing.assert_array_equal(unique, [1, 2])
        np.testing.assert_array_equal(g[1], grads[1, 0] + grads[1, 1] + grads[1, 1])
        for bad in (lambda: tables.pooled_lookup(["m.p", "m.wide"], ids, offsets),
                    lambda: tables.pooled_lookup(["m.p"], [ids[0]], [np.array([0, 5])]),
                    lambda: tables.pooled_gradients(["m.p"], [ids[0]], [offsets[0]], grads)):
            with self.assertRaises(tessera.TesseraError) as raised:
                bad()
            self.assertEqual(raised.exception.code, grpc.StatusCode.INVALID_ARGUMENT)

    def test_eviction_keeps_a_table_within_its_rows(self):
        tables = tessera.local()
        tables.create_table("m.lru", 4, max_rows=100, eviction="lru")
        for step in range(5):
            ids = np.arange(step * 100, step * 100 + 100)
            tables.push_many({"m.lru": (ids, np.ones((100, 4)))}, step=step)
        usage = tables.stats("m.lru").tables[0]
        self.assertLessEqual(usage.rows, 100)
        self.assertGreaterEqual(usage.evictions, 400)

    def test_a_data_directory_keeps_rows_and_checkpoints(self):
        with tempfile.TemporaryDirectory() as directory:
            tables = tessera.local(data_dir=directory)
            tables.create_table("m.d", 4, optimizer="adagrad")
            tables.push_many({"m.d": ([5, 6], np.ones((2, 4)))}, step=0)
            at_1 = tables.lookup("m.d", [5, 6]).copy()
            info = tables.checkpoint(1, "m", {"note": b"one"})
            self.assertEqual((info["model"], info["step"], info["rows"]), ("m", 1, 2))
            tables.push_many({"m.d": ([5], np.ones((1, 4)))}, step=1)
            self.assertFalse(np.array_equal(tables.lookup("m.d", [5, 6]), at_1))
            restored, attachments = tables.restore(1, "m")
            self.assertEqual(restored["step"], 1)
            self.assertEqual(attachments, {"note": b"one"})
            np.testing.assert_array_equal(tables.lookup("m.d", [5, 6]), at_1)
            self.assertEqual([c["step"] for c in tables.checkpoints()], [1])
            tables.close()
            # Opened again: the tables and the checkpoint's rows are there.
            again = tessera.local(data_dir=directory)
            self.assertIn("m.d", again.tables())
            np.testing.assert_array_equal(again.lookup("m.d", [5, 6]), at_1)


if __name__ == "__main__":
    unittest.main()
