#!/usr/bin/env bash
# One Wide FFN vs the baseline under the same budget, on a real corpus: train, translate, score, table.
#   examples/one_wide_ffn/compare.sh CORPUS_DIR OUT_DIR MAX_UPDATE [SIZE_PREFIX]
# Binarizes CORPUS_DIR (binarize.sh, SentencePiece 8k) into OUT_DIR/data, trains three models for
# MAX_UPDATE updates each (the same batches: --max-tokens 4096, seed 1):
#   baseline      examples/baseline/train.sh small        (Transformer 4+2, d=256, d_ff=1024)
#   one_wide_ffn  examples/one_wide_ffn/train.sh small    (SharedEncNoDec, d_ff'=6,144: same size)
#   shared_enc_no_dec  ... small_shared                   (SharedEncNoDec, d_ff'=1,024)
# averages each one's last 5 epoch checkpoints when there are 5, translates the test set (beam 5),
# and prints one table (BLEU, chrF, parameters, decoding speed) into OUT_DIR/results.md.
# SIZE_PREFIX=tiny trains the tiny sizes instead (a smoke run of the recipe). Environment: VOCAB
# (SentencePiece size, default 8000), EVAL_FLAGS (extra fairseq-generate flags, e.g. "--max-len-b 10").
set -euo pipefail
corpus=$1; out=$2; max_update=$3; size=${4:-small}
here=$(cd "$(dirname "$0")" && pwd)
ex=$(cd "$here/.." && pwd)
"$ex/data/binarize.sh" "$corpus" "$out/data" --vocab "${VOCAB:-8000}"
declare -A recipe=([baseline]="$ex/baseline/train.sh $size" [one_wide_ffn]="$here/train.sh $size")
[ "$size" = small ] && recipe[shared_enc_no_dec]="$here/train.sh small_shared"
entries=()
for name in baseline one_wide_ffn shared_enc_no_dec; do
  [ -n "${recipe[$name]:-}" ] || continue
  save="$out/$name"
  ${recipe[$name]} "$out/data/bin" "$save" --max-update "$max_update" > "$out/$name.train.log" 2>&1 \
    || { tail -30 "$out/$name.train.log"; exit 1; }
  ckpt="$save/checkpoint_last.pt"
  if [ "$(ls "$save"/checkpoint[0-9]*.pt 2>/dev/null | wc -l)" -ge 5 ]; then
    python -m fairseq_ext.tools.average_checkpoints --inputs "$save" --num-epoch-checkpoints 5 \
      --output "$save/averaged.pt" >/dev/null 2>&1
    ckpt="$save/averaged.pt"
  fi
  cp "$out/data/spm.model" "$out/data/bin/dict.en.txt" "$out/data/bin/dict.de.txt" "$save/"
  # shellcheck disable=SC2086
  CKPT="$ckpt" "$ex/evaluate.sh" "$save" "$corpus" "$out/$name-eval" ${EVAL_FLAGS:-} > "$out/$name.score.txt"
  entries+=("$name=$out/$name-eval/score.json")
done
python -m fairseq_ext.tools.results_table "${entries[@]}" --copy-baseline \
  --title "EN-DE, $max_update updates each ($size sizes), beam 5" 2>/dev/null | tee "$out/results.md"
