#!/usr/bin/env bash
# Data-parallel workers on their own hosts: two tessera-train workers, each in a network
# namespace of its own, train one model against a cluster (two shards and a coordinator
# in the test's namespace). The namespaces hang off a bridge made here: the servers
# listen on the bridge's address, and each worker's gloo transport on its namespace's
# address (--worker_host), where the other worker reaches it. Both must finish with the
# same dense parameters. Everything made here is removed on exit. Needs root and
# iproute2; exits 77 (skipped) without, or where namespaces or bridges cannot be made.
set -euo pipefail
ROOT="$1"
BIN="$2"
NAME="netns workers test"
TAG="tw$$"
NET="10.214.0"
source "$(dirname "$0")/netns_common.sh"
ip link add "${TAG}br" type bridge 2>/dev/null || skip "cannot create a bridge here"
ip netns add "${TAG}n1"
ip addr add "$NET.1/24" dev "${TAG}br"
ip link set "${TAG}br" up
for k in 0 1; do
  link_namespace "$k" "$NET.$((k + 2))" "${TAG}br"
done

for k in 0 1; do
  "$BIN/tessera-shard" --host="$NET.1" --port=$((7101 + k)) --shard_index="$k" --num_shards=2 \
    > "$WORK/shard-$k.log" 2>&1 &
  PIDS+=($!)
done
"$BIN/tessera-coordinator" --host="$NET.1" --port=7100 --shards="$NET.1:7101,$NET.1:7102" \
  > "$WORK/coordinator.log" 2>&1 &
PIDS+=($!)
for k in 0 1; do
  ok=""
  for _ in $(seq 1 50); do
    if ip netns exec "${TAG}n$k" "$BIN/tessera-cli" health --address="$NET.1:7100" \
        --deadline_ms=300 > /dev/null 2>&1; then ok=1; break; fi
    sleep 0.1
  done
  [ -n "$ok" ] || fail "the coordinator is not reachable from worker $k's namespace"
done

WPIDS=()
for k in 0 1; do
  ip netns exec "${TAG}n$k" "$BIN/tessera-train" --coordinator="$NET.1:7100" --model=netns \
    --num_workers=2 --worker_index="$k" --worker_host="$NET.$((k + 2))" --steps=100 \
    --log_every=50 --held_out=1000 --rendezvous_timeout_s=60 > "$WORK/worker-$k.log" 2>&1 &
  WPIDS+=($!)
  PIDS+=($!)
done
for k in 0 1; do
  wait "${WPIDS[$k]}" || { cat "$WORK/worker-$k.log"; fail "worker $k failed"; }
done
for k in 0 1; do
  grep -q "all 2 workers connected" "$WORK/worker-$k.log" || fail "worker $k did not connect"
done
f0="$(grep -o 'dense parameters [0-9a-f]*' "$WORK/worker-0.log")"
f1="$(grep -o 'dense parameters [0-9a-f]*' "$WORK/worker-1.log")"
[ -n "$f0" ] && [ "$f0" = "$f1" ] || fail "the workers' dense parameters differ: '$f0' / '$f1'"
echo "netns workers test: ok ($f0 on workers at $NET.2 and $NET.3)"
