#!/usr/bin/env bash
# Training through a local cluster (2 shards and a coordinator, deploy/local/cluster.sh)
# against the same run in process (--shards=inproc:2), in rounds that take turns: in
# process, then through the coordinator, then with the smart client, each cluster run on a
# fresh cluster. Prints each round's samples/s with its ratios to the round's in-process
# run, and the CPU time spent per step by the cluster's servers (both shards together, and
# the coordinator, read from /proc: less noisy than samples/s on a shared machine) and by
# the trainer (its whole run, start-up and held-out evaluation included, over its steps),
# then each mode's medians.
#
#   benchmarks/cluster_vs_inprocess.sh [--rounds=N] [--against=TREE] [-- TRAIN_FLAGS...]
#
# TRAIN_FLAGS go to every tessera-train run (default --steps=3000; for batch 4096:
# -- --batch_size=4096 --steps=300). --against=TREE also runs another checkout's build
# (TREE/build, with its own cluster script) the same way in each round: two builds
# compared in the same minutes of a shared machine, where figures of different minutes
# are not comparable. Ports from TESSERA_BASE_PORT (default 27600); this checkout's
# binaries from TESSERA_BIN (default build/).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
ROUNDS=3
AGAINST=""
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds=*) ROUNDS="${1#*=}" ;;
    --against=*) AGAINST="$(cd "${1#*=}" && pwd)" ;;
    --) shift; break ;;
    *) echo "unknown argument $1 (flags for tessera-train go after --)" >&2; exit 2 ;;
  esac
  shift
done
FLAGS=("$@")
[ ${#FLAGS[@]} -gt 0 ] || FLAGS=(--steps=3000)
PORT="${TESSERA_BASE_PORT:-27600}"
DIR="$(mktemp -d)"
trap 'stop_cluster "$ROOT"; if [ -n "$AGAINST" ]; then stop_cluster "$AGAINST"; fi; rm -rf "$DIR"' EXIT

BIN="${TESSERA_BIN:-$ROOT/build}"
bin_of() { if [ "$1" = "$ROOT" ]; then echo "$BIN"; else echo "$1/build"; fi; }
cluster() {  # TREE start|stop ...
  local tree="$1"; shift
  TESSERA_BIN="$(bin_of "$tree")" TESSERA_CLUSTER_DIR="$DIR/cluster" TESSERA_BASE_PORT="$PORT" \
    "$tree/deploy/local/cluster.sh" "$@"
}
stop_cluster() { cluster "$1" stop > /dev/null 2>&1 || true; }
fresh_cluster() {
  stop_cluster "$1"
  rm -rf "$DIR/cluster"
  cluster "$1" start 2 > "$DIR/cluster.log" 2>&1 || { cat "$DIR/cluster.log" >&2; exit 1; }
}
# samples/s of one run of TREE's tessera-train with the given flags; the trainer's CPU time
# (user + system, in clock ticks) goes to $DIR/trainer.ticks. Called as $(rate ...): `times`
# then counts this run's trainer, the subshell's only child.
rate() {
  local tree="$1"; shift
  "$(bin_of "$tree")/tessera-train" "$@" "${FLAGS[@]}" > "$DIR/train.log" 2>&1 \
    || { cat "$DIR/train.log" >&2; exit 1; }
  times > "$DIR/times"  # not in a pipe: its subshell would have no children
  awk -v hz="$HZ" 'function s(t) { split(t, a, "m"); return a[1] * 60 + a[2] }
    NR == 2 { printf "%.0f\n", (s($1) + s($2)) * hz }' "$DIR/times" > "$DIR/trainer.ticks"
  sed -n 's/^trained .*(\([0-9]*\) samples\/s)$/\1/p' "$DIR/train.log"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
HZ="$(getconf CLK_TCK)"
# CPU time (user + system, in clock ticks) the processes of the given pid files have used
ticks() {
  local t=0 f pid
  for f in "$@"; do
    pid="$(cat "$f")"
    t=$((t + $(sed 's/.*) //' "/proc/$pid/stat" | awk '{ print $12 + $13 }')))
  done
  echo "$t"
}
# µs per step of `ticks` ticks over the steps of the last run's log
per_step() {
  local steps
  steps="$(sed -n 's/^trained \([0-9]*\) steps.*/\1/p' "$DIR/train.log")"
  awk -v t="$1" -v n="$steps" -v hz="$HZ" 'BEGIN { printf "%.0f", t * 1e6 / hz / n }'
}

TREES=("$ROOT")
[ -n "$AGAINST" ] && TREES+=("$AGAINST")
for round in $(seq 1 "$ROUNDS"); do
  base=$(rate "$ROOT" --shards=inproc:2)
  line="round $round: in process $base samples/s (trainer's CPU per step $(per_step "$(cat "$DIR/trainer.ticks")") us)"
  for mode in coordinator smart; do
    for tree in "${TREES[@]}"; do
      fresh_cluster "$tree"
      shards=("$DIR"/cluster/pids/shard-*.pid)
      coordinator="$DIR/cluster/pids/coordinator.pid"
      s0=$(ticks "${shards[@]}")
      c0=$(ticks "$coordinator")
      got=$(rate "$tree" --coordinator="127.0.0.1:$PORT" --client_mode="$mode" --model=bench)
      s=$(per_step $(($(ticks "${shards[@]}") - s0)))
      c=$(per_step $(($(ticks "$coordinator") - c0)))
      t=$(per_step "$(cat "$DIR/trainer.ticks")")
      name="$mode"
      [ "$tree" != "$ROOT" ] && name="$mode($(basename "$tree"))"
      line="$line | $name $got $(ratio "$got" "$base")x (CPU per step: shards $s us, coordinator $c us, trainer $t us)"
      echo "$name $(ratio "$got" "$base") $s $c $t" >> "$DIR/ratios"
    done
  done
  echo "$line"
done
/usr/bin/python3 - "$DIR/ratios" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    mode, r, shards, coordinator, trainer = line.split()
    runs.setdefault(mode, []).append((float(r), float(shards), float(coordinator), float(trainer)))
for mode, rs in sorted(runs.items()):
    ratios = [r[0] for r in rs]
    shards, coordinator, trainer = (statistics.median(r[i] for r in rs) for i in (1, 2, 3))
    print(f"median {mode} {statistics.median(ratios):.3f}x of in process "
          f"({len(rs)} rounds: {min(ratios):.3f} to {max(ratios):.3f}); CPU per step: "
          f"shards {shards:.0f} us, coordinator {coordinator:.0f} us, trainer {trainer:.0f} us")
PY
