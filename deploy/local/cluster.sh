#!/usr/bin/env bash
# Starts, checks and stops a local Tessera cluster on loopback: N shards and a coordinator.
#
#   deploy/local/cluster.sh start N    # shards on BASE+1..BASE+N, coordinator on BASE
#   deploy/local/cluster.sh status
#   deploy/local/cluster.sh stop
#
# Environment: TESSERA_CLUSTER_DIR (state, logs; default .tessera-cluster in the repo),
# TESSERA_BASE_PORT (default 7000), TESSERA_BIN (binaries; default build/),
# TESSERA_SERVER_FLAGS (extra flags for every server: TLS, tokens; see docs/security.md) and
# TESSERA_CLIENT_FLAGS (the matching client flags, for the health checks here).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DIR="${TESSERA_CLUSTER_DIR:-$ROOT/.tessera-cluster}"
BASE="${TESSERA_BASE_PORT:-7000}"
BIN="${TESSERA_BIN:-$ROOT/build}"
CLI="$BIN/tessera-cli"
read -r -a SERVER_FLAGS <<< "${TESSERA_SERVER_FLAGS:-}"
read -r -a CLIENT_FLAGS <<< "${TESSERA_CLIENT_FLAGS:-}"

die() { echo "cluster: $*" >&2; exit 1; }

# The process of pid file $1 runs (a killed one not yet reaped, a zombie, does not).
alive() {
  [ -f "$1" ] || return 1
  local pid state
  pid="$(cat "$1")"
  kill -0 "$pid" 2>/dev/null || return 1
  state="$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -c1)"
  [ "$state" != "Z" ]
}

wait_healthy() {  # address, log
  for _ in $(seq 1 100); do
    if "$CLI" "${CLIENT_FLAGS[@]}" health --address="$1" --deadline_ms=200 >/dev/null 2>&1; then
      return 0
    fi
    sleep 0.1
  done
  die "$1 did not become healthy in 10 s; see $2"
}

start() {
  local n="${1:-}"
  [[ "$n" =~ ^[1-9][0-9]*$ ]] || die "usage: cluster.sh start N (N >= 1 shards)"
  for b in tessera-shard tessera-coordinator tessera-cli; do
    [ -x "$BIN/$b" ] || die "$BIN/$b not found; run ./scripts/setup.sh first"
  done
  if alive "$DIR/pids/coordinator.pid"; then die "a cluster is already running in $DIR"; fi
  # Rows live on the shard that ShardOf(id, N) names: data kept for another N would be
  # on the wrong shards.
  if [ -f "$DIR/num_shards" ] && [ -d "$DIR/data" ] && [ "$(cat "$DIR/num_shards")" != "$n" ]; then
    die "$DIR/data holds a cluster of $(cat "$DIR/num_shards") shard(s), not $n; start it with $(cat "$DIR/num_shards") or remove $DIR/data"
  fi
  mkdir -p "$DIR/logs" "$DIR/pids"
  echo "$n" > "$DIR/num_shards"
  rm -f "$DIR/tls"
  case " ${SERVER_FLAGS[*]:-} " in *" --tls_cert_file="*) touch "$DIR/tls" ;; esac
  echo "$BASE" > "$DIR/base_port"
  local shards=""
  for ((k = 0; k < n; k++)); do
    local port=$((BASE + 1 + k))
    mkdir -p "$DIR/data/shard-$k"
    "$BIN/tessera-shard" --port="$port" --shard_index="$k" --num_shards="$n" \
      --data_dir="$DIR/data/shard-$k" "${SERVER_FLAGS[@]}" >> "$DIR/logs/shard-$k.log" 2>&1 &
    echo $! > "$DIR/pids/shard-$k.pid"
    shards="${shards:+$shards,}127.0.0.1:$port"
  done
  for ((k = 0; k < n; k++)); do
    wait_healthy "127.0.0.1:$((BASE + 1 + k))" "$DIR/logs/shard-$k.log"
  done
  mkdir -p "$DIR/data/coordinator"
  "$BIN/tessera-coordinator" --port="$BASE" --shards="$shards" \
    --data_dir="$DIR/data/coordinator" "${SERVER_FLAGS[@]}" >> "$DIR/logs/coordinator.log" 2>&1 &
  echo $! > "$DIR/pids/coordinator.pid"
  wait_healthy "127.0.0.1:$BASE" "$DIR/logs/coordinator.log"
  echo "cluster: $n shard(s) on 127.0.0.1:$((BASE + 1))-$((BASE + n)), coordinator on 127.0.0.1:$BASE"
  echo "cluster: logs in $DIR/logs, data in $DIR/data (kept across restarts)"
}

# One process's line: SERVING, DOWN (not running) or UNREACHABLE (running, but its health
# check failed, with why: most often TLS flags that do not match the servers').
report() {  # name, address, pid file
  local out
  if ! alive "$3"; then
    echo "$1  $2  DOWN (not running)"
    return 1
  fi
  if out="$("$CLI" "${CLIENT_FLAGS[@]}" health --address="$2" 2>&1)"; then
    echo "$1  $2  SERVING"
    return 0
  fi
  local why="${out#tessera-cli: }"
  if [ -f "$DIR/tls" ] && [ "${#CLIENT_FLAGS[@]}" -eq 0 ]; then
    why="the cluster was started with TLS: set TESSERA_CLIENT_FLAGS to this client's TLS flags (docs/security.md)"
  fi
  echo "$1  $2  UNREACHABLE (running, but its health check failed: ${why%%$'\n'*})"
  return 1
}

status() {
  [ -d "$DIR/pids" ] || { echo "cluster: not running"; return 1; }
  local base n bad=0
  base="$(cat "$DIR/base_port")"
  n="$(cat "$DIR/num_shards")"
  for ((k = 0; k < n; k++)); do
    report "shard $k      " "127.0.0.1:$((base + 1 + k))" "$DIR/pids/shard-$k.pid" || bad=1
  done
  report "coordinator   " "127.0.0.1:$base" "$DIR/pids/coordinator.pid" || bad=1
  return $bad
}

stop() {
  [ -d "$DIR/pids" ] || { echo "cluster: not running"; return 0; }
  local pids=()
  for f in "$DIR"/pids/*.pid; do
    [ -f "$f" ] || continue
    if alive "$f"; then kill -TERM "$(cat "$f")" 2>/dev/null || true; pids+=("$(cat "$f")"); fi
  done
  for _ in $(seq 1 50); do
    local left=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
    [ "$left" = 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$DIR/pids"
  echo "cluster: stopped"
}

case "${1:-}" in
  start) start "${2:-}" ;;
  status) status ;;
  stop) stop ;;
  *) die "usage: cluster.sh start N | status | stop" ;;
esac
