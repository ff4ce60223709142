#!/usr/bin/env bash
# Shards on their own hosts: each shard runs in a network namespace of its own, reached
# from the coordinator (in the test's namespace) over a veth pair. One shard's link is cut:
# lookups that need it fail with UNAVAILABLE naming it while the others keep serving; the
# link comes back: the same lookups succeed with the same rows. The namespaces and links
# are made here and removed on exit. Needs root and iproute2; exits 77 (skipped) without.
set -euo pipefail
ROOT="$1"
BIN="$2"
NAME="netns test"
TAG="ts$$"
NET="10.213"
source "$(dirname "$0")/netns_common.sh"
ip link add "${TAG}probe" type veth peer name "${TAG}probe2" 2>/dev/null ||
  skip "cannot create veth links here"
ip link del "${TAG}probe"
ip netns add "${TAG}n1"

shards=""
for k in 0 1; do
  ns="${TAG}n$k"
  link_namespace "$k" "$NET.$k.2"
  ip addr add "$NET.$k.1/24" dev "${TAG}h$k"
  ip netns exec "$ns" "$BIN/tessera-shard" --host="$NET.$k.2" --port=7001 --shard_index="$k" \
    --num_shards=2 > "$WORK/shard-$k.log" 2>&1 &
  PIDS+=($!)
  shards="${shards:+$shards,}$NET.$k.2:7001"
done
for k in 0 1; do
  for _ in $(seq 1 50); do
    "$BIN/tessera-cli" health --address="$NET.$k.2:7001" --deadline_ms=300 > /dev/null 2>&1 && break
    sleep 0.1
  done
  "$BIN/tessera-cli" health --address="$NET.$k.2:7001" > /dev/null || fail "shard $k not reachable across its link"
done
"$BIN/tessera-coordinator" --port=0 --shards="$shards" --health_check_ms=200 --shard_deadline_ms=1000 \
  > "$WORK/coordinator.out" 2> "$WORK/coordinator.log" &
PIDS+=($!)
for _ in $(seq 1 50); do grep -q "listening on" "$WORK/coordinator.out" && break; sleep 0.1; done
port="$(grep -o 'listening on 127.0.0.1:[0-9]*' "$WORK/coordinator.out" | cut -d: -f2)"
[ -n "$port" ] || fail "coordinator did not start"
CLI="$BIN/tessera-cli --coordinator=127.0.0.1:$port --deadline_ms=3000"

$CLI create --table=user --dim=4 > /dev/null || fail "create across namespaces"
IDS="1,2,3,4,5,6,7,8,9,10,11,12"
before="$($CLI lookup --table=user --ids=$IDS)" || fail "lookup across namespaces"
$CLI stats | grep -cE "^  [01] +$NET\.[01]\.2:7001 +SERVING" | grep -qx 2 || fail "both shards should serve"

ip link set "${TAG}h1" down  # cut shard 1's link
# Calls in flight when the link goes may time out (DEADLINE_EXCEEDED); once the
# coordinator's health checks find shard 1 gone, calls needing it fail at once with
# UNAVAILABLE.
down=""
for _ in $(seq 1 30); do
  if out="$($CLI lookup --table=user --ids=$IDS 2>&1)"; then sleep 0.2; continue; fi
  if echo "$out" | grep -q UNAVAILABLE; then down="$out"; break; fi
  echo "$out" | grep -q DEADLINE_EXCEEDED || fail "unexpected error with shard 1 cut off: $out"
done
[ -n "$down" ] || fail "no UNAVAILABLE with shard 1 cut off"
echo "$down" | grep -q "shard 1" || fail "the error should name shard 1: $down"
$CLI stats | grep -qE "^  1 +$NET\.1\.2:7001 +DOWN" || fail "stats should show shard 1 DOWN"

ip link set "${TAG}h1" up  # restore it
after=""
for _ in $(seq 1 100); do
  if after="$($CLI lookup --table=user --ids=$IDS 2>/dev/null)"; then break; fi
  after=""; sleep 0.2
done
[ -n "$after" ] || fail "lookups did not recover after the link came back"
[ "$after" = "$before" ] || fail "rows changed across the cut"
echo "netns test: ok (cut: $(echo "$down" | head -c 160))"
