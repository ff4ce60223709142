#!/usr/bin/env bash
# Installs every Debian package the build needs (idempotent), then configures and
# builds Tessera into build/. Safe to run again: apt skips what is installed and
# CMake rebuilds only what changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(
  build-essential cmake pkg-config git
  protobuf-compiler libprotobuf-dev libprotoc-dev
  protobuf-compiler-grpc libgrpc++-dev libgrpc-dev
  libabsl-dev libeigen3-dev librocksdb-dev zlib1g-dev libgloo-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  python3 python3-grpcio python3-protobuf python3-numpy python3-yaml python3-torch
  gnuplot-nox redis-server libhiredis-dev
  openssl prometheus-cpp-dev libspdlog-dev iproute2 clang libclang-rt-14-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ "${#missing[@]}" -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup: all packages present"
fi

JOBS="${JOBS:-2}"
cmake -S . -B build -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE:-Release}" ${TESSERA_CMAKE_ARGS:-}
cmake --build build -j"${JOBS}"
# The libFuzzer target (clang, ASan, UBSan) into build-fuzz/; its CI run is a test.
JOBS="$JOBS" ./scripts/fuzz.sh build
echo "setup: build complete in build/"
