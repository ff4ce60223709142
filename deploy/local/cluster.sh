#!/usr/bin/env bash
# Starts, checks and stops a local Tessera cluster on loopback: N shards and a coordinator.
#
#   deploy/local/cluster.sh start N    # shards on BASE+1..BASE+N, coordinator on BASE
#   deploy/local/cluster.sh status
#   deploy/local/cluster.sh start-shard K  # brings back shard K of the running cluster (its
#                                          # place, map version and data directory)
#   deploy/local/cluster.sh reshard M  # the running cluster to M shards, live (tessera-cli
#                                      # reshard); start then takes M; M = N: nothing to do
#   deploy/local/cluster.sh serve MODEL [K]  # serving replica K (default 0) of MODEL on
#                                            # BASE+100+K, following the running cluster
#   deploy/local/cluster.sh serve MODEL K CHECKPOINT  # ... of its checkpoint CHECKPOINT (a
#                                            # step, or newest), frozen
#   deploy/local/cluster.sh stop             # the replicas too
#
# Environment: TESSERA_CLUSTER_DIR (state, logs; default .tessera-cluster in the repo),
# TESSERA_BASE_PORT (default 7000), TESSERA_BIN (binaries; default build/),
# TESSERA_SERVER_FLAGS (extra flags for every server: TLS, tokens; see docs/security.md),
# TESSERA_SHARD_FLAGS (for the shards only: --memory_limit, ...),
# TESSERA_COORDINATOR_FLAGS (for the coordinator only: --health_check_ms, ...),
# TESSERA_SERVE_FLAGS (for the replicas only: --format=int8, --tables=..., ...) and
# TESSERA_CLIENT_FLAGS (the matching client flags, for the health checks here).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
source "$ROOT/deploy/local/processes.sh"  # running, wait_exited
DIR="${TESSERA_CLUSTER_DIR:-$ROOT/.tessera-cluster}"
BASE="${TESSERA_BASE_PORT:-7000}"
BIN="${TESSERA_BIN:-$ROOT/build}"
CLI="$BIN/tessera-cli"
read -r -a SERVER_FLAGS <<< "${TESSERA_SERVER_FLAGS:-}"
read -r -a SHARD_FLAGS <<< "${TESSERA_SHARD_FLAGS:-}"
read -r -a COORDINATOR_FLAGS <<< "${TESSERA_COORDINATOR_FLAGS:-}"
read -r -a CLIENT_FLAGS <<< "${TESSERA_CLIENT_FLAGS:-}"
read -r -a SERVE_FLAGS <<< "${TESSERA_SERVE_FLAGS:-}"

die() { echo "cluster: $*" >&2; exit 1; }

# Whether the process of pid file $1 runs.
alive() {
  [ -f "$1" ] && running "$(cat "$1")"
}

wait_healthy() {  # address, log, pid file: 1, saying why, when it exits or stays unhealthy
  for _ in $(seq 1 100); do
    if "$CLI" "${CLIENT_FLAGS[@]}" health --address="$1" --deadline_ms=200 >/dev/null 2>&1; then
      return 0
    fi
    if ! alive "$3"; then
      echo "cluster: $1 exited at start-up: $(tail -n 1 "$2")" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "cluster: $1 did not become healthy in 10 s; see $2" >&2
  return 1
}

start_shard() {  # index, shards, map version
  local port=$((BASE + 1 + $1))
  mkdir -p "$DIR/data/shard-$1"
  "$BIN/tessera-shard" --port="$port" --shard_index="$1" --num_shards="$2" \
    --shard_map_version="$3" --data_dir="$DIR/data/shard-$1" "${SERVER_FLAGS[@]}" \
    "${SHARD_FLAGS[@]}" \
    >> "$DIR/logs/shard-$1.log" 2>&1 &
  echo $! > "$DIR/pids/shard-$1.pid"
}

stop_shard() {  # index: SIGTERM, up to 5 s to exit, then SIGKILL
  if alive "$DIR/pids/shard-$1.pid"; then
    local pid
    pid="$(cat "$DIR/pids/shard-$1.pid")"
    kill -TERM "$pid" 2>/dev/null || true
    wait_exited "$pid" 50
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$DIR/pids/shard-$1.pid"
}

# Moves the running cluster to M shards while it serves: new shards start empty with their
# place in the next map, tessera-cli reshard moves the rows, shards left out are stopped and
# their data directories kept aside (shard-K.left-V).
reshard() {
  local m="${1:-}"
  [[ "$m" =~ ^[1-9][0-9]*$ ]] || die "usage: cluster.sh reshard M (M >= 1 shards)"
  alive "$DIR/pids/coordinator.pid" || die "no cluster running in $DIR"
  local n version base shards=""
  n="$(cat "$DIR/num_shards")"
  version="$(cat "$DIR/map_version")"
  base="$(cat "$DIR/base_port")"
  [ "$base" = "$BASE" ] || die "the cluster runs on base port $base; set TESSERA_BASE_PORT=$base"
  if [ "$m" = "$n" ]; then
    echo "cluster: already $n shard(s), shard map version $version; nothing to do"
    return 0
  fi
  for ((k = n; k < m; k++)); do
    [ -e "$DIR/data/shard-$k" ] && mv "$DIR/data/shard-$k" "$DIR/data/shard-$k.old-$(date +%s)"
    start_shard "$k" "$m" "$((version + 1))"
  done
  for ((k = n; k < m; k++)); do
    if ! wait_healthy "127.0.0.1:$((BASE + 1 + k))" "$DIR/logs/shard-$k.log" \
        "$DIR/pids/shard-$k.pid"; then
      for ((j = n; j < m; j++)); do stop_shard "$j"; done
      die "reshard to $m shards not started: a new shard did not come up"
    fi
  done
  for ((k = 0; k < m; k++)); do shards="${shards:+$shards,}127.0.0.1:$((BASE + 1 + k))"; done
  if ! "$CLI" "${CLIENT_FLAGS[@]}" --coordinator="127.0.0.1:$BASE" reshard --shards="$shards"; then
    # Not published: the new shards go (running it again finishes one that published).
    if "$CLI" "${CLIENT_FLAGS[@]}" --coordinator="127.0.0.1:$BASE" shardmap 2>/dev/null \
        | grep -qx "version $version"; then
      for ((k = n; k < m; k++)); do stop_shard "$k"; done
    fi
    die "reshard to $m shards failed (see above)"
  fi
  echo "$m" > "$DIR/num_shards"
  echo "$((version + 1))" > "$DIR/map_version"
  for ((k = m; k < n; k++)); do
    stop_shard "$k"
    mv "$DIR/data/shard-$k" "$DIR/data/shard-$k.left-$((version + 1))"
  done
  echo "cluster: $m shard(s), shard map version $((version + 1))"
}

# Brings back shard K of the running cluster when it is not running: with its place and the
# map version the cluster serves, on its port and data directory.
start_one_shard() {
  local k="${1:-}" n version
  alive "$DIR/pids/coordinator.pid" || die "no cluster running in $DIR; use cluster.sh start N"
  n="$(cat "$DIR/num_shards")"
  version="$(cat "$DIR/map_version")"
  [[ "$k" =~ ^[0-9]+$ ]] && [ "$k" -lt "$n" ] \
    || die "usage: cluster.sh start-shard K (K in 0..$((n - 1)))"
  [ "$(cat "$DIR/base_port")" = "$BASE" ] \
    || die "the cluster runs on base port $(cat "$DIR/base_port"); set TESSERA_BASE_PORT to it"
  if alive "$DIR/pids/shard-$k.pid"; then die "shard $k is running already"; fi
  start_shard "$k" "$n" "$version"
  if ! wait_healthy "127.0.0.1:$((BASE + 1 + k))" "$DIR/logs/shard-$k.log" \
      "$DIR/pids/shard-$k.pid"; then
    stop_shard "$k"
    die "shard $k did not start (see $DIR/logs/shard-$k.log)"
  fi
  echo "cluster: shard $k of $n serving on 127.0.0.1:$((BASE + 1 + k)), shard map version $version"
}

# After a failed start: stops what it started, then says why.
abandon_start() {  # message
  stop >/dev/null 2>&1 || true
  die "$1; stopped what this start had started"
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
  # The shard map version: 1, then one more at each reshard.
  local version=1
  [ -f "$DIR/map_version" ] && [ -d "$DIR/data" ] && version="$(cat "$DIR/map_version")"
  echo "$version" > "$DIR/map_version"
  rm -f "$DIR/tls"
  case " ${SERVER_FLAGS[*]:-} " in *" --tls_cert_file="*) touch "$DIR/tls" ;; esac
  echo "$BASE" > "$DIR/base_port"
  local shards=""
  for ((k = 0; k < n; k++)); do
    local port=$((BASE + 1 + k))
    mkdir -p "$DIR/data/shard-$k"
    start_shard "$k" "$n" "$version"
    shards="${shards:+$shards,}127.0.0.1:$port"
  done
  for ((k = 0; k < n; k++)); do
    wait_healthy "127.0.0.1:$((BASE + 1 + k))" "$DIR/logs/shard-$k.log" \
      "$DIR/pids/shard-$k.pid" || abandon_start "shard $k did not start"
  done
  mkdir -p "$DIR/data/coordinator"
  "$BIN/tessera-coordinator" --port="$BASE" --shards="$shards" --shard_map_version="$version" \
    --data_dir="$DIR/data/coordinator" "${SERVER_FLAGS[@]}" "${COORDINATOR_FLAGS[@]}" \
    >> "$DIR/logs/coordinator.log" 2>&1 &
  echo $! > "$DIR/pids/coordinator.pid"
  wait_healthy "127.0.0.1:$BASE" "$DIR/logs/coordinator.log" "$DIR/pids/coordinator.pid" \
    || abandon_start "the coordinator did not start"
  echo "cluster: $n shard(s) on 127.0.0.1:$((BASE + 1))-$((BASE + n)), coordinator on 127.0.0.1:$BASE"
  echo "cluster: logs in $DIR/logs, data in $DIR/data (kept across restarts)"
}

# A serving replica of model $1 (tessera-serve), index $2 (default 0), on BASE+100+K: it
# reads every shard's rows (or reads on from the state it saved in data/serve-K when it ran
# before), then follows the cluster. Ready (SERVING in status) once it is
# caught up and holds a dense network the trainer published (--publish_dense_every).
# With $3 (a step, or "newest"): a replica of that checkpoint of the model, frozen.
serve() {
  local model="${1:-}" k="${2:-0}" checkpoint="${3:-}"
  [[ "$model" =~ ^[A-Za-z0-9_-]{1,64}$ ]] && [[ "$k" =~ ^[0-9]+$ ]] \
    && [[ "$checkpoint" =~ ^([0-9]+|newest)?$ ]] \
    || die "usage: cluster.sh serve MODEL [K [CHECKPOINT]] (a model name, a replica index" \
      "K >= 0, a checkpoint's step or 'newest')"
  [ -x "$BIN/tessera-serve" ] || die "$BIN/tessera-serve not found; run ./scripts/setup.sh first"
  alive "$DIR/pids/coordinator.pid" || die "no cluster runs in $DIR: cluster.sh start N first"
  if alive "$DIR/pids/serve-$k.pid"; then die "replica $k runs already"; fi
  local base port log before
  base="$(cat "$DIR/base_port")"
  port=$((base + 100 + k))
  log="$DIR/logs/serve-$k.log"
  touch "$log"
  before="$(wc -l < "$log")"
  local kept=(--state_dir="$DIR/data/serve-$k")  # a checkpoint's replica reads it again
  [ -n "$checkpoint" ] && kept=(--checkpoint="$checkpoint")
  mkdir -p "$DIR/data/serve-$k"
  "$BIN/tessera-serve" --port="$port" --coordinator="127.0.0.1:$base" --model="$model" \
    "${kept[@]}" "${SERVER_FLAGS[@]}" "${SERVE_FLAGS[@]}" >> "$log" 2>&1 &
  echo $! > "$DIR/pids/serve-$k.pid"
  for _ in $(seq 1 600); do
    if tail -n +"$((before + 1))" "$log" | grep -q "listening on"; then
      echo "cluster: replica $k of model '$model' on 127.0.0.1:$port (log $log)"
      return 0
    fi
    alive "$DIR/pids/serve-$k.pid" || die "replica $k exited at start-up: $(tail -n 1 "$log")"
    sleep 0.1
  done
  die "replica $k did not start listening in 60 s; see $log"
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
  if [[ "$out" == *NOT_SERVING ]]; then
    echo "$1  $2  NOT READY (running; catching up, or no dense network published yet)"
    return 1
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
  for f in "$DIR"/pids/serve-*.pid; do
    [ -f "$f" ] || continue
    local r="${f##*/serve-}"
    r="${r%.pid}"
    report "replica $r     " "127.0.0.1:$((base + 100 + r))" "$f" || bad=1
  done
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
    for p in "${pids[@]}"; do running "$p" && left=1; done
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
  start-shard) start_one_shard "${2:-}" ;;
  reshard) reshard "${2:-}" ;;
  serve) serve "${2:-}" "${3:-}" "${4:-}" ;;
  stop) stop ;;
  *) die "usage: cluster.sh start N | status | start-shard K | reshard M | serve MODEL [K [CHECKPOINT]] | stop" ;;
esac
