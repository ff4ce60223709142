#!/usr/bin/env bash
# The programs allocate with tcmalloc when the build found it (TESSERA_TCMALLOC), and with
# glibc's malloc otherwise: each program's dynamic dependencies name the library CMake
# chose, or no tcmalloc at all, and a program that loads it binds malloc to it.
#   allocator_test.sh TCMALLOC_LIBRARY|glibc PROGRAM...
set -euo pipefail
want="$1"
shift
status=0
for program in "$@"; do
  deps="$(ldd "$program")"
  if [ "$want" = glibc ]; then
    if grep -q "libtcmalloc" <<< "$deps"; then
      echo "FAIL: $program loads tcmalloc, but the build did not choose it"
      status=1
    fi
    continue
  fi
  if ! grep -q "libtcmalloc_minimal" <<< "$deps"; then
    echo "FAIL: $program does not load tcmalloc ($want)"
    status=1
    continue
  fi
  bindings="$(LD_DEBUG=bindings "$program" --version 2>&1 >/dev/null)"
  if ! grep -q "to [^ ]*libtcmalloc_minimal[^ ]* .*normal symbol .malloc'" <<< "$bindings"; then
    echo "FAIL: $program does not bind malloc to tcmalloc"
    status=1
  fi
done
[ "$status" = 0 ] && echo "PASS: $# programs allocate with $want"
exit "$status"
