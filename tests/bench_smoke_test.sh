#!/usr/bin/env bash
# tessera-bench end to end on the smoke scenarios (seconds): in-process and a local
# cluster; the report, the JSON records and (with gnuplot) the plots must come out.
set -euo pipefail
ROOT="$1"
BIN="$2"
OUT="$(mktemp -d)"
trap 'rm -rf "$OUT"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# The gather against torch's (benchmarks/gather_vs_torch.py) on small tables: every case
# gives a line with both rates and the ratio, and the JSON the same.
PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/benchmarks/gather_vs_torch.py" --bytes=4194304 \
  --seconds=0.05 --json="$OUT/gather.json" > "$OUT/gather.log" 2>&1 \
  || { cat "$OUT/gather.log"; fail "gather_vs_torch.py failed"; }
[ "$(grep -c "x the best" "$OUT/gather.log")" = 8 ] || { cat "$OUT/gather.log"; fail "not 8 cases"; }
/usr/bin/python3 -c "import json, sys; r = json.load(open(sys.argv[1])); \
assert len(r) == 8 and all(x['vs_torch'] > 0 and x['torch_sum_rows_per_s'] > 0 for x in r), r" \
  "$OUT/gather.json" || fail "gather.json without 8 positive ratios"

# Training through a local cluster against in process (benchmarks/cluster_vs_inprocess.sh),
# one short round: a ratio and the servers' and the trainer's CPU per step for each client
# mode, and no server left behind.
TESSERA_BIN="$BIN" TESSERA_BASE_PORT=27680 "$ROOT/benchmarks/cluster_vs_inprocess.sh" --rounds=1 -- --steps=20 \
  > "$OUT/cluster.log" 2>&1 || { cat "$OUT/cluster.log"; fail "cluster_vs_inprocess.sh failed"; }
for mode in coordinator smart; do
  grep -Eq "^median $mode 0\.[0-9]*[1-9][0-9]*x|^median $mode [1-9]" "$OUT/cluster.log" \
    || { cat "$OUT/cluster.log"; fail "no ratio for $mode"; }
  grep -Eq "^median $mode .*CPU per step: shards [0-9]+ us, coordinator [0-9]+ us, trainer [1-9][0-9]* us$" \
    "$OUT/cluster.log" || { cat "$OUT/cluster.log"; fail "no CPU per step for $mode"; }
done
pgrep -f "tessera-(shard|coordinator) --port=2768" > /dev/null && fail "a cluster server left running"

"$BIN/tessera-bench" --scenarios="$ROOT/benchmarks/scenarios/smoke.json" --out="$OUT" > "$OUT/log" \
  || { cat "$OUT/log"; fail "tessera-bench failed"; }
grep -q "smoke-smart: starting 2 shard(s) and a coordinator" "$OUT/log" || fail "no progress lines"
[ "$(wc -l < "$OUT/results.jsonl")" = 5 ] || fail "expected 5 JSON records"
grep -Eq '"scenario":"smoke-train-2-workers".*"workers":2,.*"allreduce_ms":[0-9.]*[1-9]' "$OUT/results.jsonl" \
  || fail "data-parallel training without its allreduce time"
grep -q "^| smoke-train-2-workers | cpu | 2 |" "$OUT/report.md" || fail "no training-steps row for 2 workers"
grep -Eq '"scenario":"smoke-train".*"dense_backend":"cpu","dense_samples_per_s":[0-9.]*[1-9]' "$OUT/results.jsonl" \
  || fail "training without its dense step's samples/s"
grep -Eq '"scenario":"smoke-train".*"grads_ms":[0-9.]*[1-9]' "$OUT/results.jsonl" \
  || fail "training without its embedding gradients' time"
grep -Eq '"scenario":"smoke-train".*"sparse_work_ms":[0-9.]*[1-9].*"train_step_ms":[0-9.]*[1-9]' \
  "$OUT/results.jsonl" || fail "training without its sparse work and step times"
grep -q '"scenario":"smoke-redis","mode":"redis"' "$OUT/results.jsonl" || fail "redis baseline missing"
# Any positive ratio: the ceiling is measured on shared cores, so a noisy run can pass 1.
grep -Eq '"scenario":"smoke-train".*"vs_gemm":(0\.[0-9]*[1-9]|[1-9])' "$OUT/results.jsonl" \
  || fail "train without a GEMM ratio"
grep -q '"scenario":"smoke-smart","mode":"smart","shards":2' "$OUT/results.jsonl" \
  || fail "smart record missing"
grep -q '"usd_per_million_samples":0\.0' "$OUT/results.jsonl" || fail "no cost figure"
grep -q "^| smoke-inproc | inproc | 2 | lookup_update | 512 |" "$OUT/report.md" \
  || fail "markdown row missing"
grep -q "^# tessera-bench: .*smoke.json" "$OUT/report.md" || fail "report without a title"
grep -q "^- machine: .*CPUs" "$OUT/report.md" || fail "report without the machine"
grep -q "EXAMPLE figures, not quotes" "$OUT/report.md" || fail "example prices not called so"
grep -q "Redis version\|Server initialized\|oO0OoO0OoO0Oo" "$OUT/log" && fail "redis-server's banner in the output"
if command -v gnuplot > /dev/null; then
  for p in throughput_vs_shards latency_percentiles cost_per_million_samples; do
    [ -s "$OUT/$p.png" ] || fail "plot $p.png missing"
  done
fi
# A bad scenario is refused with the field named, before anything runs.
echo '{"scenarios":[{"name":"bad","mode":"cloud"}]}' > "$OUT/bad.json"
if "$BIN/tessera-bench" --scenarios="$OUT/bad.json" --out="$OUT/bad" > "$OUT/bad.log" 2>&1; then
  fail "bad scenario accepted"
fi
grep -q "mode must be inproc, coordinator, smart, redis or cuda" "$OUT/bad.log" || fail "bad mode not named"
# No shard process may be left behind.
sleep 0.5
if pgrep -f "tessera-shard --port=0 --shard_index=0 --num_shards=2 --max_batch_ids" > /dev/null; then
  fail "shard processes left running"
fi
# The sparse-step benchmark, tiny: both lines and their ratios must come out.
"$BIN/tessera-sparse-step-benchmark" --tables=3 --rows=2000 --batch=64 --steps=5 --threads=1,2 \
  > "$OUT/sparse.log" 2>&1 || { cat "$OUT/sparse.log"; fail "sparse-step benchmark failed"; }
grep -Eq "^tables' own, 1 thread: +gather +[0-9.]+ ns/id" "$OUT/sparse.log" \
  || fail "sparse-step benchmark without the tables' own figures"
grep -Eq "^path,  2 thread\(s\):.*vs_tables [0-9.]+  vs_one_thread [0-9.]+" "$OUT/sparse.log" \
  || fail "sparse-step benchmark without its ratios"
echo "bench smoke: ok"
