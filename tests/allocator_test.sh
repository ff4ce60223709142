#!/usr/bin/env bash
# The programs allocate with tcmalloc when the build found it (TESSERA_TCMALLOC), and with
# glibc's malloc otherwise: each program's dynamic dependencies name the library CMake
# chose, or no tcmalloc at all.
#   allocator_test.sh BUILD_DIR [TCMALLOC_LIBRARY]
set -euo pipefail
build="$1"
want="${2:-}"
status=0
for program in tessera-train tessera-shard tessera-coordinator tessera-cli tessera-serve; do
  deps="$(ldd "$build/$program")"
  if [ -n "$want" ]; then
    if ! grep -q "libtcmalloc_minimal" <<< "$deps"; then
      echo "FAIL: $program does not load tcmalloc ($want)"
      status=1
    fi
  elif grep -q "libtcmalloc" <<< "$deps"; then
    echo "FAIL: $program loads tcmalloc, but the build did not choose it"
    status=1
  fi
done
# A program that loads it runs on it: its malloc is tcmalloc's.
if [ -n "$want" ] && [ "$status" = 0 ]; then
  bindings="$(LD_DEBUG=bindings "$build/tessera-cli" --version 2>&1 >/dev/null)"
  if ! grep -q "to [^ ]*libtcmalloc_minimal[^ ]* .*normal symbol .malloc'" <<< "$bindings"; then
    echo "FAIL: tessera-cli does not bind malloc to tcmalloc"
    status=1
  fi
fi
if [ "$status" = 0 ]; then
  if [ -n "$want" ]; then echo "PASS: the programs allocate with $want"; else echo "PASS: the programs use glibc's malloc"; fi
fi
exit "$status"
