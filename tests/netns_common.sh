# What the network-namespace tests share; each sources it after setting NAME (its name in
# messages) and TAG (the prefix of every namespace and link it makes). Gives fail and
# skip (exit 77), WORK (a scratch folder) and PIDS (processes to stop), checks for root
# and iproute2, and makes the namespace ${TAG}n0, skipping where namespaces cannot be
# made. On exit it stops PIDS and removes ${TAG}n0/n1, the links ${TAG}h0/h1, the bridge
# ${TAG}br if there is one, and WORK.
fail() { echo "FAIL: $*"; exit 1; }
skip() { echo "$NAME: $*, skipped"; exit 77; }
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null; then
  skip "needs root and iproute2"
fi
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.3
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  for k in 0 1; do
    ip link del "${TAG}h$k" 2>/dev/null || true
    ip netns del "${TAG}n$k" 2>/dev/null || true
  done
  ip link del "${TAG}br" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
# link_namespace K ADDRESS [BRIDGE]: a veth pair from this namespace (end ${TAG}hK, up, in
# BRIDGE when given) into namespace ${TAG}nK (end ${TAG}vK, up, with ADDRESS/24), whose
# loopback comes up too.
link_namespace() {
  local k="$1" address="$2" bridge="${3:-}" ns="${TAG}n$1"
  ip link add "${TAG}h$k" type veth peer name "${TAG}v$k"
  ip link set "${TAG}v$k" netns "$ns"
  if [ -n "$bridge" ]; then ip link set "${TAG}h$k" master "$bridge"; fi
  ip link set "${TAG}h$k" up
  ip netns exec "$ns" ip addr add "$address/24" dev "${TAG}v$k"
  ip netns exec "$ns" ip link set "${TAG}v$k" up
  ip netns exec "$ns" ip link set lo up
}
ip netns add "${TAG}n0" 2>/dev/null || skip "cannot create network namespaces here"
