#!/usr/bin/env bash
# A shard in a memory cgroup of its own (256 MiB) takes new rows until its default memory
# budget (the cgroup's limit less what serving needs) is full, then refuses them with
# RESOURCE_EXHAUSTED naming the budget, and stays up serving the rows it holds: the kernel
# never kills it for its rows. Needs to create a memory cgroup (root and a writable cgroup
# v1 or v2 hierarchy); otherwise it is skipped (77) with the reason.
set -euo pipefail
ROOT="$1"
BIN="$2"
skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }

# This process's memory cgroup: cgroup v1's memory hierarchy, else the v2 one.
v1_path=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ {print $3; exit}' /proc/self/cgroup)
v2_path=$(awk -F: '$1 == "0" && $2 == "" {print $3; exit}' /proc/self/cgroup)
if [ -n "$v1_path" ] && [ -d "/sys/fs/cgroup/memory$v1_path" ]; then
  parent="/sys/fs/cgroup/memory${v1_path%/}"
  limit_file=memory.limit_in_bytes
elif [ -n "$v2_path" ] && [ -f "/sys/fs/cgroup${v2_path%/}/cgroup.controllers" ]; then
  parent="/sys/fs/cgroup${v2_path%/}"
  limit_file=memory.max
else
  skip "no memory cgroup hierarchy found in /proc/self/cgroup"
fi
CG="$parent/tessera-memtest-$$"
mkdir "$CG" 2> /dev/null || skip "cannot create a cgroup under $parent (needs root)"
OUT="$(mktemp -d)"
SHARD="" COORD=""
cleanup() {
  [ -n "$COORD" ] && kill "$COORD" 2> /dev/null || true
  [ -n "$SHARD" ] && kill -9 "$SHARD" 2> /dev/null || true
  wait 2> /dev/null || true
  rmdir "$CG" 2> /dev/null || true
  rm -rf "$OUT"
}
trap cleanup EXIT
{ echo $((256 << 20)) > "$CG/$limit_file"; } 2> /dev/null ||
  skip "cannot set $limit_file in $CG (the memory controller is not enabled there)"
# No swap for it either, where that can be said: over the limit it would be killed.
{ echo 0 > "$CG/memory.swap.max"; } 2> /dev/null || true

# The shard joins the cgroup before it starts, so its default budget is the cgroup's.
sh -c "echo \$\$ > '$CG/cgroup.procs' && exec '$BIN/tessera-shard' --shard_index=0 \
  --num_shards=1 --port=0" > "$OUT/shard.log" 2>&1 &
SHARD=$!
address() {  # the address a server logged, waited for (bounded)
  for _ in $(seq 100); do
    a=$(sed -n 's/.*listening on \(127\.0\.0\.1:[0-9]*\).*/\1/p' "$1" | head -1)
    [ -n "$a" ] && { echo "$a"; return; }
    sleep 0.1
  done
}
shard=$(address "$OUT/shard.log")
[ -n "$shard" ] || { cat "$OUT/shard.log"; fail "the shard did not start in $CG"; }
"$BIN/tessera-coordinator" --port=0 --shards="$shard" > "$OUT/coordinator.log" 2>&1 &
COORD=$!
coordinator=$(address "$OUT/coordinator.log")
[ -n "$coordinator" ] || { cat "$OUT/coordinator.log"; fail "the coordinator did not start"; }

PYTHONPATH="$BIN/python" /usr/bin/python3 - "$coordinator" << 'EOF'
import sys
import numpy as np
import tessera

c = tessera.connect(sys.argv[1])
c.create_table("wide", dim=64, optimizer="adagrad")
kept = c.lookup("wide", np.arange(1000))
batch = 50_000
for i in range(200):  # at most 10M rows of about 600 bytes: far past 256 MiB
    first = 1000 + i * batch
    try:
        c.lookup("wide", np.arange(first, first + batch))
    except tessera.TesseraError as e:
        assert e.code.name == "RESOURCE_EXHAUSTED", e
        assert "memory budget" in str(e), e
        print(f"refused after {first} rows: {e}")
        break
else:
    sys.exit("FAIL: the shard never refused a row")
again = c.lookup("wide", np.arange(1000), read_only=True)
assert np.array_equal(again, kept), "the rows held before changed"
EOF
kill -0 "$SHARD" 2> /dev/null || { cat "$OUT/shard.log"; fail "the shard died"; }
echo "cgroup memory: ok (shard alive in $CG)"
