#!/usr/bin/env bash
# The code language-modelling set of the Simplified-blocks recipes, binarized for fairseq.
#   examples/sas/prepare-code.sh OUT_DIR [CORPUS.txt.gz] [--vocab N] [--max-files N]
# CORPUS defaults to the repository's data/code/python_stdlib.txt.gz; when that file is absent it is rebuilt
# from this machine's standard library (examples/data/extract_stdlib.py: the same bytes for CPython 3.11.7).
# Splits by file, SentencePiece (8k, whitespace kept), fairseq-preprocess --only-source -> OUT_DIR/bin.
set -euo pipefail
out=$1; shift
ex=$(cd "$(dirname "$0")/.." && pwd)
corpus=""
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then corpus=$1; shift; fi
if [ -z "$corpus" ]; then
  corpus="$ex/../data/code/python_stdlib.txt.gz"
  if [ ! -f "$corpus" ]; then
    mkdir -p "$out"; corpus="$out/python_stdlib.txt.gz"
    python "$ex/data/extract_stdlib.py" "$corpus"
  fi
fi
mkdir -p "$out"
python "$ex/data/prepare_code_lm.py" "$corpus" "$out" "$@"
rm -rf "$out/bin"
fairseq-preprocess --only-source --trainpref "$out/tok/train" --validpref "$out/tok/valid" \
  --testpref "$out/tok/test" --destdir "$out/bin" --workers "$(nproc)" > "$out/preprocess.log" 2>&1 \
  || { tail -20 "$out/preprocess.log"; exit 1; }
echo "binarized: $out/bin ($(grep -c '' "$out/bin/dict.txt") dictionary entries)"
