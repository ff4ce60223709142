#!/usr/bin/env python3
"""validate.py accepts the shipped manifests and rejects each kind of mistake."""
import io
import os
import shutil
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import validate  # noqa: E402


class ValidateTest(unittest.TestCase):
    def run_on(self, edits=()):
        with tempfile.TemporaryDirectory() as d:
            for name in os.listdir(HERE):
                if name.endswith(".yaml"):
                    shutil.copy(os.path.join(HERE, name), d)
            for name, old, new in edits:
                path = os.path.join(d, name)
                text = open(path).read()
                self.assertIn(old, text)
                open(path, "w").write(text.replace(old, new, 1))
            out = io.StringIO()
            with redirect_stdout(out):
                rc = validate.main(d)
            return rc, out.getvalue()

    def test_shipped_manifests_are_valid(self):
        rc, out = self.run_on()
        self.assertEqual(rc, 0, out)

    def test_each_mistake_is_named(self):
        cases = [
            (("shards.yaml", "replicas: 4", "replicas: 3"), "differs from replicas"),
            (("coordinator.yaml", "tessera-shard-3.tessera-shard:7001", "tessera-shard-9.tessera-shard:7001"),
             "shard 3 should be"),
            (("shards.yaml", "      port: 7001\n            periodSeconds: 5",
              "      port: 7777\n            periodSeconds: 5"), "readinessProbe port 7777"),
            (("coordinator.yaml", "  selector:\n    app.kubernetes.io/name: tessera-coordinator",
              "  selector:\n    app.kubernetes.io/name: nothing"), "selects no pods"),
            (("train-job.yaml", "restartPolicy: OnFailure", "restartPolicy: Always"), "restartPolicy"),
            (("coordinator.yaml", "runAsNonRoot: true", "runAsNonRoot: false"), "runAsNonRoot"),
            (("configmap-tables.yaml", '"dim": 16', '"dim": 0'), "needs a dim"),
            (("shards.yaml", "mountPath: /data", "mountPath: /data\n            - name: scratch\n              mountPath: /tmp"),
             "unknown volume 'scratch'"),
            (("kustomization.yaml", "  - train-job.yaml", "  - missing.yaml"), "missing.yaml missing"),
            (("train-job.yaml", "            - --resume=auto\n", ""), "must pass --resume=auto"),
            (("train-job.yaml", "            - --model=criteo\n", ""), "needs one --model"),
            (("configmap-tables.yaml", '"name": "criteo.C7"', '"name": "C7"'),
             "are not of the Job's model 'criteo'"),
            (("train-job.yaml", "  completionMode: Indexed\n", ""), "needs completionMode: Indexed"),
            (("train-job.yaml", "  parallelism: 2\n", "  parallelism: 1\n"),
             "needs completions and parallelism of 2"),
            (("train-job.yaml", "--worker_index=$(WORKER_INDEX)", "--worker_index=0"),
             "--worker_index must be the pod's completion index"),
            (("train-job.yaml", "metadata.annotations['batch.kubernetes.io/job-completion-index']",
              "metadata.name"), "--worker_index must be the pod's completion index"),
            (("train-job.yaml", "            - --checkpoint_every=5000\n", ""),
             "needs --checkpoint_every"),
            (("serving.yaml", "--model=criteo", "--model=ads"), "the Job trains 'criteo'"),
            (("train-job.yaml", "            - --publish_dense_every=500\n", ""),
             "publishes no dense network"),
            (("serving.yaml", "livenessProbe:\n            tcpSocket:", "livenessProbe:\n            grpc:"),
             "livenessProbe must not be grpc"),
            (("serving.yaml", "readinessProbe:\n            grpc:", "readinessProbe:\n            tcpSocket:"),
             "readinessProbe must be grpc"),
        ]
        for edit, message in cases:
            rc, out = self.run_on([edit])
            self.assertEqual(rc, 1, f"{edit} passed:\n{out}")
            self.assertIn(message, out, edit)


if __name__ == "__main__":
    unittest.main()
