"""Scores a run's held-out lines on a serving replica: the end of train, serve, query.

    deploy/local/cluster.sh start 2 && deploy/local/cluster.sh serve clicks
    PYTHONPATH=build/python /usr/bin/python3 examples/python/torch_dlrm.py \\
        --make_data=50000 --data=/tmp/clicks.tsv
    ./build/tessera-train --coordinator=127.0.0.1:7000 --model=clicks \\
        --data=/tmp/clicks.tsv --steps=500 --publish_dense_every=50
    PYTHONPATH=build/python /usr/bin/python3 examples/python/query_replica.py \\
        127.0.0.1:7100 /tmp/clicks.tsv

prints the replica's status, the held-out AUC and logloss of its scores (the numbers
tessera-train printed for the same step's weights) and Predict's latency per batch size.
"""
import argparse
import time

import numpy as np

import tessera
from tessera import criteo


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("replica", help="host:port of tessera-serve")
    parser.add_argument("data", help="the Criteo-format TSV the model trained on")
    parser.add_argument("--seed", type=int, default=1, help="tessera-train's --seed")
    args = parser.parse_args()
    replica = tessera.connect(args.replica)
    if not isinstance(replica, tessera.ServingClient):
        raise SystemExit(f"{args.replica} is not a serving replica (tessera-serve)")
    status = replica.status()
    print(f"replica of '{status['model']}': rows at step {status['serving_step']}, dense "
          f"weights of step {status['dense_step']}, {status['shards_caught_up']} of "
          f"{status['shards']} shards caught up")
    labels, dense, ids = criteo.read(args.data, seed=args.seed)
    scores = np.concatenate([replica.predict(dense[b:b + 1024], list(ids[:, b:b + 1024]))
                             for b in range(0, len(labels), 1024)])
    print(f"held-out: {len(labels)} samples  logloss {criteo.log_loss(scores, labels):.5f}  "
          f"auc {criteo.exact_auc(scores, labels):.5f}")
    for batch in (1, 64, 512):
        took = []
        for b in range(0, min(len(labels), 200 * batch), batch):
            start = time.perf_counter()
            replica.predict(dense[b:b + batch], list(ids[:, b:b + batch]))
            took.append(time.perf_counter() - start)
        took = np.array(took) * 1e3
        print(f"predict batch {batch:4d}: p50 {np.percentile(took, 50):.2f} ms  "
              f"p99 {np.percentile(took, 99):.2f} ms")


if __name__ == "__main__":
    main()
