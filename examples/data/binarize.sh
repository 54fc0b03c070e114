#!/usr/bin/env bash
# Tokenize a parallel corpus folder and binarize it for fairseq.
#   examples/data/binarize.sh CORPUS_DIR OUT_DIR [--tokenizer spm|bpe] [--vocab N]
# CORPUS_DIR holds {train,valid,test}.{en,de}.gz (data/en-de-sample, or the full corpus that
# prepare-en-de.sh rebuilds). OUT_DIR gets tok/, spm.model or bpe.codes, and bin/ (joined dictionary).
# Skips the work when OUT_DIR/bin is already complete.
set -euo pipefail
corpus=$1; out=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
if [ -f "$out/bin/.done" ]; then echo "$out/bin is ready"; exit 0; fi
python "$here/tokenize_corpus.py" --corpus "$corpus" --out "$out" "$@"
rm -rf "$out/bin"
fairseq-preprocess --source-lang en --target-lang de \
  --trainpref "$out/tok/train" --validpref "$out/tok/valid" --testpref "$out/tok/test" \
  --destdir "$out/bin" --joined-dictionary --workers "$(nproc)" > "$out/preprocess.log" 2>&1 \
  || { cat "$out/preprocess.log"; exit 1; }
cp "$out"/spm.model "$out"/bpe.codes "$out/bin/" 2>/dev/null || true
touch "$out/bin/.done"
echo "binarized into $out/bin ($(wc -l < "$out/bin/dict.en.txt") dictionary entries)"
