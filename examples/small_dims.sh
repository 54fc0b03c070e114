# The "small" model size every recipe family trains on 2 CPU cores (sourced by the train.sh scripts):
# 4 encoder + 2 decoder layers, d=256, 4 heads, pre-norm, shared embeddings (the shipped baseline's
# dims); SMALL_FFN is its FFN width 1,024 (families that change the FFN leave it out or override it).
# shellcheck shell=bash
SMALL_DIMS=(--encoder-layers 4 --decoder-layers 2 --encoder-embed-dim 256 --decoder-embed-dim 256
            --encoder-attention-heads 4 --decoder-attention-heads 4
            --encoder-normalize-before --decoder-normalize-before --share-all-embeddings)
SMALL_FFN=(--encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024)
