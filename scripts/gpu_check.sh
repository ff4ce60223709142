#!/usr/bin/env bash
# The CUDA dense backend's GPU checks, for a machine with an NVIDIA GPU, its driver and
# CUDA 13's cuBLAS, but none of this project's Debian libraries (gRPC, protobuf, abseil,
# RocksDB, gloo): the `device` machine.
#
#   scripts/gpu_check.sh pack   # here, after scripts/test.sh: the test binaries,
#                               # tessera-train, tessera-bench and every library they load
#                               # (glibc and its loader included) into gpu-check/bundle.tar.gz
#   scripts/gpu_check.sh run    # there, from the repository root: unpacks the bundle and
#                               # runs the checks; results go to $OUT (else gpu-check/results)
#
# `run` starts every binary through the bundle's own loader, so they run on the glibc they
# were built against whatever the machine has; cuBLAS and the driver come from the machine.
# It runs cuda_dense_backend_test (the backend against the CPU backend: forward, backward,
# 100 steps, state both ways), device_table_test (device tables against host tables: 200
# pooled steps of each optimizer and dtype, a full table, rows in and out),
# train_cuda_test (the default run on each backend, and with --shards=cuda: the same AUC
# within 0.002; checkpoints resumed across backends) and tessera-bench on
# benchmarks/scenarios/cuda.json (the dense step at batch 2048 against cuBLAS's GEMM
# ceiling) and on benchmarks/scenarios/cuda_host_tables.json (Criteo at batch 4096 with 26
# host tables of 1M rows, synchronous and overlapped), and tessera-device-table-benchmark
# (device tables of 10M and 100M rows against a flat gather). Exits non-zero when any
# fails or skips.
set -euo pipefail
cd "$(dirname "$0")/.."
BINS="build/tessera-train build/tessera-bench build/trainer/cuda_dense_backend_test
  build/tests/train_e2e_test build/embedding/device_table_test build/tessera-device-table-benchmark"

case "${1:-}" in
  pack)
    for b in $BINS; do
      [ -x "$b" ] || { echo "gpu_check: $b is missing; run scripts/setup.sh and scripts/test.sh first" >&2; exit 1; }
    done
    if ./build/trainer/cuda_dense_backend_test 2>&1 | grep -q "this build has no CUDA backend"; then
      echo "gpu_check: build/ has no CUDA backend (configure with -DTESSERA_CUDA=AUTO where nvcc is)" >&2
      exit 1
    fi
    stage=$(mktemp -d)
    trap 'rm -rf "$stage"' EXIT
    mkdir -p "$stage/bin" "$stage/lib" gpu-check
    cp $BINS "$stage/bin/"
    for b in $BINS; do ldd "$b"; done |
      awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*ld-linux/ {print $1}' | sort -u |
      while read -r lib; do cp -L "$lib" "$stage/lib/"; done
    tar -C "$stage" -czf gpu-check/bundle.tar.gz .
    echo "gpu_check: gpu-check/bundle.tar.gz, $(du -h gpu-check/bundle.tar.gz | cut -f1)," \
      "$(ls "$stage/lib" | wc -l) libraries"
    ;;
  run)
    [ -f gpu-check/bundle.tar.gz ] || { echo "gpu_check: no gpu-check/bundle.tar.gz; run 'pack' first" >&2; exit 1; }
    out="${OUT:-gpu-check/results}"
    mkdir -p "$out"
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    tar -C "$dir" -xzf gpu-check/bundle.tar.gz
    loader=$(ls "$dir"/lib/ld-linux*.so.* | head -1)
    # The bundle first; cuBLAS from the machine's CUDA.
    libpath="$dir/lib"
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
      /usr/local/cuda-13*/lib64 /usr/local/cuda-13*/targets/x86_64-linux/lib \
      $(ldconfig -p 2>/dev/null | awk '/libcublas\.so\.13/ {print $NF}' | xargs -r -n1 dirname); do
      [ -d "$d" ] && libpath="$libpath:$d"
    done
    # Where no system cuBLAS 13 is, a Python wheel's (nvidia-cublas) will do.
    have_cublas=""
    for d in ${libpath//:/ }; do [ -e "$d/libcublas.so.13" ] && have_cublas=1; done
    if [ -z "$have_cublas" ]; then
      for f in $(find /usr /opt -name 'libcublas.so.13' 2>/dev/null | head -3); do
        libpath="$libpath:$(dirname "$f")"
      done
    fi
    echo "gpu_check: library path $libpath" | tee "$out/env.txt"
    export TESSERA_TRAIN_BIN="$loader --library-path $libpath $dir/bin/tessera-train"
    (nvidia-smi || true) > "$out/nvidia-smi.txt" 2>&1
    # Each step is bounded, so one that hangs leaves time and results for the others.
    on_bundle() { timeout "$1" "$loader" --library-path "$libpath" "${@:2}"; }
    failed=""
    on_bundle 150 "$dir/bin/cuda_dense_backend_test" 2>&1 | tee "$out/cuda_dense_backend_test.txt" ||
      failed="$failed cuda_dense_backend_test"
    on_bundle 150 "$dir/bin/device_table_test" 2>&1 | tee "$out/device_table_test.txt" ||
      failed="$failed device_table_test"
    on_bundle 300 "$dir/bin/train_e2e_test" --gpu 2>&1 | tee "$out/train_cuda_test.txt" ||
      failed="$failed train_cuda_test"
    on_bundle 150 "$dir/bin/tessera-bench" --scenarios=benchmarks/scenarios/cuda.json \
      --prices=benchmarks/prices.json --out="$out/bench" 2>&1 | tee "$out/bench.txt" ||
      failed="$failed tessera-bench"
    # Criteo's MLPs at batch 4096 with 26 host tables of 1M rows, synchronous and with the
    # tables' work hidden behind the dense step (--max_staleness=1): samples/s, the sparse
    # work, dense and step times, and the dense step's own samples/s (its ceiling).
    on_bundle 150 "$dir/bin/tessera-bench" --scenarios=benchmarks/scenarios/cuda_host_tables.json \
      --prices=benchmarks/prices.json --out="$out/bench_host_tables" 2>&1 | tee "$out/bench_host_tables.txt" ||
      failed="$failed tessera-bench-host-tables"
    # The same Criteo scenario with the 26 tables in the GPU's memory (--shards=cuda).
    on_bundle 150 "$dir/bin/tessera-bench" --scenarios=benchmarks/scenarios/cuda_device_tables.json \
      --prices=benchmarks/prices.json --out="$out/bench_device_tables" 2>&1 |
      tee "$out/bench_device_tables.txt" || failed="$failed tessera-bench-device-tables"
    # Device tables against a flat gather of the same rows (vs_flat), 10M and 100M rows.
    on_bundle 240 "$dir/bin/tessera-device-table-benchmark" --repeats=1 --steps=20 2>&1 |
      tee "$out/device_table_benchmark.txt" || failed="$failed tessera-device-table-benchmark"
    # The default run on the GPU, for its figures (train_cuda_test checked its AUC).
    on_bundle 120 "$dir/bin/tessera-train" --dense_backend=cuda > "$out/train_default_cuda.txt" 2>&1 ||
      failed="$failed tessera-train"
    tail -4 "$out/train_default_cuda.txt"
    # Where the machine has Nsight Systems: the Criteo step's kernels and copies, for
    # finding where a step's time goes (best effort: it does not decide the check).
    if command -v nsys > /dev/null; then
      (cd "$out" && timeout 150 nsys profile --stats=true -o criteo_step --force-overwrite true \
        "$loader" --library-path "$libpath" "$dir/bin/cuda_dense_backend_test" \
        --gtest_filter='*CriteoStepAgainstTheGemmCeiling*') > "$out/nsys.txt" 2>&1 || true
      rm -f "$out"/criteo_step.nsys-rep "$out"/criteo_step.sqlite
    fi
    if [ -n "$failed" ]; then
      echo "gpu_check: FAILED (or skipped):$failed" >&2
      exit 1
    fi
    echo "gpu_check: all passed; results in $out"
    ;;
  *)
    echo "usage: scripts/gpu_check.sh pack|run" >&2
    exit 2
    ;;
esac
