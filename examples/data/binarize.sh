#!/usr/bin/env bash
# Tokenize a parallel corpus folder and binarize it for fairseq.
#   examples/data/binarize.sh CORPUS_DIR OUT_DIR [--src XX --tgt YY] [--tokenizer spm|bpe] [--vocab N]
# CORPUS_DIR holds {train,valid,test}.{XX,YY}.gz, the language pair given by --src/--tgt (default en de:
# data/en-de-sample, or the full corpus that prepare-en-de.sh rebuilds). OUT_DIR gets tok/, spm.model or
# bpe.codes, and bin/ (joined dictionary: dict.XX.txt = dict.YY.txt, {split}.XX-YY.{XX,YY}.{bin,idx}).
# Other flags go to tokenize_corpus.py. Skips the work when OUT_DIR/bin is already complete.
set -euo pipefail
corpus=$1; out=$2; shift 2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../lang_pair.sh"
src=en; tgt=de
take_lang_pair binarize.sh "$@"
if [ "$src" = "$tgt" ]; then echo "binarize.sh: --src and --tgt are both '$src'" >&2; exit 2; fi
if [ -f "$out/bin/.done" ]; then echo "$out/bin is ready"; exit 0; fi
python "$here/tokenize_corpus.py" --corpus "$corpus" --out "$out" --src "$src" --tgt "$tgt" ${rest[@]+"${rest[@]}"}
rm -rf "$out/bin"
fairseq-preprocess --source-lang "$src" --target-lang "$tgt" \
  --trainpref "$out/tok/train" --validpref "$out/tok/valid" --testpref "$out/tok/test" \
  --destdir "$out/bin" --joined-dictionary --workers "$(nproc)" > "$out/preprocess.log" 2>&1 \
  || { cat "$out/preprocess.log"; exit 1; }
cp "$out"/spm.model "$out"/bpe.codes "$out/bin/" 2>/dev/null || true
touch "$out/bin/.done"
echo "binarized $src-$tgt into $out/bin ($(wc -l < "$out/bin/dict.$src.txt") dictionary entries)"
