#!/usr/bin/env bash
# Train a Scaling Transformer EN->DE (examples/train.sh with the size's model flags).
#   examples/scaling_sparse/train.sh SIZE DATA_BIN SAVE_DIR [extra fairseq-train flags...]
# SIZE (the dims of examples/baseline/train.sh small: 4+2 layers, d=256, 4 heads, pre-norm, so runs
# compare with the dense baseline at equal budgets):
#   small_ff        sparse FFN, d_ff 1024, N = 64 (16 of 1,024 units active per token)
#   small_ff128     the same with N = 128 (the paper's sparsity ablation)
#   small_ff_qkv    sparse FFN (N = 64) + sparse QKV (S = 4 = heads, F = 3), d_ff raised to 1,344 to keep
#                   the dense model's parameter count (7.23M vs 7.32M with the 8k vocabulary)
#   small_ff_qkv_loss  small_ff_qkv + sparse loss layer (S = 8; vocabulary padded to a multiple of 8)
#   tiny            scaling_sparse_tiny (smoke runs)
#   big / big_ff / big_qkv / one_wide_big: scaling_sparse / _ff / _qkv / one_wide_sparse_ffn_big
# Any other combination: SIZE=custom and the flags yourself (--arch scaling_sparse --sparse-ffn-block-size ...).
set -euo pipefail
size=$1; data=$2; save=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../small_dims.sh
source "$here/../small_dims.sh"
QKV=(--sparse-qkv-modules 4 --encoder-ffn-embed-dim 1344 --decoder-ffn-embed-dim 1344)
case "$size" in
  small_ff)          arch=(--arch scaling_sparse_ff "${SMALL_DIMS[@]}" "${SMALL_FFN[@]}" --sparse-ffn-block-size 64) ;;
  small_ff128)       arch=(--arch scaling_sparse_ff "${SMALL_DIMS[@]}" "${SMALL_FFN[@]}" --sparse-ffn-block-size 128) ;;
  small_ff_qkv)      arch=(--arch scaling_sparse "${SMALL_DIMS[@]}" "${QKV[@]}") ;;
  small_ff_qkv_loss) arch=(--arch scaling_sparse "${SMALL_DIMS[@]}" "${QKV[@]}" --sparse-loss 8) ;;
  tiny)              arch=(--arch scaling_sparse_tiny --lr 2e-3 --warmup-updates 200) ;;
  big)               arch=(--arch scaling_sparse --lr 5e-4 --warmup-updates 4000) ;;
  big_ff)            arch=(--arch scaling_sparse_ff --lr 5e-4 --warmup-updates 4000) ;;
  big_qkv)           arch=(--arch scaling_sparse_qkv --lr 5e-4 --warmup-updates 4000) ;;
  one_wide_big)      arch=(--arch one_wide_sparse_ffn_big --lr 5e-4 --warmup-updates 4000) ;;
  custom)            arch=() ;;
  *) echo "unknown SIZE '$size' (small_ff|small_ff128|small_ff_qkv|small_ff_qkv_loss|tiny|big|big_ff|big_qkv|one_wide_big|custom)" >&2; exit 2 ;;
esac
exec "$here/../train.sh" "$data" "$save" "${arch[@]}" "$@"
