#!/usr/bin/env bash
# Builds the libFuzzer target over the shard's request handlers with clang, ASan and UBSan
# (into build-fuzz/, only what it needs), then fuzzes for a bounded time from the seed
# corpus in tests/fuzz_corpus (new inputs go to build-fuzz/corpus, findings to
# build-fuzz/findings). Exits non-zero on any crash, leak or sanitizer report.
#
#   scripts/fuzz.sh [seconds]        # default 60
#   scripts/fuzz.sh build            # only build it (scripts/test.sh does, for CI)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_TO_RUN="${1:-60}"
command -v clang++ > /dev/null || { echo "fuzz: clang++ not found (apt-get install clang)"; exit 1; }
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
  -DTESSERA_FUZZ=ON -DTESSERA_SANITIZE=address,undefined -DTESSERA_BUILD_BENCHMARKS=OFF \
  -DTESSERA_CUDA=OFF > /dev/null
# The state of the tree it is built from, for the sanitized tests to compare with the tree
# they run in (tests/sanitized_build.sh): taken before the build, written once it is done.
source tests/sanitized_build.sh
state="$(source_state .)"
# The table's lock-free lookup stress test too, for tests/sanitized_stress_test.sh, and the
# cluster suites of tests/sanitized_cluster_test.sh with the binaries they start.
cmake --build build-fuzz -j"${JOBS:-2}" --target request_fuzzer embedding_table_stress_test \
  train_e2e_test exactly_once_test shared_cluster_test reshard_test
echo "$state" > build-fuzz/source-state
[ "$SECONDS_TO_RUN" = build ] && exit 0
mkdir -p build-fuzz/corpus build-fuzz/findings
# -rss_limit_mb: the fixture's tables and a 512-id batch of dim 1024 fit well inside it.
build-fuzz/server/request_fuzzer build-fuzz/corpus tests/fuzz_corpus \
  -max_total_time="$SECONDS_TO_RUN" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
  -artifact_prefix=build-fuzz/findings/ 2>&1 | tail -n 25
