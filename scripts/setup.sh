#!/usr/bin/env bash
# Installs the Debian packages the build needs (idempotent), then configures Tessera into
# build/ and builds its programs: tessera-train, tessera-shard, tessera-coordinator,
# tessera-cli, tessera-serve, the Python stubs and tessera._core (the core as a Python
# extension, tessera.local). scripts/test.sh builds the rest (tests, benchmarks,
# the sanitized tree) and runs the tests. Safe to run again: apt skips what is installed
# and CMake rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/packages.sh

# What configuring and building the programs takes (CMake finds GoogleTest and Google
# Benchmark at configure time, so they are here too), and what the Python client imports.
echo -n "setup: "
install_packages \
  build-essential cmake pkg-config git \
  protobuf-compiler libprotobuf-dev libprotoc-dev \
  protobuf-compiler-grpc libgrpc++-dev libgrpc-dev \
  libabsl-dev libeigen3-dev librocksdb-dev zlib1g-dev libgloo-dev \
  libgtest-dev libgmock-dev googletest libbenchmark-dev libhiredis-dev \
  python3 python3-dev pybind11-dev python3-grpcio python3-protobuf python3-numpy python3-yaml \
  prometheus-cpp-dev libspdlog-dev openssl libtcmalloc-minimal4

JOBS="${JOBS:-2}"
cmake -S . -B build -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" ${TESSERA_CMAKE_ARGS:-}
cmake --build build -j"${JOBS}" --target tessera_products
echo "setup: the programs are built in build/ (scripts/test.sh builds and runs the tests)"
