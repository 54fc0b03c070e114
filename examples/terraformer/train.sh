#!/usr/bin/env bash
# Train a Terraformer EN->DE (examples/train.sh with the size's model flags).
#   examples/terraformer/train.sh SIZE DATA_BIN SAVE_DIR [extra fairseq-train flags...]
# SIZE:
#   small        the dims of examples/baseline/train.sh small (4+2 layers, d=256, 4 heads) with the
#                Terraformer's parts: sparse FFN N = 64 + sparse QKV S = 4 at scaling_sparse's small
#                parameter-matched d_ff 1,344 (7.4M parameters with the 8k vocabulary, baseline 7.32M), SRU 32,
#                reversible, two attention layers per decoder block
#   small_dense  the same with dense FFN and attention (concatenated decoder, reversibility, SRU only)
#   tiny         terraformer_tiny (smoke runs)
#   base / big   terraformer_base / terraformer
set -euo pipefail
size=$1; data=$2; save=$3; shift 3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../small_dims.sh
source "$here/../small_dims.sh"
SMALL=(--arch terraformer_base "${SMALL_DIMS[@]}" --sparse-qkv-modules 4 --encoder-ffn-embed-dim 1344
       --decoder-ffn-embed-dim 1344)
case "$size" in
  small)       arch=("${SMALL[@]}") ;;
  small_dense) arch=("${SMALL[@]}" --sparse-qkv-modules 0 --sparse-ffn-block-size 0 "${SMALL_FFN[@]}") ;;
  tiny)        arch=(--arch terraformer_tiny --lr 2e-3 --warmup-updates 200) ;;
  base)        arch=(--arch terraformer_base --lr 7e-4 --warmup-updates 4000) ;;
  big)         arch=(--arch terraformer --lr 5e-4 --warmup-updates 4000) ;;
  *) echo "unknown SIZE '$size' (small|small_dense|tiny|base|big)" >&2; exit 2 ;;
esac
exec "$here/../train.sh" "$data" "$save" "${arch[@]}" "$@"
