#!/usr/bin/env bash
# deploy/local/cluster.sh end to end: start 3 shards and a coordinator on loopback, use
# them with tessera-cli, checkpoint, kill a shard, stop everything and start it again on
# the same data.
set -euo pipefail
source "$(dirname "$0")/local_cluster_kit.sh" "$1" "$2" 4
CLI="$BIN/tessera-cli --coordinator=127.0.0.1:$base"

"$CLUSTER" start 3
"$CLUSTER" status | grep -c SERVING | grep -qx 4 || fail "not all 4 processes serving"
$CLI create --table=user --dim=8 --optimizer=adam >/dev/null
if $CLI create --table=user --dim=8 >/dev/null 2>&1; then fail "duplicate create succeeded"; fi
{ $CLI create --table=user --dim=8 2>&1 || true; } | grep -q ALREADY_EXISTS \
  || fail "duplicate create must say ALREADY_EXISTS"
$CLI tables | grep -q "^user  *8 fp32  *adam" || fail "table not listed"
$CLI create --table=half --dim=8 --dtype=bf16 >/dev/null
# The tables ConfigMap of deploy/k8s, applied twice: created, then left as it is.
/usr/bin/python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["data"]["tables.json"])' \
  "$ROOT/deploy/k8s/configmap-tables.yaml" > "$TESSERA_CLUSTER_DIR/tables.json"
$CLI apply --tables_file="$TESSERA_CLUSTER_DIR/tables.json" | grep -c "created (dim 16, bf16)" \
  | grep -qx 26 || fail "apply did not create the 26 tables"
$CLI apply --tables_file="$TESSERA_CLUSTER_DIR/tables.json" | grep -c unchanged | grep -qx 26 \
  || fail "a second apply must leave the tables unchanged"
sed 's/"dim": 16/"dim": 32/' "$TESSERA_CLUSTER_DIR/tables.json" > "$TESSERA_CLUSTER_DIR/other.json"
if $CLI apply --tables_file="$TESSERA_CLUSTER_DIR/other.json" >/dev/null 2>&1; then
  fail "apply over tables with another config must fail"
fi
$CLI tables | grep -q "^half  *8 bf16  *adagrad" || fail "bf16 table not listed"
{ $CLI create --table=bad --dim=8 --dtype=int8 2>&1 || true; } | grep -q "unknown dtype 'int8'" \
  || fail "an unknown dtype must be refused by name"
out="$($CLI lookup --table=user --ids=1,2,3)"
[ "$(echo "$out" | wc -l)" = 3 ] || fail "lookup printed: $out"
[ "$(echo "$out" | head -1 | wc -w)" = 9 ] || fail "expected 8 values per row: $out"
$CLI stats | grep -A4 "^table user (dim 8, fp32, adam)" | grep -cE "^  [0-9]+ +127.0.0.1:[0-9]+ +SERVING" \
  | grep -qx 3 || fail "stats should list 3 serving shards of table user"
{ $CLI lookup --table=nope --ids=1 2>&1 || true; } | grep -q NOT_FOUND \
  || fail "unknown table must say NOT_FOUND"

# Tables in the order people read them (C2 before C10), of one model with --model.
[ "$($CLI tables | awk 'NR > 1 {print $1}' | head -3 | tr '\n' ' ')" = "criteo.C1 criteo.C2 criteo.C3 " ] \
  || fail "tables not in natural order: $($CLI tables | head -4)"
[ "$($CLI tables --model=criteo | tail -n +2 | wc -l)" = 26 ] || fail "tables --model=criteo"
$CLI stats --model=criteo | grep -q "^table user" && fail "stats --model=criteo listed table user"
[ "$($CLI stats --model=criteo | grep -c "^table criteo")" = 26 ] || fail "stats --model=criteo"
# Mistakes get errors that say what is wrong, not silence.
$CLI lookup --table=user >/dev/null 2>&1 && fail "lookup without --ids must fail"
{ $CLI checkpoint --step=-3 2>&1 || true; } | grep -q "must be >= 0, got -3" \
  || fail "a negative step must be named"
{ $CLI create --table=user --dim=8 --optimizer=adam --lr=0.5 2>&1 || true; } \
  | grep -q "optimizer.learning_rate 0.05 (the table's) vs 0.5" \
  || fail "create over another config must name the field"
{ $CLI checkpoint --model=nosuch --step=3 2>&1 || true; } | grep -q "NOT_FOUND: model 'nosuch' has no tables" \
  || fail "a checkpoint of a model without tables must be NOT_FOUND"
$CLI checkpoints | grep -q "nosuch" && fail "a checkpoint of no tables was listed"

# create takes every TableConfig field; enum names in any case.
$CLI create --table=tuned --dim=4 --optimizer=adam --beta1=0.8 --clip_norm=1 --eviction=LRU \
  --max_rows=300 --ttl_steps=50 --durability=WRITE-THROUGH --initializer=normal >/dev/null \
  || fail "create with every field"
$CLI create --table=tuned --dim=4 --optimizer=adam --beta1=0.8 --clip_norm=1 --eviction=lru \
  --max_rows=300 --ttl_steps=50 --durability=write_through --initializer=NORMAL >/dev/null \
  || fail "the same create again must be OK"
out="$($CLI create --table=tuned --dim=4 --optimizer=adam --beta1=0.7 --clip_norm=1 \
  --eviction=lru --max_rows=300 --ttl_steps=50 --durability=write_through --initializer=normal 2>&1 || true)"
echo "$out" | grep -q "optimizer.beta1 0.8 (the table's) vs 0.7" || fail "beta1 not stored: $out"
{ $CLI create --table=bad --dim=4 --eviction=fifo 2>&1 || true; } \
  | grep -q "unknown value 'fifo'; expected none, lru, lfu" || fail "an unknown eviction must list the choices"
$CLI drop --table=tuned >/dev/null

$CLI checkpoint --step=7 | grep -q "checkpoint taken: step 7" || fail "checkpoint not taken"
$CLI checkpoints | grep -Eq "^step 7: .* created 20[0-9]{2}-[01][0-9]-[0-3][0-9]T[0-9:.]+Z" \
  || fail "checkpoint time not in UTC ISO-8601: $($CLI checkpoints)"
$CLI checkpoints | grep -q "^step 7: .* 3 shard(s)" || fail "checkpoint 7 not listed"
before="$($CLI lookup --table=user --ids=1,2,3)"

pid="$(cat "$TESSERA_CLUSTER_DIR/pids/shard-1.pid")"
kill -9 "$pid"
# SIGKILL is not instant: a loaded machine may still be tearing the process down, and
# start-shard rightly refuses a shard whose process lives. Wait (up to 10 s) for it to go.
wait_exited "$pid"
if "$CLUSTER" status >/dev/null; then fail "status must fail with a shard down"; fi
{ "$CLUSTER" status || true; } | grep -q "shard 1 .*DOWN" || fail "shard 1 not reported down"
# One dead shard comes back alone, with its place and data.
"$CLUSTER" start-shard 1 | grep -q "shard 1 of 3 serving" || fail "start-shard 1"
"$CLUSTER" status | grep -c SERVING | grep -qx 4 || fail "shard 1 not serving after start-shard"
[ "$($CLI lookup --table=user --ids=1,2,3)" = "$before" ] || fail "rows changed across start-shard"
"$CLUSTER" start-shard 1 >/dev/null 2>&1 && fail "start-shard of a running shard must refuse"

"$CLUSTER" stop
if "$CLUSTER" status >/dev/null 2>&1; then fail "still running after stop"; fi
for f in "$TESSERA_CLUSTER_DIR"/pids/*.pid; do [ -e "$f" ] && fail "pid file left: $f"; done

# The same cluster again: its tables, rows and checkpoints come back from the data dirs.
if "$CLUSTER" start 2 >/dev/null 2>&1; then fail "start with another shard count must refuse"; fi
# A start that fails half-way (a coordinator flag it refuses) stops the shards it started;
# shard-only flags go to the shards alone.
out="$(TESSERA_COORDINATOR_FLAGS="--no_such_flag=1" \
  "$CLUSTER" start 3 2>&1)" && fail "a start whose coordinator cannot start must fail"
echo "$out" | grep -q "stopped what this start had started" || fail "failed start: $out"
if $CLI health --address="127.0.0.1:$((base + 1))" >/dev/null 2>&1; then
  fail "a failed start left a shard running"
fi
TESSERA_SHARD_FLAGS="--memory_limit=4000000000" "$CLUSTER" start 3 >/dev/null \
  || fail "start with a shard-only flag"
$CLI tables | grep -q "^user  *8 fp32  *adam" || fail "table lost across a restart"
$CLI tables | grep -q "^half  *8 bf16" || fail "bf16 table lost across a restart"
[ "$($CLI lookup --table=user --ids=1,2,3)" = "$before" ] || fail "rows changed across a restart"
$CLI checkpoints | grep -q "^step 7:" || fail "checkpoint lost across a restart"
if $CLI restore >/dev/null 2>&1; then fail "restore without --model or --all_models must refuse"; fi
$CLI restore --all_models > "$TESSERA_CLUSTER_DIR/restore.out" || fail "restore failed"
grep -q "restored: step 7" "$TESSERA_CLUSTER_DIR/restore.out" || fail "restore printed no step"
grep -q "rolled back (28): criteo.C1, criteo.C2, criteo.C3, .*criteo.C26, half, user" \
  "$TESSERA_CLUSTER_DIR/restore.out" \
  || { cat "$TESSERA_CLUSTER_DIR/restore.out"; fail "restore did not list the tables it rolled back"; }

# A reshard that fails before it publishes changes nothing, and the shard it started goes.
kill -KILL "$(cat "$TESSERA_CLUSTER_DIR/pids/shard-2.pid")"
out="$("$CLUSTER" reshard 4 2>&1)" && fail "a reshard with a dead shard must fail"
echo "$out" | grep -q "reshard not started" || fail "a failed reshard must say it did not start: $out"
if $CLI health --address="127.0.0.1:$((base + 4))" >/dev/null 2>&1; then
  fail "a failed reshard left its new shard running"
fi
"$CLUSTER" stop >/dev/null
"$CLUSTER" start 3 >/dev/null || fail "restart after a failed reshard"

# A live reshard, 3 -> 4 -> 3 shards: trained rows (with optimizer state) read the same after
# each move and after restarts on the new map.
"$BIN/tessera-train" --coordinator="127.0.0.1:$base" --steps=40 --held_out=0 --log_every=0 \
  > "$TESSERA_CLUSTER_DIR/train.log" 2>&1 || { cat "$TESSERA_CLUSTER_DIR/train.log"; fail "train"; }
rows() {  # a digest of table $1's rows (dlrm.C3 by default), sorted by id
  $CLI export --table="${1:-dlrm.C3}" --with_state --out="$TESSERA_CLUSTER_DIR/rows.npz" >/dev/null
  /usr/bin/python3 -c 'import sys, numpy as np, hashlib; z = np.load(sys.argv[1]); o = np.argsort(z["ids"]); print(len(o), hashlib.sha1(b"".join(z[k][o].tobytes() for k in ("ids", "weights", "state"))).hexdigest())' \
    "$TESSERA_CLUSTER_DIR/rows.npz"
}
trained="$(rows)"
[ "${trained%% *}" -gt 20 ] || fail "too few trained rows: $trained"
# A fixed-vocabulary table moves too: every row (a shard's arrays are laid out for its
# place), into each shard's layout for its new place.
$CLI create --table=fixed --dim=4 --vocabulary_size=1000 --durability=write_through >/dev/null \
  || fail "create a fixed-vocabulary table"
/usr/bin/python3 -c 'import sys, numpy as np; r = np.random.default_rng(1); ids = np.arange(0, 1000, 3, dtype=np.int64); np.savez(sys.argv[1], ids=ids, weights=r.standard_normal((len(ids), 4), dtype=np.float32), state=r.random((len(ids), 4), dtype=np.float32))' \
  "$TESSERA_CLUSTER_DIR/fixed.npz"
$CLI import --table=fixed --in="$TESSERA_CLUSTER_DIR/fixed.npz" >/dev/null || fail "import fixed rows"
fixed="$(rows fixed)"
[ "${fixed%% *}" = 334 ] || fail "fixed rows not imported: $fixed"
# To the shard count it has: nothing to do, and the next reshard still works.
"$CLUSTER" reshard 3 | grep -q "nothing to do" || fail "reshard to the current count"
# reshard_to N VERSION: a live reshard to N shards, as shard map VERSION; the rows read the
# same after it and after a restart of every process on the new map.
reshard_to() {
  local out
  out="$("$CLUSTER" reshard "$1" 2>&1)" || fail "reshard to $1: $out"
  echo "$out" | grep -q "resharded: $1 shards, shard map version $2" || fail "reshard to $1: $out"
  "$CLUSTER" status | grep -c SERVING | grep -qx $(($1 + 1)) \
    || fail "not all $(($1 + 1)) processes serving after the reshard to $1"
  [ "$(rows)" = "$trained" ] || fail "rows changed across the reshard to $1"
  [ "$(rows fixed)" = "$fixed" ] || fail "fixed-vocabulary rows changed across the reshard to $1"
  "$CLUSTER" stop >/dev/null
  "$CLUSTER" start "$1" >/dev/null || fail "restart on $1 shards"
  [ "$(rows)" = "$trained" ] || fail "rows changed across a restart on $1 shards"
  [ "$(rows fixed)" = "$fixed" ] || fail "fixed-vocabulary rows changed across a restart on $1 shards"
}
reshard_to 4 2
reshard_to 3 3
[ -d "$TESSERA_CLUSTER_DIR/data/shard-3.left-3" ] || fail "the shard that left kept no data aside"
"$CLUSTER" stop >/dev/null
echo "cluster script: ok"
