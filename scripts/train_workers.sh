#!/usr/bin/env bash
# Runs N data-parallel tessera-train workers of one model on this host, each line of
# their output prefixed with its worker; ends when all have, and if one fails, stops the
# others and exits with its code.
#
#   scripts/train_workers.sh N --coordinator=HOST:PORT --model=NAME [tessera-train flags]
#
# Worker i gets --num_workers=N --worker_index=i; the flags are every worker's. The
# workers meet through the coordinator (their gloo transports listen on 127.0.0.1 unless
# the flags give --worker_host). Environment: TESSERA_BIN (binaries; default build/).
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${TESSERA_BIN:-$ROOT/build}"

die() { echo "train_workers: $*" >&2; exit 2; }

[ $# -ge 1 ] || die "usage: $0 N --coordinator=HOST:PORT [tessera-train flags]"
N="$1"
shift
[[ "$N" =~ ^[0-9]+$ ]] && [ "$N" -ge 1 ] || die "N must be a positive number of workers, got '$N'"
case " $* " in
  *" --coordinator="*) ;;
  *) die "the workers need --coordinator=HOST:PORT (they share a cluster's tables)" ;;
esac
for f in "$@"; do
  case "$f" in
    --num_workers=*|--worker_index=*) die "$f is set by this script" ;;
  esac
done
[ -x "$BIN/tessera-train" ] || die "no $BIN/tessera-train: build first (scripts/setup.sh)"

pids=()
stopping=0
signal_workers() {
  for p in "${pids[@]}"; do kill -"$1" "$p" 2>/dev/null; done
}
# Interrupted or terminated: the workers stop together at the end of a step (each takes
# its checkpoint with --checkpoint_every and says how to resume); a second signal kills
# them at once. Either way none is left running.
on_signal() {
  if [ "$stopping" -eq 1 ]; then
    signal_workers KILL
    exit 130
  fi
  stopping=1
  echo "train_workers: stopping the workers at the end of their step (again: at once)" >&2
  signal_workers TERM
}
trap on_signal INT TERM

for ((i = 0; i < N; i++)); do
  # The worker itself is the background job (its pid is what is signalled and waited for);
  # its lines carry its index.
  "$BIN/tessera-train" "$@" --num_workers="$N" --worker_index="$i" \
    > >(sed -u "s/^/[worker $i] /") 2>&1 &
  pids+=("$!")
done

status=0
running=("${pids[@]}")
while [ "${#running[@]}" -gt 0 ]; do
  done_pid=""
  wait -n -p done_pid "${running[@]}"
  code=$?
  [ -n "${done_pid:-}" ] || continue  # a signal interrupted the wait; its trap ran
  left=()
  for p in "${running[@]}"; do [ "$p" != "$done_pid" ] && left+=("$p"); done
  running=("${left[@]}")
  if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then
    status=$code
    if [ "$stopping" -eq 0 ]; then
      echo "train_workers: a worker (pid $done_pid) exited with $code; stopping the others" >&2
      signal_workers KILL
    fi
  fi
done
wait  # the output filters
exit "$status"
