#!/usr/bin/env bash
# Train a One Wide FFN model EN->DE (examples/train.sh with the size's model flags).
#   examples/one_wide_ffn/train.sh SIZE DATA_BIN SAVE_DIR [extra fairseq-train flags...]
# SIZE (dims of examples/baseline/train.sh's sizes, so runs compare at equal budgets):
#   small         SharedEncNoDec, d_ff' = (4+2) x 1024 = 6,144: the One Wide FFN of the baseline "small"
#   small_shared  SharedEncNoDec at d_ff' = d_ff = 1,024 (the paper's vanilla SharedEncNoDec)
#   tiny          the One Wide FFN of transformer_tiny (d=64, 2 heads, 2+2 layers, d_ff' = 4 x 64 = 256:
#                 the same parameter count as baseline/train.sh tiny)
#   base / big / deep_shallow: one_wide_ffn_base / one_wide_ffn_big / one_wide_ffn_deep_shallow
# Any other FFN placement: SIZE=custom and the flags yourself (--arch one_wide_ffn --encoder-ffn-sharing ...).
set -euo pipefail
size=$1; data=$2; save=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../small_dims.sh
source "$here/../small_dims.sh"
OWF=(--arch one_wide_ffn "${SMALL_DIMS[@]}" "${SMALL_FFN[@]}" --encoder-ffn-sharing shared --decoder-ffn-sharing none)
case "$size" in
  small)         arch=("${OWF[@]}" --encoder-shared-ffn-dim 6144) ;;
  small_shared)  arch=("${OWF[@]}" --encoder-shared-ffn-dim 1024) ;;
  tiny)          arch=(--arch one_wide_ffn_tiny --encoder-shared-ffn-dim 256 --encoder-attention-heads 2
                       --decoder-attention-heads 2 --lr 2e-3 --warmup-updates 200) ;;
  base)          arch=(--arch one_wide_ffn_base --lr 7e-4 --warmup-updates 4000) ;;
  big)           arch=(--arch one_wide_ffn_big --lr 7e-4 --warmup-updates 4000) ;;
  deep_shallow)  arch=(--arch one_wide_ffn_deep_shallow --lr 7e-4 --warmup-updates 4000) ;;
  custom)        arch=() ;;
  *) echo "unknown SIZE '$size' (small|small_shared|tiny|base|big|deep_shallow|custom)" >&2; exit 2 ;;
esac
exec "$here/../train.sh" "$data" "$save" "${arch[@]}" "$@"
