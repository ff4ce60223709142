#!/usr/bin/env bash
# The tests: installs what they need besides the build's packages (PyTorch, clang for
# the sanitized tree, clang-format for the format check, Redis and gnuplot for the
# benchmark harness, iproute2 for the network tests), builds everything into build/ and
# the sanitized libFuzzer tree into build-fuzz/ (scripts/fuzz.sh build), then runs
# ctest. Run scripts/setup.sh first. Extra arguments go to ctest (-R NAME, -L gpu, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh

echo -n "test: "
install_packages \
  python3-torch gnuplot-nox redis-server iproute2 clang libclang-rt-14-dev clang-format-14

JOBS="${JOBS:-2}"
cmake --build build -j"${JOBS}"
JOBS="$JOBS" ./scripts/fuzz.sh build
ctest --test-dir build --output-on-failure -j"${JOBS}" "$@"
