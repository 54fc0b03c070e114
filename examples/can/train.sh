#!/usr/bin/env bash
# Train a Compressed Attention Network (or its balanced baseline) EN->DE with the paper's optimizer
# settings (Adam 0.9/0.997, lr 1e-3, inverse_sqrt, 8,000 warm-up updates, label smoothing 0.1).
#   examples/can/train.sh SIZE DATA_BIN SAVE_DIR [extra fairseq-train flags...]
# SIZE: can (can_decoder: 12/2, base dims, d_v 2,048) | can_big | can_tiny | balanced (transformer_balanced,
#       the paper's baseline) | balanced_big | balanced_tiny. Ablations: add --can-compress attention|ffn.
#       small: a CAN decoder at the small dims of examples/baseline/train.sh (4 encoder + 2 CAN decoder
#       layers, d=256, d_v = 1,024 = the baseline's FFN width, pre-norm) with the baseline's optimizer
#       settings, so it compares with `baseline/train.sh small` (a balanced 4/2 pre-norm model) at equal budget.
# On few CPU updates use a shorter warm-up (e.g. --warmup-updates 500) among the extra flags.
set -euo pipefail
size=$1; data=$2; save=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../small_dims.sh
source "$here/../small_dims.sh"
betas=(--adam-betas '(0.9, 0.997)' --warmup-updates 8000)
case "$size" in
  can)           arch=(--arch can_decoder) ;;
  can_big)       arch=(--arch can_decoder_big --lr 5e-4) ;;
  can_tiny)      arch=(--arch can_decoder_tiny --warmup-updates 200 --lr 2e-3) ;;
  small)         arch=(--arch can_decoder "${SMALL_DIMS[@]}" "${SMALL_FFN[@]}" --can-value-dim 1024)
                 betas=(--adam-betas '(0.9, 0.98)' --warmup-updates 500) ;;
  balanced)      arch=(--arch transformer_balanced) ;;
  balanced_big)  arch=(--arch transformer_balanced_big --lr 5e-4) ;;
  balanced_tiny) arch=(--arch transformer_balanced_tiny --warmup-updates 200 --lr 2e-3) ;;
  *) echo "unknown SIZE '$size' (can|can_big|can_tiny|small|balanced|balanced_big|balanced_tiny)" >&2; exit 2 ;;
esac
exec "$here/../train.sh" "$data" "$save" "${betas[@]}" "${arch[@]}" "$@"
