"""A serving replica against the cluster it follows, once training has ended:

    serving_check.py wait-and-check COORDINATOR REPLICA MODEL DATA.tsv METRICS.jsonl

waits (bounded) until the replica has read every shard to its head and holds the dense
network of the run's last step, then checks that every stored row of the model's tables
reads the same on the replica, bit for bit, and that the replica's scores of the run's
held-out lines give the trainer's own evaluation (AUC and logloss as tessera-train wrote
them). --expect_event=TEXT (repeatable): one of the replica's events must say TEXT (what
made it read a shard whole). Exit status 1 with what differs otherwise.
"""
import json
import sys
import time

import numpy as np

import tessera
from tessera import criteo

NUM_SPARSE = criteo.NUM_SPARSE


def main():
    _, coordinator, address, model, data, metrics = sys.argv[1:7]
    expected = [a.split("=", 1)[1] for a in sys.argv[7:] if a.startswith("--expect_event=")]
    evals = [json.loads(l) for l in open(metrics) if '"event":"eval"' in l]
    if not evals:
        sys.exit("FAIL: the run wrote no evaluation")
    last = evals[-1]
    replica = tessera.connect(address, retries=20)
    if not isinstance(replica, tessera.ServingClient):
        sys.exit(f"FAIL: {address} is not taken for a serving replica")
    client = tessera.connect(coordinator)
    shards = len(client.shard_map()[1])
    status = {}
    for _ in range(600):
        status = replica.status()
        if (status["shards"] == shards and status["shards_caught_up"] == shards
                and status["dense_step"] == last["step"]):
            break
        time.sleep(0.1)
    else:
        sys.exit(f"FAIL: the replica did not catch up with step {last['step']}: {status}")
    print(f"replica: serving step {status['serving_step']}, dense step {status['dense_step']}, "
          f"{status['snapshots']} shard snapshot(s); events: {status['events']}")
    for text in expected:
        if not any(text in e for e in status["events"]):
            sys.exit(f"FAIL: no event of the replica says '{text}'")
    rows = 0
    for f in range(1, NUM_SPARSE + 1):
        table = f"{model}.C{f}"
        stored = client.export(table)
        got = replica.lookup(table, stored["ids"])
        if got.tobytes() != stored["weights"].tobytes():
            differ = int(np.sum(np.any(got != stored["weights"], axis=1)))
            sys.exit(f"FAIL: {table}: {differ} of {len(stored['ids'])} rows differ")
        rows += len(stored["ids"])
    print(f"rows: all {rows} stored rows of {NUM_SPARSE} tables equal, bit for bit")
    labels, dense, ids = criteo.read(data)
    scores = np.concatenate([
        replica.predict(dense[b:b + 512], [ids[f][b:b + 512] for f in range(NUM_SPARSE)])
        for b in range(0, len(labels), 512)])
    auc, loss = criteo.exact_auc(scores, labels), criteo.log_loss(scores, labels)
    print(f"predict: {len(labels)} held-out samples, auc {auc:.6f} logloss {loss:.6f}; "
          f"the trainer's: auc {last['auc']:.6f} logloss {last['logloss']:.6f}")
    if f"{auc:.6f}" != f"{last['auc']:.6f}" or abs(loss - last["logloss"]) > 2e-6:
        sys.exit("FAIL: the replica's scores are not the trainer's evaluation")


if __name__ == "__main__":
    main()
