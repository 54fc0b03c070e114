#!/usr/bin/env bash
# Translate a corpus' test set with a checkpoint and score it (sacrebleu BLEU + chrF, speed).
#   examples/evaluate.sh MODEL_DIR CORPUS_DIR OUT_DIR [--src XX --tgt YY] [extra fairseq-generate flags...]
# The language pair: --src/--tgt (taken out of the flags) or SRC/TGT (env), default en de; CORPUS_DIR holds
# test.XX.gz and test.YY.gz. MODEL_DIR holds checkpoint.pt (or pass CKPT=path), spm.model, dict.XX.txt,
# dict.YY.txt, and SHA256SUMS if it is a shipped model (verified first). TRAIN_LOG=path adds that
# fairseq-train log's last validation (loss, perplexity) to score.json. GENERATE=fairseq-ext-generate
# decodes with the fast path (add --bf16 or --int8 to the flags for bf16 weights or its int8 decoder). On a CUDA device it decodes in fp16
# (PRECISION=fp32 keeps fp32), elsewhere on the CPU. The test set is tokenized with
# the model's own SentencePiece model and binarized with its dictionary, or TEST_BIN=dir decodes a test set
# binarized already with them: binarize.sh's bin/ of the corpus the model was trained on (its spm.model and
# dictionaries must be the model's; checked). Beam 5 by default.
set -euo pipefail
model=$1; corpus=$2; out=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lang_pair.sh"
source "$here/device.sh"
src=${SRC:-en}; tgt=${TGT:-de}
take_lang_pair evaluate.sh "$@"
flags=(${rest[@]+"${rest[@]}"})
ckpt=${CKPT:-$model/checkpoint.pt}
mkdir -p "$out"
if [ -f "$model/SHA256SUMS" ]; then (cd "$model" && sha256sum --quiet -c SHA256SUMS) || {
  echo "checksum mismatch in $model (see SHA256SUMS)" >&2; exit 1; }; fi
bin=$out/bin
if [ -n "${TEST_BIN:-}" ]; then
  for f in spm.model "dict.$src.txt" "dict.$tgt.txt"; do
    cmp -s "$TEST_BIN/$f" "$model/$f" || { echo "evaluate.sh: TEST_BIN=$TEST_BIN: its $f is not $model/$f" \
      "(binarized for another model); unset TEST_BIN to binarize the test set with the model's own" >&2; exit 2; }
  done
  [ -f "$TEST_BIN/test.$src-$tgt.$src.idx" ] || { echo "evaluate.sh: TEST_BIN=$TEST_BIN has no test split" \
    "(test.$src-$tgt.$src.idx)" >&2; exit 2; }
  bin=$TEST_BIN
elif [ ! -f "$out/bin/.done" ]; then
  python "$here/data/tokenize_corpus.py" --corpus "$corpus" --out "$out" --src "$src" --tgt "$tgt" \
    --apply "$model/spm.model" --splits test >/dev/null
  rm -rf "$out/bin"
  fairseq-preprocess --source-lang "$src" --target-lang "$tgt" --testpref "$out/tok/test" --destdir "$out/bin" \
    --srcdict "$model/dict.$src.txt" --tgtdict "$model/dict.$tgt.txt" --workers "$(nproc)" > "$out/preprocess.log" 2>&1 \
    || { cat "$out/preprocess.log"; exit 1; }
  touch "$out/bin/.done"
fi
"${GENERATE:-fairseq-generate}" "$bin" --user-dir "$here/../fairseq_ext" "${decode_device[@]}" --path "$ckpt" --gen-subset test \
  --source-lang "$src" --target-lang "$tgt" --beam 5 --max-tokens 6000 --scoring sacrebleu \
  --post-process sentencepiece ${flags[@]+"${flags[@]}"} > "$out/generate.out" 2>&1 \
  || { tail -30 "$out/generate.out"; exit 1; }
python -m fairseq_ext.tools.score "$out/generate.out" --copy-baseline --checkpoint "$ckpt" --json "$out/score.json" \
  ${TRAIN_LOG:+--train-log "$TRAIN_LOG"} 2>/dev/null
