#!/usr/bin/env bash
# One Wide FFN vs the baseline under the same budget, on a real corpus (examples/compare.sh).
#   examples/one_wide_ffn/compare.sh CORPUS_DIR OUT_DIR MAX_UPDATE [SIZE_PREFIX]
# Trains, for MAX_UPDATE updates each:
#   baseline           examples/baseline/train.sh small        (Transformer 4+2, d=256, d_ff=1024)
#   one_wide_ffn       examples/one_wide_ffn/train.sh small    (SharedEncNoDec, d_ff'=6,144: same size)
#   shared_enc_no_dec  ... small_shared                        (SharedEncNoDec, d_ff'=1,024)
# then translates (beam 5) and prints one table into OUT_DIR/results.md. SIZE_PREFIX=tiny trains the
# tiny sizes instead (a smoke run). Environment: VOCAB, EVAL_FLAGS (see examples/compare.sh).
set -euo pipefail
corpus=$1; out=$2; max_update=$3; size=${4:-small}
here=$(cd "$(dirname "$0")" && pwd)
ex=$(cd "$here/.." && pwd)
models=("baseline=$ex/baseline/train.sh $size" "one_wide_ffn=$here/train.sh $size")
[ "$size" = small ] && models+=("shared_enc_no_dec=$here/train.sh small_shared")
TITLE="EN-DE, $max_update updates each ($size sizes), beam 5" exec "$ex/compare.sh" "$corpus" "$out" "$max_update" "${models[@]}"
