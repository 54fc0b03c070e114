#!/usr/bin/env bash
# Several models under the same budget on a real corpus: train, translate, score, one table.
#   examples/compare.sh CORPUS_DIR OUT_DIR MAX_UPDATE NAME="TRAIN_SCRIPT SIZE [flags]" ...
# Binarizes CORPUS_DIR (binarize.sh, SentencePiece, VOCAB entries) into OUT_DIR/data once, then for each
# NAME trains `TRAIN_SCRIPT SIZE OUT_DIR/data/bin OUT_DIR/NAME --max-update MAX_UPDATE [flags]` (the
# same batches: --max-tokens 4096, seed 1), averages its last 5 epoch checkpoints when there are 5,
# translates the test set (beam 5, evaluate.sh, on the test split of OUT_DIR/data/bin), and prints one
# table (parameters, final valid perplexity, BLEU, chrF, decoding speed) into OUT_DIR/results.md. A model
# already scored (its OUT_DIR/NAME-eval/score.json exists) is not trained again: rerun to add models to the table.
# Environment: VOCAB (SentencePiece size, default 8000), EVAL_FLAGS (extra fairseq-generate flags),
# TITLE (table title).
set -euo pipefail
corpus=$1; out=$2; max_update=$3; shift 3
ex=$(cd "$(dirname "$0")" && pwd)
"$ex/data/binarize.sh" "$corpus" "$out/data" --vocab "${VOCAB:-8000}"
entries=()
for spec in "$@"; do
  name=${spec%%=*}; cmd=${spec#*=}
  [ "$name" != "$spec" ] || { echo "expected NAME=\"TRAIN_SCRIPT SIZE [flags]\", got '$spec'" >&2; exit 2; }
  read -r -a train <<< "$cmd"
  save="$out/$name"
  if [ ! -f "$out/$name-eval/score.json" ]; then
    "${train[0]}" "${train[1]}" "$out/data/bin" "$save" --max-update "$max_update" "${train[@]:2}" \
      > "$out/$name.train.log" 2>&1 || { tail -30 "$out/$name.train.log"; exit 1; }
    ckpt="$save/checkpoint_last.pt"
    if [ "$(ls "$save"/checkpoint[0-9]*.pt 2>/dev/null | wc -l)" -ge 5 ]; then
      python -m fairseq_ext.tools.average_checkpoints --inputs "$save" --num-epoch-checkpoints 5 \
        --output "$save/averaged.pt" >/dev/null 2>&1
      ckpt="$save/averaged.pt"
    fi
    cp "$out/data/spm.model" "$out/data/bin/dict.${SRC:-en}.txt" "$out/data/bin/dict.${TGT:-de}.txt" "$save/"
    # shellcheck disable=SC2086
    CKPT="$ckpt" TRAIN_LOG="$out/$name.train.log" TEST_BIN="$out/data/bin" \
      "$ex/evaluate.sh" "$save" "$corpus" "$out/$name-eval" ${EVAL_FLAGS:-} > "$out/$name.score.txt"
  fi
  entries+=("$name=$out/$name-eval/score.json")
done
python -m fairseq_ext.tools.results_table "${entries[@]}" --copy-baseline \
  --title "${TITLE:-EN-DE, $max_update updates each, beam 5}" 2>/dev/null | tee "$out/results.md"
