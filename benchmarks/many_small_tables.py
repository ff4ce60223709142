#!/usr/bin/env python3
"""What many small tables cost a shard: starts a tessera-shard and a coordinator on
loopback, creates N tables of dim 16 (Adagrad) with R rows each through the coordinator, and
prints the shard's RSS growth and the memory its Stats count.

    PYTHONPATH=build/python /usr/bin/python3 benchmarks/many_small_tables.py [N] [R]

TESSERA_BIN (default build/) names where the binaries are.
"""
import os
import re
import subprocess
import sys
import time

import numpy as np

import tessera


def start(binary, args):
    process = subprocess.Popen([binary, "--port=0"] + args, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL, text=True)
    line = process.stdout.readline()
    return process, re.search(r":(\d+)\s*$", line.strip()).group(1)


def rss(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) * 1024
    return 0


def main(tables, rows):
    bin_dir = os.environ.get("TESSERA_BIN", "build")
    shard, shard_port = start(f"{bin_dir}/tessera-shard",
                              ["--shard_index=0", "--num_shards=1", f"--max_tables={tables + 1}"])
    coordinator, port = start(f"{bin_dir}/tessera-coordinator",
                              [f"--shards=127.0.0.1:{shard_port}", f"--max_tables={tables + 1}"])
    try:
        time.sleep(0.5)
        client = tessera.connect(f"127.0.0.1:{port}")
        before = rss(shard.pid)
        for i in range(tables):
            client.create_table(f"small.t{i}", dim=16, optimizer="adagrad")
            client.lookup(f"small.t{i}", np.arange(rows, dtype=np.int64))
        grown = rss(shard.pid) - before
        counted = sum(t.memory_bytes for t in client.stats().tables)
        print(f"{tables} tables of {rows} rows: shard RSS +{grown / 2**20:.1f} MiB; "
              f"counted memory {counted / 2**20:.1f} MiB")
        client.close()
    finally:
        shard.kill()
        coordinator.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000,
                  int(sys.argv[2]) if len(sys.argv) > 2 else 10))
