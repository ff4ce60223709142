#!/usr/bin/env bash
# examples/python/embedding_client.py against a local cluster, with Debian's python3-grpcio.
set -euo pipefail
source "$(dirname "$0")/local_cluster_kit.sh" "$1" "$2" 3
"$CLUSTER" start 2
# Debian's interpreter, where python3-grpcio is installed.
PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/examples/python/embedding_client.py" "127.0.0.1:$base"
# The tessera package: every feature against the cluster, then the example training loop
# in both modes, which must learn and agree exactly.
PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/python/tests/cluster_check.py" "127.0.0.1:$base"
for mode in smart coordinator; do
  PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/examples/python/train_two_tower.py" \
    "127.0.0.1:$base" --mode="$mode" --prefix="tt_$mode" > "$TESSERA_CLUSTER_DIR/$mode.log" \
    || { cat "$TESSERA_CLUSTER_DIR/$mode.log"; echo "FAIL: two-tower ($mode) did not learn"; exit 1; }
done
cat "$TESSERA_CLUSTER_DIR/smart.log"
diff <(grep held-out "$TESSERA_CLUSTER_DIR/smart.log") \
     <(grep held-out "$TESSERA_CLUSTER_DIR/coordinator.log") \
  || { echo "FAIL: smart and coordinator modes trained differently"; exit 1; }
# A second run on the tables the first trained: refused unless asked for, then said.
if out="$(PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/examples/python/train_two_tower.py" \
    "127.0.0.1:$base" --prefix=tt_smart --steps=50 2>&1)"; then
  echo "FAIL: two-tower trained silently on a previous run's tables"; exit 1
fi
echo "$out" | grep -q "hold a previous run's training; pass --continue_tables" \
  || { echo "$out"; echo "FAIL: two-tower refusal does not say why"; exit 1; }
out="$(PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/examples/python/train_two_tower.py" \
  "127.0.0.1:$base" --prefix=tt_smart --steps=50 --continue_tables)"
echo "$out" | grep -q "continuing on a previous run's tables" \
  || { echo "$out"; echo "FAIL: two-tower --continue_tables"; exit 1; }
# tessera.torch: the module's gradients and 200 training steps against EmbeddingBag
# tables and the same row-wise optimizers in torch (Debian's python3-torch).
PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/python/tests/torch_check.py" "127.0.0.1:$base"
# ... and under DistributedDataParallel: 2 processes on the gloo backend, one dense model.
PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/python/tests/torch_ddp_check.py" "127.0.0.1:$base"
# examples/python/torch_dlrm.py on a small generated Criteo-format TSV: DLRM in PyTorch
# with its tables on Tessera (the cluster, and tessera.local in the process), and the same
# model on torch.nn.EmbeddingBag tables; all
# must learn (the AUC comparison on a larger file is in BENCHMARKS.md).
PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/examples/python/torch_dlrm.py" \
  --make_data=20000 --data="$TESSERA_CLUSTER_DIR/clicks.tsv" > /dev/null
for tables in tessera torch local; do
  PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/examples/python/torch_dlrm.py" \
    --coordinator="127.0.0.1:$base" --data="$TESSERA_CLUSTER_DIR/clicks.tsv" --tables="$tables" \
    --model="dlrm_$tables" > "$TESSERA_CLUSTER_DIR/dlrm-$tables.log" 2>&1 \
    || { cat "$TESSERA_CLUSTER_DIR/dlrm-$tables.log"; echo "FAIL: torch_dlrm.py ($tables)"; exit 1; }
  grep held-out "$TESSERA_CLUSTER_DIR/dlrm-$tables.log"
  grep -Eq "held-out: 2000 samples  logloss [0-9.]+  auc 0\.(6[5-9]|[7-9])" \
    "$TESSERA_CLUSTER_DIR/dlrm-$tables.log" \
    || { cat "$TESSERA_CLUSTER_DIR/dlrm-$tables.log"; echo "FAIL: torch_dlrm.py ($tables) did not learn"; exit 1; }
done
if out="$(PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/examples/python/torch_dlrm.py" \
    --coordinator="127.0.0.1:$base" --data="$TESSERA_CLUSTER_DIR/clicks.tsv" \
    --model=dlrm_tessera 2>&1)"; then
  echo "FAIL: torch_dlrm.py trained silently on a previous run's tables"; exit 1
fi
echo "$out" | grep -q "hold a previous run's training" \
  || { echo "$out"; echo "FAIL: torch_dlrm.py refusal does not say why"; exit 1; }
# Exactly-once across a shard restart (kill -9, push, restart while the client retries).
PYTHONPATH="$BIN/python" /usr/bin/python3 "$ROOT/python/tests/restart_check.py" \
  "127.0.0.1:$base" "$TESSERA_CLUSTER_DIR" "$BIN"
echo "python package: ok"
