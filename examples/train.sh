#!/usr/bin/env bash
# The training command every recipe shares: fairseq-train with --user-dir fairseq_ext.
#   examples/train.sh DATA_BIN SAVE_DIR [fairseq-train flags: --arch ... --max-update N ...]
# Defaults (CAN / One Wide FFN papers): Adam (0.9, 0.98), inverse_sqrt with --warmup-updates 500 and
# --lr 1e-3 (later flags win: pass your own), label smoothing 0.1, dropout 0.1, 4,096 tokens per batch,
# the last 5 epoch checkpoints kept, a log line every LOG_INTERVAL (env, default 50) updates.
# --cpu unless torch sees a GPU. Precision by measurement (python -m fairseq_ext.tools.precision): --fp16 on a
# GPU, --bf16 (autocast, fp32 weights) on a CPU with native bf16 that runs it faster, else fp32;
# PRECISION=fp32|bf16|fp16 (env) overrides the choice. On a CPU, tcmalloc when the machine has it (see
# examples/device.sh: same results, faster; ALLOCATOR=system keeps glibc's). The language pair: SRC/TGT (env, default en de; what
# examples/data/binarize.sh --src/--tgt binarized), or --source-lang/--target-lang in the flags (later flags win).
set -euo pipefail
data=$1; save=$2; shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$save"
source "$repo/examples/device.sh"
training_precision
cpu_allocator
set -x
fairseq-train "$data" --user-dir "$repo/fairseq_ext" "${train_device[@]}" "${precision[@]}" \
  --task translation --source-lang "${SRC:-en}" --target-lang "${TGT:-de}" --dropout 0.1 \
  --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 \
  --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 500 --warmup-init-lr 1e-07 \
  --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
  --max-tokens 4096 --save-dir "$save" --keep-last-epochs 5 \
  --log-format simple --log-interval "${LOG_INTERVAL:-50}" --seed 1 "$@"
