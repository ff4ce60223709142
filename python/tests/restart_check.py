"""Exactly-once pushes across a shard restart, from Python, in both client modes.

A WRITE_THROUGH SGD table (lr 1) on a local cluster started by deploy/local/cluster.sh; shard
1 is killed (SIGKILL), a push of g = 1 to 400 ids is sent while it is down, and shard 1 is
started again while the client retries. Every row must have moved by exactly 1: the healthy
shard's rows once, not once per retry.

    restart_check.py ADDRESS CLUSTER_DIR BIN_DIR
"""
import os
import signal
import subprocess
import sys
import threading
import time

import grpc
import numpy as np

import tessera


def kill_shard(cluster_dir: str, k: int) -> None:
    """SIGKILLs shard k and waits (up to 10 s) until it has exited, so that its port is
    free for the shard started next: a loaded machine can take a while to tear a process
    down, and an exited one may stay a zombie for seconds (init reaps it late), which
    holds no port."""
    pid_file = os.path.join(cluster_dir, "pids", f"shard-{k}.pid")
    with open(pid_file) as f:
        pid = int(f.read())
    os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    raise AssertionError(f"shard {k} (pid {pid}) still runs 10 s after SIGKILL")


def start_shard(cluster_dir: str, bin_dir: str, k: int) -> None:
    with open(os.path.join(cluster_dir, "num_shards")) as f:
        n = int(f.read())
    with open(os.path.join(cluster_dir, "base_port")) as f:
        base = int(f.read())
    log = open(os.path.join(cluster_dir, "logs", f"shard-{k}.log"), "a")
    p = subprocess.Popen([os.path.join(bin_dir, "tessera-shard"), f"--port={base + 1 + k}",
                          f"--shard_index={k}", f"--num_shards={n}",
                          f"--data_dir={os.path.join(cluster_dir, 'data', f'shard-{k}')}"],
                         stdout=log, stderr=log)
    with open(os.path.join(cluster_dir, "pids", f"shard-{k}.pid"), "w") as f:
        f.write(str(p.pid))


def start_memory_only_shard(cluster_dir: str, bin_dir: str, k: int) -> subprocess.Popen:
    """Shard k again on its port, without its data directory: it comes back empty."""
    with open(os.path.join(cluster_dir, "num_shards")) as f:
        n = int(f.read())
    with open(os.path.join(cluster_dir, "base_port")) as f:
        base = int(f.read())
    log = open(os.path.join(cluster_dir, "logs", f"shard-{k}-memory.log"), "a")
    return subprocess.Popen([os.path.join(bin_dir, "tessera-shard"), f"--port={base + 1 + k}",
                             f"--shard_index={k}", f"--num_shards={n}"], stdout=log, stderr=log)


def check_quick_restart_empty(address: str, cluster_dir: str, bin_dir: str) -> None:
    """A shard that restarts empty at once (faster than the health checks fail it twice):
    the smart client's first calls after it succeed, the tables made again."""
    client = tessera.connect(address, retries=12, timeout=5.0)
    table = "restart_empty"
    client.create_table(table, dim=4, optimizer="sgd", learning_rate=1.0, seed=5)
    ids = np.arange(1, 401, dtype=np.int64) * 7919
    client.lookup(table, ids)  # every shard's incarnation heard
    kill_shard(cluster_dir, 1)
    empty = start_memory_only_shard(cluster_dir, bin_dir, 1)
    try:
        for _ in range(50):  # until it listens
            try:
                rows = client.lookup(table, ids)
                break
            except tessera.TesseraError as error:
                assert error.code != grpc.StatusCode.NOT_FOUND, f"not re-provisioned: {error}"
                time.sleep(0.1)
        assert rows.shape == (400, 4)
        client.push(table, ids, np.ones((len(ids), 4), np.float32), step=1)
        print("smart: a shard back empty before the health checks noticed serves its tables")
    finally:
        empty.kill()
        empty.wait()
        start_shard(cluster_dir, bin_dir, 1)
        client.close()


def main(address: str, cluster_dir: str, bin_dir: str) -> int:
    for mode in ("smart", "coordinator"):
        client = tessera.connect(address, mode=mode, retries=12, timeout=5.0)
        table = f"restart_{mode}"
        client.create_table(table, dim=4, optimizer="sgd", learning_rate=1.0, seed=5,
                            durability="write_through")
        ids = np.arange(1, 401, dtype=np.int64) * 7919
        before = client.lookup(table, ids)
        client.push(table, ids, np.zeros((len(ids), 4), np.float32), step=0)  # rows stored
        kill_shard(cluster_dir, 1)
        result = {}

        def push():
            try:
                result["rows"] = client.push(table, ids, np.ones((len(ids), 4), np.float32),
                                             step=1)
            except Exception as error:  # reported below
                result["error"] = error

        t = threading.Thread(target=push)
        t.start()
        time.sleep(0.8)
        start_shard(cluster_dir, bin_dir, 1)
        t.join()
        assert "error" not in result, f"{mode}: push failed: {result.get('error')}"
        after = client.lookup(table, ids)
        moved = before - after
        np.testing.assert_allclose(moved, 1.0, atol=1e-6,
                                   err_msg=f"{mode}: rows moved other than once")
        print(f"{mode}: 400 rows moved exactly once across a shard restart")
        client.close()
    check_quick_restart_empty(address, cluster_dir, bin_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
