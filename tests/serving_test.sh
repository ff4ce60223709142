#!/usr/bin/env bash
# A serving replica (tessera-serve) following a 2-shard cluster through a run of
# tessera-train (3 passes over 40,000 lines: 1,689 steps), with its own SIGKILL and restart
# (it reads on from the state it saved a second before), then a shard SIGKILLed and
# brought back, the coordinator restarted and a live 2->3 reshard along the way: at the end
# every stored row reads the same on the replica, bit for bit, and its Predict of the
# held-out lines gives the trainer's own evaluation (python/tests/serving_check.py); so do
# those of a replica of the run's last checkpoint, served frozen.
set -euo pipefail
source "$(dirname "$0")/local_cluster_kit.sh" "$1" "$2" 101
DIR="$TESSERA_CLUSTER_DIR"
PY=(env PYTHONPATH="$BIN/python" /usr/bin/python3)
"${PY[@]}" "$ROOT/examples/python/torch_dlrm.py" --make_data=40000 --data="$DIR/clicks.tsv" \
  > /dev/null
[ -s "$DIR/clicks.tsv" ] || fail "no data generated"
"$CLUSTER" start 2
export TESSERA_SERVE_FLAGS="--save_every_s=1"  # the restarted replica reads on from its state
"$CLUSTER" serve ads
# --max_retries=16 (about 12 s): one call of the trainer's can meet the shard's restart and
# then the coordinator's, back to back; the default (about 4.5 s) covers one restart.
"$BIN/tessera-train" --coordinator="127.0.0.1:$base" --model=ads --data="$DIR/clicks.tsv" \
  --epochs=3 --batch_size=64 --checkpoint_every=40 --publish_dense_every=20 \
  --log_every=10 --max_retries=16 --metrics_out="$DIR/train.jsonl" > "$DIR/train.log" 2>&1 &
trainer=$!
# Waits (up to 120 s) for the run to pass step $1.
wait_step() {
  for _ in $(seq 1 1200); do
    local at
    at="$(grep -o '^step [0-9]*' "$DIR/train.log" | tail -n 1 | cut -d' ' -f2 || true)"
    [ -n "$at" ] && [ "$at" -ge "$1" ] && return 0
    kill -0 "$trainer" 2>/dev/null || { cat "$DIR/train.log"; fail "training ended before step $1"; }
    sleep 0.1
  done
  fail "training did not reach step $1"
}
wait_step 30
kill_and_wait() {  # pid file
  local pid
  pid="$(cat "$1")"
  kill -KILL "$pid"
  wait_exited "$pid"
}
# Its first save of its state (every second), before it is killed.
for _ in $(seq 1 300); do [ -f "$DIR/data/serve-0/replica.state" ] && break; sleep 0.1; done
[ -f "$DIR/data/serve-0/replica.state" ] || fail "the replica saved no state in 30 s"
kill_and_wait "$DIR/pids/serve-0.pid"
"$CLUSTER" serve ads
wait_step 200
kill_and_wait "$DIR/pids/shard-1.pid"
"$CLUSTER" start-shard 1
wait_step 400
# The coordinator, restarted with the command line it runs with.
pid="$(cat "$DIR/pids/coordinator.pid")"
mapfile -d '' command < "/proc/$pid/cmdline"
kill -TERM "$pid"
wait_exited "$pid"
"${command[@]}" >> "$DIR/logs/coordinator.log" 2>&1 &
echo $! > "$DIR/pids/coordinator.pid"
wait_step 600
"$CLUSTER" reshard 3
kill -0 "$trainer" 2>/dev/null \
  || { tail -n 5 "$DIR/train.log" "$DIR/logs/coordinator.log"
       fail "training ended before the reshard: the faults must land during it"; }
wait "$trainer" || { cat "$DIR/train.log"; fail "training failed"; }
grep -q "held-out" "$DIR/train.log" || fail "training did not evaluate"
"${PY[@]}" "$ROOT/python/tests/serving_check.py" wait-and-check "127.0.0.1:$base" \
  "127.0.0.1:$((base + 100))" ads "$DIR/clicks.tsv" "$DIR/train.jsonl" \
  --expect_event="resumed from the state saved" --expect_event="is gone" \
  --expect_event="a shard new to the replica" \
  || { tail -n 20 "$DIR/logs/serve-0.log"; fail "the replica differs from the cluster"; }
"$CLUSTER" status | grep -q "replica 0 .* SERVING" || { "$CLUSTER" status; fail "replica not ready"; }
# A replica of the run's last checkpoint (its last step), frozen: the same rows and scores,
# read from the checkpoint's files.
"$CLUSTER" serve ads 1 newest
"${PY[@]}" "$ROOT/python/tests/serving_check.py" wait-and-check "127.0.0.1:$base" \
  "127.0.0.1:$((base + 101))" ads "$DIR/clicks.tsv" "$DIR/train.jsonl" \
  --expect_event="frozen" \
  || { tail -n 20 "$DIR/logs/serve-1.log"; fail "the checkpoint's replica differs from it"; }
echo "serving: ok"
