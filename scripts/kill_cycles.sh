#!/usr/bin/env bash
# Runs the shard kill-cycle fault test with more cycles than CI does (default 50):
# shards are SIGKILLed under a write-through load and restarted, and every row is
# checked against a replay of the acknowledged pushes.
#   scripts/kill_cycles.sh [cycles] [build dir]
set -euo pipefail
cycles="${1:-50}"
build="${2:-build}"
TESSERA_KILL_CYCLES="$cycles" "$build/tests/fault_test" \
  --gtest_filter='FaultTest.KilledShardsLoseNoAcknowledgedWriteThroughUpdate' 2>&1 |
  grep -E "kill cycles|OK|FAILED|Failure" 
