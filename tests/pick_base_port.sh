# Sourced by the cluster tests: sets TESSERA_BASE_PORT to a port below the ephemeral range
# (32768+) such that it and the next PORTS_NEEDED - 1 ports are free on 127.0.0.1.
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
