#!/usr/bin/env bash
# Terraformer §4.3 / Table 4: copy a decimal number, or long addition; train on inputs of at most 128
# digits (addition: both operands together, every number least significant digit first), test on inputs of
# 256-300 digits (out of distribution), greedy decoding, exact-sequence and per-token accuracy
# (fairseq_ext/tools/synthetic.py).
#   examples/terraformer/synthetic.sh TASK MODEL DATA_DIR SAVE_DIR [extra fairseq-train flags...]
# TASK: copy | addition. DATA_DIR is made once per task (train/valid/test + binarized bin/) and shared.
# MODEL, both at the same dims (2+2 layers, d=256, 4 heads, FFN 1,024, pre-norm, sinusoidal positions; the
# flags: python -m fairseq_ext.tools.synthetic flags MODEL):
#   terraformer  terraformer_base's parts: sparse FFN N = 64, sparse QKV S = 8, SRU width 32, reversible,
#                concatenated decoder with two attention layers per block
#   transformer  fairseq's pre-norm Transformer (the paper's baseline)
# Env: TRAIN (examples, default 50000), VALID (1000), TEST (500), MAX_UPDATE (2000).
# The reproduction study (examples/study/run.sh) trains both models on both tasks until in-distribution
# accuracy stops improving.
set -euo pipefail
task=$1; model=$2; data=$3; save=$4; shift 4
here=$(cd "$(dirname "$0")" && pwd)
model_flags=$(python -m fairseq_ext.tools.synthetic flags "$model") || exit 2
mapfile -t model_flags <<< "$model_flags"
# the examples' version (synthetic.py DATA_FORMAT): data made by another version is made again
format=$(python -c 'import sys; from fairseq_ext.tools.synthetic import DATA_FORMAT; print(DATA_FORMAT[sys.argv[1]])' \
  "$task" 2>/dev/null) || { echo "synthetic.sh: TASK $task: choose copy or addition" >&2; exit 2; }
if [ ! -f "$data/bin/dict.src.txt" ] || [ "$(cat "$data/bin/format" 2>/dev/null)" != "$format" ]; then
  rm -rf "$data/raw" "$data/bin"
  python -m fairseq_ext.tools.synthetic make --task "$task" --out "$data/raw" \
    --train "${TRAIN:-50000}" --valid "${VALID:-1000}" --test "${TEST:-500}"
  fairseq-preprocess --source-lang src --target-lang tgt --trainpref "$data/raw/train" \
    --validpref "$data/raw/valid" --testpref "$data/raw/test" --joined-dictionary \
    --destdir "$data/bin" --workers 2
  echo "$format" > "$data/bin/format"
fi
"$here/../train.sh" "$data/bin" "$save" "${model_flags[@]}" --source-lang src --target-lang tgt \
  --label-smoothing 0 --max-update "${MAX_UPDATE:-2000}" --no-epoch-checkpoints "$@"
source "$here/../device.sh"
# the answer is at most one digit longer than the longest operand: max length = source length + 2
for split in valid test; do
  fairseq-generate "$data/bin" --user-dir "$here/../../fairseq_ext" "${decode_device[@]}" --source-lang src \
    --target-lang tgt --gen-subset "$split" --path "$save/checkpoint_last.pt" --beam 1 \
    --max-len-a 1 --max-len-b 2 --batch-size 50 > "$save/generate-$split.txt"
  python -m fairseq_ext.tools.synthetic score "$save/generate-$split.txt" --json "$save/score-$split.json"
done
