#!/usr/bin/env bash
# Simplified blocks vs the Pre-LN baseline for translation, same budget (examples/compare.sh).
#   examples/sas/compare.sh CORPUS_DIR OUT_DIR MAX_UPDATE [tiny]
# Models: dense = examples/baseline/train.sh small (pre-norm Transformer 4+2, d=256), sas_block =
# examples/sas/train.sh small (same dims). `tiny` trains the tiny sizes (a smoke run). Environment:
# VOCAB, EVAL_FLAGS (see examples/compare.sh).
set -euo pipefail
corpus=$1; out=$2; max_update=$3; size=${4:-small}
here=$(cd "$(dirname "$0")" && pwd)
ex=$(cd "$here/.." && pwd)
models=("dense=$ex/baseline/train.sh $size" "sas_block=$here/train.sh $size")
TITLE="EN-DE, $max_update updates each ($size sizes), beam 5" exec "$ex/compare.sh" "$corpus" "$out" "$max_update" "${models[@]}"
