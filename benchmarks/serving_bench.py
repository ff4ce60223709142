#!/usr/bin/env python3
"""Serving replicas (tessera-serve) beside training, on one machine, side by side in one run:

- cost: tessera-train's samples/s through a 2-shard cluster with 0, 1 and 4 replicas
  following its model (each three times, alternating);
- freshness: while tessera-train runs at full speed, the time from a push acknowledged to
  its row read the same on a replica (p50, p99);
- serving: Lookup and Predict latency and throughput (one client) at batch 1, 64 and 512,
  with training running and without;
- catch-up: a replica stopped (SIGSTOP) for PAUSE_S seconds of training, then let go: how
  long and how many bytes until it is at the head again; a new replica instead (a snapshot
  of every shard); and one killed (SIGKILL) for PAUSE_S seconds, restarted on its
  --state_dir;
- the stream's cost: a table of BIG_ROWS rows, a replica's snapshot of it against the bytes
  it reads after pushes touch 1% of its rows;
- formats: held-out AUC and bytes per row through fp32, fp16 and int8 replicas of a model
  trained on a generated Criteo-format TSV.

    /usr/bin/python3 benchmarks/serving_bench.py [BUILD_DIR] [PAUSE_S] [BIG_ROWS] [PHASES]

PHASES: a comma-separated subset of cost,fresh,formats,stream (default: all).

Every process listens on 127.0.0.1 only. Prints a Markdown report.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build")
PAUSE_S = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
BIG_ROWS = int(sys.argv[3]) if len(sys.argv) > 3 else 10_000_000
PHASES = (sys.argv[4] if len(sys.argv) > 4 else "cost,fresh,formats,stream").split(",")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(BUILD, "python"))
import tessera  # noqa: E402
from tessera import criteo  # noqa: E402

PROCS = []
LOG = open(os.path.join(tempfile.gettempdir(), "serving_bench.log"), "w")


def start(args):
    """A server; its address from the first stdout line ('... listening on HOST:PORT')."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=LOG, text=True)
    PROCS.append(p)
    line = p.stdout.readline()
    m = re.search(r"listening on (\S+)", line)
    if not m:
        raise SystemExit(f"{args[0]} did not start: {line!r} (see {LOG.name})")
    return p, m.group(1)


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def replica(coordinator, model, fmt="fp32", extra=()):
    return start([f"{BUILD}/tessera-serve", "--port=0", f"--coordinator={coordinator}",
                  f"--model={model}", f"--format={fmt}", "--lookup_only"] + list(extra))


def train(coordinator, model, steps, extra=()):
    return subprocess.Popen(
        [f"{BUILD}/tessera-train", f"--coordinator={coordinator}", f"--model={model}",
         f"--steps={steps}", "--batch_size=256", "--publish_dense_every=100", "--log_every=0",
         "--held_out=0"] + list(extra), stdout=subprocess.PIPE, stderr=LOG, text=True)


def samples_per_s(output):
    m = re.search(r"\(([0-9.]+) samples/s\)", output)
    return float(m.group(1)) if m else float("nan")


def wait_caught_up(r, timeout=300.0, at_least_dense=-1, since=None):
    """Waits until a Poll of the replica found every shard read to its head at or after
    `since` (time.time(); None: any), holding dense weights of at_least_dense steps:
    (seconds waited, its status)."""
    t0 = time.time()
    since = since or 0.0
    while time.time() - t0 < timeout:
        s = r.status()
        if (s["shards_caught_up"] == s["shards"] and s["dense_step"] >= at_least_dense
                and time.time() - s["seconds_since_caught_up"] >= since):
            return time.time() - t0, s
        time.sleep(0.01)
    raise SystemExit(f"replica not caught up in {timeout} s")


def pct(values, q):
    return float(np.percentile(np.array(values), q))


def cost(coordinator, steps):
    """samples/s with 0, 1 and 4 replicas of the run's model, each twice."""
    rates = {0: [], 1: [], 4: []}
    for round_ in range(3):
        for n in (0, 1, 4):
            model = f"cost{n}r{round_}"
            reps = [replica(coordinator, model)[0] for _ in range(n)]
            out = train(coordinator, model, steps).communicate()[0]
            rates[n].append(samples_per_s(out))
            for p in reps:
                stop(p)
    print("\n### Training's cost (samples/s, tessera-train through 2 shards, batch 256)\n")
    print("| replicas | runs (rounds in order) | median | vs none, per round | median ratio |")
    print("|---|---|---|---|---|")
    for n, r in rates.items():
        ratios = [x / b for x, b in zip(r, rates[0])]
        print(f"| {n} | {', '.join(f'{x:.0f}' for x in r)} | {np.median(r):.0f} | "
              f"{', '.join(f'{x:.2f}' for x in ratios)} | {np.median(ratios):.2f}x |")


def freshness(client, r, probes=200):
    """Push-acknowledged to visible-on-the-replica times of `probes` pushes (s)."""
    times = []
    for i in range(probes):
        row = np.array([1_000_000 + i], dtype=np.int64)
        client.push("fresh.probe", row, np.full((1, 16), 0.5, np.float32), step=i)
        t0 = time.perf_counter()
        want = client.lookup("fresh.probe", row, read_only=True).tobytes()
        while r.lookup("fresh.probe", row).tobytes() != want:
            if time.perf_counter() - t0 > 30:
                raise SystemExit("a push did not reach the replica in 30 s")
            time.sleep(0.001)
        times.append(time.perf_counter() - t0)
    return times


def serving_latency(r, label, rng):
    """Lookup and Predict latency (ms) and throughput at batch 1, 64, 512: rows."""
    rows = []
    for batch, calls in ((1, 300), (64, 150), (512, 50)):
        dense = rng.random((batch, 13), dtype=np.float32)
        ids = [rng.integers(0, 5000, batch).astype(np.int64) for _ in range(26)]
        for name, call in (("Lookup", lambda: r.lookup("dlrmserve.C1", ids[0])),
                           ("Predict", lambda: r.predict(dense, ids))):
            took = []
            for _ in range(calls):
                t0 = time.perf_counter()
                call()
                took.append(time.perf_counter() - t0)
            rows.append(f"| {name} | {label} | {batch} | {pct(took, 50) * 1e3:.2f} | "
                        f"{pct(took, 99) * 1e3:.2f} | {batch / np.mean(took):.0f} |")
    return rows


def fresh_and_serving(coordinator):
    client = tessera.connect(coordinator)
    client.create_table("fresh.probe", dim=16, optimizer="sgd", learning_rate=0.1)
    # A model to serve: trained, its dense network published.
    train(coordinator, "dlrmserve", 400).communicate()
    serve_p, serve_at = replica(coordinator, "dlrmserve")
    served = tessera.connect(serve_at)
    wait_caught_up(served, at_least_dense=400)
    rng = np.random.default_rng(1)
    quiet = serving_latency(served, "idle", rng)
    fresh_p, fresh_at = replica(coordinator, "fresh")
    fr = tessera.connect(fresh_at)
    busy = train(coordinator, "fresh", 1_000_000, ["--log_every=100"])
    time.sleep(3)
    times = freshness(client, fr)
    loaded = serving_latency(served, "training", rng)
    print("\n### Freshness: a push acknowledged to its row on the replica, while tessera-train "
          "trains the same model at full speed\n")
    print(f"{len(times)} pushes: p50 {pct(times, 50) * 1e3:.1f} ms, p99 {pct(times, 99) * 1e3:.1f} "
          f"ms, max {max(times) * 1e3:.1f} ms (replicas poll every 100 ms, --poll_ms)")
    print("\n### Serving (one client, Python, gRPC on loopback)\n")
    print("| call | beside | batch | p50 ms | p99 ms | samples/s |\n|---|---|---|---|---|---|")
    print("\n".join(quiet + loaded))
    catch_up(fresh_p, fr, fresh_at, coordinator)
    busy.send_signal(signal.SIGTERM)
    busy.communicate()
    stop(serve_p)


def catch_up(p, r, address, coordinator):
    """The replica paused for PAUSE_S s of training, then let go; then one restarted."""
    wait_caught_up(r)
    before = r.status()
    p.send_signal(signal.SIGSTOP)
    time.sleep(PAUSE_S)
    let_go = time.time()
    p.send_signal(signal.SIGCONT)
    took, after = wait_caught_up(r, since=let_go)
    print(f"\n### Catch-up after {PAUSE_S:.0f} s stopped while training ran\n")
    print(f"- let go: {took:.2f} s to the head, "
          f"{after['bytes_read'] - before['bytes_read']:,} bytes read, "
          f"{after['snapshots'] - before['snapshots']} snapshot(s) (0: from its cursor; else "
          f"the logs' bound no longer held what it missed); it caught up "
          f"{after['serving_step'] - before['serving_step']} steps of training")
    stop(p)
    t0 = time.time()
    p2, address2 = replica(coordinator, "fresh")
    r2 = tessera.connect(address2)
    took2, s2 = wait_caught_up(r2)
    print(f"- a new replica instead: {time.time() - t0:.2f} s to the head (a snapshot of every "
          f"shard: {s2['bytes_read']:,} bytes, {sum(t['rows'] for t in s2['tables'].values()):,} rows)")
    # Down (SIGKILL) for PAUSE_S s, restarted on the state it saved.
    state = tempfile.mkdtemp()
    flags = [f"--state_dir={state}", "--save_every_s=1"]
    stop(p2)
    p3, _ = replica(coordinator, "fresh", extra=flags)
    time.sleep(2.5)  # a save
    p3.kill()
    p3.wait()
    time.sleep(PAUSE_S)
    t0 = time.time()
    p4, address4 = replica(coordinator, "fresh", extra=flags)
    r4 = tessera.connect(address4)
    took4, s4 = wait_caught_up(r4, since=t0)
    how = "read on from its saved cursors" if s4["snapshots"] == 0 else (
        f"{s4['snapshots']} shard(s) read whole: the logs no longer held what it missed")
    print(f"- down (SIGKILL) {PAUSE_S:.0f} s, restarted on its --state_dir: {time.time() - t0:.2f} s "
          f"from its start to the head, {s4['bytes_read']:,} bytes read; {how}")
    stop(p4)


def stream_cost(coordinator):
    client = tessera.connect(coordinator)
    client.create_table("big.t", dim=16, optimizer="sgd", learning_rate=0.01)
    rng = np.random.default_rng(3)
    t0 = time.time()
    for b in range(0, BIG_ROWS, 500_000):
        ids = np.arange(b, min(BIG_ROWS, b + 500_000), dtype=np.int64)
        client.import_rows("big.t", ids, rng.standard_normal((len(ids), 16), dtype=np.float32))
    imported = time.time() - t0
    t0 = time.time()
    p, address = replica(coordinator, "big")
    r = tessera.connect(address)
    took, s = wait_caught_up(r)
    snapshot_s, snapshot_bytes = time.time() - t0, s["bytes_read"]
    touched = rng.choice(BIG_ROWS, BIG_ROWS // 100, replace=False).astype(np.int64)
    t0 = time.time()
    for b in range(0, len(touched), 10_000):
        part = touched[b:b + 10_000]
        client.push("big.t", part, np.full((len(part), 16), 0.01, np.float32), step=b)
    took, s2 = wait_caught_up(r, since=time.time())
    delta = s2["bytes_read"] - snapshot_bytes
    want = client.lookup("big.t", touched[:1000], read_only=True).tobytes()
    same = r.lookup("big.t", touched[:1000]).tobytes() == want
    print(f"\n### The stream's cost: a table of {BIG_ROWS:,} rows (dim 16), pushes touching 1%\n")
    print(f"- imported in {imported:.1f} s; a replica's snapshot: {snapshot_bytes:,} bytes in "
          f"{snapshot_s:.1f} s; its table {s['tables']['big.t']['bytes'] / BIG_ROWS:.1f} B/row")
    print(f"- {len(touched):,} rows pushed ({time.time() - t0:.1f} s with the catch-up): the "
          f"replica read {delta:,} bytes = {delta / snapshot_bytes * 100:.2f}% of the snapshot; "
          f"rows equal: {same}")
    stop(p)
    client.drop_table("big.t")


def formats(coordinator, tmp):
    data = os.path.join(tmp, "clicks.tsv")
    subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "examples/python/torch_dlrm.py"),
                    f"--make_data=200000", f"--data={data}"], check=True,
                   stdout=subprocess.DEVNULL, env=dict(os.environ, PYTHONPATH=f"{BUILD}/python"))
    out = subprocess.run([f"{BUILD}/tessera-train", f"--coordinator={coordinator}",
                          "--model=clicks", f"--data={data}", "--batch_size=256",
                          "--publish_dense_every=100", "--log_every=0"],
                         capture_output=True, text=True, check=True).stdout
    trained = re.search(r"held-out: \d+ samples\s+logloss ([0-9.]+)\s+auc ([0-9.]+)", out)
    labels, dense, ids = criteo.read(data)
    print("\n### Formats: the model trained on 200,000 generated Criteo-format lines, its "
          f"{len(labels):,} held-out lines scored by replicas\n")
    print(f"tessera-train's own evaluation: auc {trained.group(2)}, logloss {trained.group(1)}\n")
    print("| format | auc | logloss | vs fp32 auc |")
    print("|---|---|---|---|")
    base = None
    for fmt in ("fp32", "fp16", "int8"):
        p, address = replica(coordinator, "clicks", fmt)
        r = tessera.connect(address)
        _, s = wait_caught_up(r)
        while r.status()["dense_step"] < 0:
            time.sleep(0.05)
        scores = np.concatenate([r.predict(dense[b:b + 2048], list(ids[:, b:b + 2048]))
                                 for b in range(0, len(labels), 2048)])
        auc, loss = criteo.exact_auc(scores, labels), criteo.log_loss(scores, labels)
        base = auc if base is None else base
        print(f"| {fmt} | {auc:.6f} | {loss:.6f} | {auc - base:+.6f} |")
        stop(p)


def main():
    tmp = tempfile.mkdtemp()
    try:
        shards = [start([f"{BUILD}/tessera-shard", "--port=0", f"--shard_index={k}",
                         "--num_shards=2"])[1] for k in range(2)]
        _, coordinator = start([f"{BUILD}/tessera-coordinator", "--port=0",
                                "--shards=" + ",".join(shards)])
        time.sleep(0.5)
        print(f"## Serving replicas ({os.cpu_count()} CPUs)")
        if "cost" in PHASES:
            cost(coordinator, 3000)
        if "fresh" in PHASES:
            fresh_and_serving(coordinator)
        if "formats" in PHASES:
            formats(coordinator, tmp)
        if "stream" in PHASES:
            stream_cost(coordinator)
    finally:
        for p in PROCS:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                stop(p)


if __name__ == "__main__":
    main()
