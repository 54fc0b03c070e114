#!/usr/bin/env bash
# Train a code language model with Pre-LN or simplified blocks (the Simplified-blocks paper's setting).
#   examples/sas/train_lm.sh SIZE BLOCK DATA_BIN SAVE_DIR [extra fairseq-train flags...]
# BLOCK: preln | sas | sas_p | sas_p_nonorm   (archs preln_lm, sas_lm, sas_p_lm, sas_p_nonorm_lm)
# SIZE:  paper  18 layers, width 768, MLP 3072, 12 heads (the archs' defaults)
#        small  6 layers, width 256, MLP 1024, 4 heads (what 2 CPU cores can train)
#        tiny   2 layers, width 64, MLP 256 (smoke runs)
# Training as the paper: context 128 (--tokens-per-sample), AdamW lr 1e-3 (weight decay 0.1, none on
# gains, norms and biases: --optimizer adam_no_decay_gains), no dropout; 4,096 tokens (32 sequences)
# per batch; validation every VALID_EVERY updates (env, default 100) so that
# examples/sas/compare_lm.sh can draw loss-per-step and loss-per-second curves. Device and precision as
# examples/train.sh (examples/device.sh; PRECISION=fp32|bf16|fp16 overrides).
set -euo pipefail
size=$1; block=$2; data=$3; save=$4; shift 4
repo=$(cd "$(dirname "$0")/../.." && pwd)
case "$block" in
  preln|sas|sas_p|sas_p_nonorm) arch=${block}_lm ;;
  *) echo "unknown BLOCK '$block' (preln|sas|sas_p|sas_p_nonorm)" >&2; exit 2 ;;
esac
case "$size" in
  paper) dims=() ;;
  small) dims=(--decoder-layers 6 --decoder-embed-dim 256 --decoder-ffn-embed-dim 1024 --decoder-attention-heads 4) ;;
  tiny)  dims=(--decoder-layers 2 --decoder-embed-dim 64 --decoder-ffn-embed-dim 256 --decoder-attention-heads 4) ;;
  *) echo "unknown SIZE '$size' (paper|small|tiny)" >&2; exit 2 ;;
esac
source "$repo/examples/device.sh"  # train_device, precision (as examples/train.sh)
training_precision
mkdir -p "$save"
set -x
fairseq-train "$data" --user-dir "$repo/fairseq_ext" "${train_device[@]}" "${precision[@]}" --task language_modeling \
  --arch "$arch" "${dims[@]}" --tokens-per-sample 128 --sample-break-mode none \
  --optimizer adam_no_decay_gains --adam-betas '(0.9, 0.95)' --weight-decay 0.1 --clip-norm 1.0 \
  --lr 1e-3 --lr-scheduler inverse_sqrt --warmup-updates 200 --warmup-init-lr 1e-07 \
  --criterion cross_entropy --max-tokens 4096 --dropout 0.0 \
  --validate-interval-updates "${VALID_EVERY:-100}" --save-interval-updates "${VALID_EVERY:-100}" \
  --keep-interval-updates 1 --no-epoch-checkpoints --save-dir "$save" \
  --log-format simple --log-interval "${LOG_INTERVAL:-50}" --seed 1 "$@"
