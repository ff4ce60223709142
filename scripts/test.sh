#!/usr/bin/env bash
# The tests: installs what they need besides the build's packages (PyTorch with OpenBLAS,
# clang-format for the format check, Redis and gnuplot for the benchmark harness, iproute2
# for the network tests), builds everything into build/, then runs ctest. Run scripts/setup.sh
# first. Extra arguments go to ctest (-R NAME, -L gpu, ...).
#
# With TESSERA_SANITIZED=1 (CI sets it) it also installs clang and builds the sanitized
# libFuzzer tree into build-fuzz/ (scripts/fuzz.sh build), so that the request fuzzer and
# the ASan/UBSan suites run too; without, those tests say they were not built and skip.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh

echo -n "test: "
# Debian's PyTorch does its matrix products through the libblas.so.3 alternative, which
# without OpenBLAS is the reference BLAS: 4x slower dense steps (BENCHMARKS.md, "Tables
# in the PyTorch process").
packages=(python3-torch libopenblas0 gnuplot-nox redis-server iproute2 clang-format-14)
if [ "${TESSERA_SANITIZED:-0}" = 1 ]; then packages+=(clang libclang-rt-14-dev); fi
install_packages "${packages[@]}"

JOBS="${JOBS:-2}"
cmake --build build -j"${JOBS}"
if [ "${TESSERA_SANITIZED:-0}" = 1 ]; then JOBS="$JOBS" ./scripts/fuzz.sh build; fi
# One test more than the build's jobs: the cluster tests spend part of their time waiting on
# their servers' processes, and a third test fills that time on 2 cores (163 s of ctest
# against 196 s at -j2, 2026-12-06). CTEST_JOBS overrides it.
ctest --test-dir build --output-on-failure -j"${CTEST_JOBS:-$((JOBS + 1))}" "$@"
