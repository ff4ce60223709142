# Sourced by cluster.sh and by the tests that drive a local cluster: whether a server's
# process runs, and a bounded wait for one to exit.

# Whether process $1 runs. An exited server is a zombie until init reaps it, which can take
# seconds; it does not run (its port is free from its exit on).
running() {
  kill -0 "$1" 2>/dev/null || return 1
  [ "$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -c1)" != "Z" ]
}

# Waits until process $1 no longer runs, up to $2 tenths of a second (default 100).
wait_exited() {
  for _ in $(seq 1 "${2:-100}"); do running "$1" || return 0; sleep 0.1; done
}
