#!/usr/bin/env bash
# Train a simplified-block translation model EN->DE (examples/train.sh with the size's model flags).
#   examples/sas/train.sh SIZE DATA_BIN SAVE_DIR [extra fairseq-train flags...]
# SIZE:
#   small         sas_block at the dims of examples/baseline/train.sh small (4+2 layers, d=256, MLP 1024,
#                 4 heads): SAS-P encoder, SAS decoder with pre-norm cross-attention
#   small_nonorm  the same without normalisation (norm in the first layer and the final norm only)
#   tiny          sas_block_tiny (smoke runs)
#   base          sas_block (Transformer Base dims)
# Optimiser: AdamW with weight decay 0.01 on weight matrices only (--optimizer adam_no_decay_gains).
set -euo pipefail
size=$1; data=$2; save=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
SMALL_DIMS=(--arch sas_block --encoder-layers 4 --decoder-layers 2 --encoder-embed-dim 256 --decoder-embed-dim 256
            --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024
            --encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings)
OPT=(--optimizer adam_no_decay_gains --weight-decay 0.01)
case "$size" in
  small)        arch=("${SMALL_DIMS[@]}") ;;
  small_nonorm) arch=("${SMALL_DIMS[@]}" --sas-no-norm) ;;
  tiny)         arch=(--arch sas_block_tiny --lr 2e-3 --warmup-updates 200) ;;
  base)         arch=(--arch sas_block --lr 7e-4 --warmup-updates 4000) ;;
  *) echo "unknown SIZE '$size' (small|small_nonorm|tiny|base)" >&2; exit 2 ;;
esac
exec "$here/../train.sh" "$data" "$save" "${arch[@]}" "${OPT[@]}" "$@"
