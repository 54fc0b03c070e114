#!/usr/bin/env bash
# Train a baseline Transformer EN->DE (examples/train.sh with the size's model flags).
#   examples/baseline/train.sh SIZE DATA_BIN SAVE_DIR [extra fairseq-train flags...]
# SIZE:
#   tiny      stock transformer_tiny (d=64, 2+2): smoke runs
#   small     stock transformer, d=256 / FFN 1024 / 4 heads, 4 encoder + 2 decoder, pre-norm
#             (the size of the shipped CPU checkpoint; ~7.3M parameters with an 8k vocabulary)
#   base      stock transformer (Vaswani base, 6+6, post-norm)
#   balanced  transformer_balanced (pre-norm, base dims, 12 encoder + 2 decoder)
#   balanced_tiny / balanced_big: the other sizes of transformer_balanced
# Stop it with --max-update N, --max-epoch N or --stop-time-hours H among the extra flags.
set -euo pipefail
size=$1; data=$2; save=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../small_dims.sh
source "$here/../small_dims.sh"
case "$size" in
  tiny)          arch=(--arch transformer_tiny --share-all-embeddings --lr 2e-3 --warmup-updates 200) ;;
  small)         arch=(--arch transformer "${SMALL_DIMS[@]}" "${SMALL_FFN[@]}") ;;
  base)          arch=(--arch transformer --share-all-embeddings --lr 7e-4 --warmup-updates 4000) ;;
  balanced)      arch=(--arch transformer_balanced --warmup-updates 4000) ;;
  balanced_tiny) arch=(--arch transformer_balanced_tiny --lr 2e-3 --warmup-updates 200) ;;
  balanced_big)  arch=(--arch transformer_balanced_big --lr 5e-4 --warmup-updates 4000) ;;
  *) echo "unknown SIZE '$size' (tiny|small|base|balanced|balanced_tiny|balanced_big)" >&2; exit 2 ;;
esac
exec "$here/../train.sh" "$data" "$save" "${arch[@]}" "$@"
