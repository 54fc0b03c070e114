#!/usr/bin/env bash
# Translate a corpus' test set with a checkpoint and score it (sacrebleu BLEU + chrF, speed).
#   examples/evaluate.sh MODEL_DIR CORPUS_DIR OUT_DIR [extra fairseq-generate flags...]
# MODEL_DIR holds checkpoint.pt (or pass CKPT=path), spm.model, dict.en.txt, dict.de.txt, and
# SHA256SUMS if it is a shipped model (verified first). TRAIN_LOG=path adds that fairseq-train log's
# last validation (loss, perplexity) to score.json. GENERATE=fairseq-ext-generate decodes with the fast
# path (add --int8 to the flags for its int8 decoder). The test set is tokenized with the model's own
# SentencePiece model and binarized with its dictionary. Beam 5 by default.
set -euo pipefail
model=$1; corpus=$2; out=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
ckpt=${CKPT:-$model/checkpoint.pt}
mkdir -p "$out"
if [ -f "$model/SHA256SUMS" ]; then (cd "$model" && sha256sum --quiet -c SHA256SUMS) || {
  echo "checksum mismatch in $model (see SHA256SUMS)" >&2; exit 1; }; fi
if [ ! -f "$out/bin/.done" ]; then
  python "$here/data/tokenize_corpus.py" --corpus "$corpus" --out "$out" --apply "$model/spm.model" --splits test >/dev/null
  rm -rf "$out/bin"
  fairseq-preprocess --source-lang en --target-lang de --testpref "$out/tok/test" --destdir "$out/bin" \
    --srcdict "$model/dict.en.txt" --tgtdict "$model/dict.de.txt" --workers "$(nproc)" > "$out/preprocess.log" 2>&1 \
    || { cat "$out/preprocess.log"; exit 1; }
  touch "$out/bin/.done"
fi
"${GENERATE:-fairseq-generate}" "$out/bin" --user-dir "$here/../fairseq_ext" --cpu --path "$ckpt" --gen-subset test \
  --source-lang en --target-lang de --beam 5 --max-tokens 6000 --scoring sacrebleu \
  --post-process sentencepiece "$@" > "$out/generate.out" 2>&1 \
  || { tail -30 "$out/generate.out"; exit 1; }
python -m fairseq_ext.tools.score "$out/generate.out" --copy-baseline --checkpoint "$ckpt" --json "$out/score.json" \
  ${TRAIN_LOG:+--train-log "$TRAIN_LOG"} 2>/dev/null
