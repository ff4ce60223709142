#!/usr/bin/env bash
# Runs the embedding table's concurrency stress test as built with ASan and UBSan into
# build-fuzz/ by scripts/test.sh (scripts/fuzz.sh build): lock-free lookups that read a
# freed map, or any data race the sanitizers can see as a memory error, fail it. Exits 77
# (skipped) when that build is missing (no clang).
set -uo pipefail
ROOT="$1"
BINARY="$ROOT/build-fuzz/embedding/embedding_table_stress_test"
[ -x "$BINARY" ] || { echo "sanitized stress test not built (scripts/fuzz.sh build): skipped"; exit 77; }
source "$ROOT/tests/sanitized_build.sh"
require_fresh_build "$ROOT"
exec "$BINARY" --gtest_brief=1
