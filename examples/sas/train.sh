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
# shellcheck source=../small_dims.sh
source "$here/../small_dims.sh"
SAS=(--arch sas_block "${SMALL_DIMS[@]}" "${SMALL_FFN[@]}")
OPT=(--optimizer adam_no_decay_gains --weight-decay 0.01)
case "$size" in
  small)        arch=("${SAS[@]}") ;;
  small_nonorm) arch=("${SAS[@]}" --sas-no-norm) ;;
  tiny)         arch=(--arch sas_block_tiny --lr 2e-3 --warmup-updates 200) ;;
  base)         arch=(--arch sas_block --lr 7e-4 --warmup-updates 4000) ;;
  *) echo "unknown SIZE '$size' (small|small_nonorm|tiny|base)" >&2; exit 2 ;;
esac
exec "$here/../train.sh" "$data" "$save" "${arch[@]}" "${OPT[@]}" "$@"
