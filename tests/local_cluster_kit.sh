# Sourced by the tests that run a local cluster with deploy/local/cluster.sh, with the
# test's two arguments and the number of ports the cluster needs:
#   source "$(dirname "$0")/local_cluster_kit.sh" "$1" "$2" PORTS
# Sets ROOT and BIN, CLUSTER (the script), base (the first of PORTS free ports on
# 127.0.0.1, the cluster's TESSERA_BASE_PORT) and a TESSERA_CLUSTER_DIR of the test's own,
# removed with the cluster stopped on exit; `fail MESSAGE` ends the test. `running PID` and
# `wait_exited PID` come from deploy/local/processes.sh: a cluster's server that exited is
# a zombie until init reaps it, seconds later on some machines, which `kill -0` counts as
# running.
ROOT="$1"
BIN="$2"
export TESSERA_BIN="$BIN"
export TESSERA_CLUSTER_DIR="$(mktemp -d)"
# TESSERA_BASE_PORT: a port below the ephemeral range (32768+) such that it and the next
# NEED - 1 ports are free on 127.0.0.1.
pick_base_port() {
  local need="$1" base busy
  for _ in $(seq 1 20); do
    base=$((20000 + RANDOM % 12000))
    busy=0
    for ((p = base; p < base + need; p++)); do
      if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then busy=1; fi
    done
    [ "$busy" = 0 ] && break
  done
  export TESSERA_BASE_PORT="$base"
}
pick_base_port "$3"
base="$TESSERA_BASE_PORT"
CLUSTER="$ROOT/deploy/local/cluster.sh"
cleanup() { "$CLUSTER" stop >/dev/null 2>&1 || true; rm -rf "$TESSERA_CLUSTER_DIR"; }
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
source "$ROOT/deploy/local/processes.sh"
