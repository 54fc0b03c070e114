#!/usr/bin/env bash
# Dense vs sparse FFN vs sparse FFN+QKV (and the N = 64 vs 128 ablation) under the same budget on a real
# corpus (examples/compare.sh): parameters, valid perplexity, BLEU, chrF, decoding speed in one table.
#   examples/scaling_sparse/compare.sh CORPUS_DIR OUT_DIR MAX_UPDATE [tiny]
# Models (small dims of examples/baseline/train.sh; see examples/scaling_sparse/train.sh):
#   dense  baseline small | sparse_ff  N=64 | sparse_ff_n128  N=128 | sparse_ff_qkv  N=64 + S=4, d_ff 1,344
# `tiny` trains baseline tiny vs scaling_sparse_tiny instead (a smoke run). Environment: VOCAB,
# EVAL_FLAGS (see examples/compare.sh). Harness decode speed (greedy batch 1 / beam 5):
# `benchmarks/run_presets.py --only decode_scaling_sparse_small decode_scaling_sparse_small_beam5`
# (the same models, random weights, 8k vocabulary, each also on the fast path).
set -euo pipefail
corpus=$1; out=$2; max_update=$3; size=${4:-small}
here=$(cd "$(dirname "$0")" && pwd)
ex=$(cd "$here/.." && pwd)
if [ "$size" = tiny ]; then
  models=("dense=$ex/baseline/train.sh tiny" "sparse_ff_qkv=$here/train.sh tiny")
else
  models=("dense=$ex/baseline/train.sh small" "sparse_ff=$here/train.sh small_ff"
          "sparse_ff_qkv=$here/train.sh small_ff_qkv" "sparse_ff_n128=$here/train.sh small_ff128")
fi
TITLE="EN-DE, $max_update updates each ($size sizes), beam 5" exec "$ex/compare.sh" "$corpus" "$out" "$max_update" "${models[@]}"
