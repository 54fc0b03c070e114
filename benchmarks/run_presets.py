"""`make bench`: each architecture's decoding / training speed and memory against its paper's baseline.

    python benchmarks/run_presets.py [--quick] [--only NAME ...] [--threads N]

Candidates that are not registered are skipped with a message (a preset whose candidates are all
missing still measures its baseline). Results go to
docs/benchmarks/<preset>.{json,md,png}. --quick: 2 rounds, short sequences, same models (smoke run).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode_speed  # noqa: E402
import train_allocator  # noqa: E402
import train_precision  # noqa: E402
import train_speed  # noqa: E402


# the Scaling Transformer recipe's models (examples/scaling_sparse/train.sh) at the small dims, 8k vocabulary
SMALL, SMALL_FFN = common.small_dims()
_study = __import__("fairseq_ext.tools.study", fromlist=["PROTOCOLS", "configs"])
_STUDY = _study.PROTOCOLS["paper"]
STUDY_DIMS = " ".join(_STUDY.dims) + f" --encoder-ffn-embed-dim {_STUDY.ffn} --decoder-ffn-embed-dim {_STUDY.ffn}"
DENSE_SMALL = f"dense=transformer@{SMALL} {SMALL_FFN}"


def _study_models():
    """The study's configurations (fairseq_ext/tools/study.py) as NAME=ARCH@FLAGS at the study's dims, each
    model once (a diagnosis that trains a configuration's model again, e.g. with another cap, is not measured
    twice: the study's table finds it by its spec)."""
    models, seen = [], set()
    for c in sorted(_study.configs(_STUDY), key=lambda c: c.role == "diagnosis"):  # a model by its own name
        spec = _study.bench_spec(_STUDY.dims + c.flags)
        if spec not in seen:
            seen.add(spec)
            models.append(f"{c.name}={spec}")
    return models


STUDY_MODELS = _study_models()
SMALL_SPARSE = [f"sparse_ff=scaling_sparse_ff@{SMALL} {SMALL_FFN} --sparse-ffn-block-size 64",
                f"sparse_ff_n128=scaling_sparse_ff@{SMALL} {SMALL_FFN} --sparse-ffn-block-size 128",
                f"sparse_ff_qkv=scaling_sparse@{SMALL} --sparse-qkv-modules 4 --encoder-ffn-embed-dim 1344 "
                "--decoder-ffn-embed-dim 1344"]
SMALL_SPARSE_ALL = [DENSE_SMALL + "+fast"] + [s + suffix for s in SMALL_SPARSE for suffix in ("", "+fast")]


# name: (script, baseline, candidates, extra flags). Paper figures in the comments.
PRESETS = {
    # the stock figures every later ratio builds on: 6/6 base, big, and the 12/2 balanced model
    "decode_stock": (decode_speed, "transformer", ["transformer_wmt_en_de_big", "transformer_balanced"], []),
    # One Wide FFN (paper: +24% decoding speed at batch 1, beam 5 on Big)
    "decode_one_wide_ffn_big": (decode_speed, "transformer_wmt_en_de_big", ["one_wide_ffn_big"], []),
    "decode_one_wide_ffn_base": (decode_speed, "transformer", ["one_wide_ffn_base"], []),
    # CAN vs the balanced 12/2 baseline (paper: 1.42x, beam 4)
    "decode_can": (decode_speed, "transformer_balanced", ["can_decoder"], ["--beam", "4"]),
    # ... and against the standard 6/6 Transformer base (paper: 2.82x)
    "decode_can_vs_standard": (decode_speed, "transformer", ["transformer_balanced", "can_decoder"], ["--beam", "4"]),
    # Scaling Transformer at Big dims: dense vs sparse FFN / sparse QKV / both, unbatched greedy decoding
    # (paper Table 1, 800M decoder-only model: 1.72x, 1.05x, 2.62x), and with beam 5
    "decode_scaling_sparse": (decode_speed, "transformer_wmt_en_de_big",
                              ["scaling_sparse_ff", "scaling_sparse_qkv", "scaling_sparse"], ["--beam", "1"]),
    "decode_scaling_sparse_beam5": (decode_speed, "transformer_wmt_en_de_big",
                                    ["scaling_sparse_ff", "scaling_sparse_qkv", "scaling_sparse"], ["--beam", "5"]),
    # ... and at the recipe's small dims (the models of examples/scaling_sparse/compare.sh: dense, sparse
    # FFN N = 64 / 128, sparse FFN + QKV), each also on the fast path; greedy and beam 5, batch 1
    "decode_scaling_sparse_small": (decode_speed, DENSE_SMALL, SMALL_SPARSE_ALL, ["--beam", "1", "--vocab", "8000"]),
    "decode_scaling_sparse_small_beam5": (decode_speed, DENSE_SMALL, SMALL_SPARSE_ALL,
                                          ["--beam", "5", "--vocab", "8000"]),
    # One Wide FFN whose 49,152-unit shared FFN is top-1-of-64 sparse, vs the dense One Wide FFN
    "decode_one_wide_sparse_ffn": (decode_speed, "one_wide_ffn_big", ["one_wide_sparse_ffn_big"], []),
    # Fast decoding path (docs/decoding/README.md): fairseq's SequenceGenerator vs fairseq_ext's fast step
    # (fp32, int8 decoder)
    # vs CTranslate2 (fp32, int8) on the same weights; batch 1, beam 5
    "decode_fast_big": (decode_speed, "transformer_wmt_en_de_big",
                        ["transformer_wmt_en_de_big+fast", "transformer_wmt_en_de_big+int8",
                         "transformer_wmt_en_de_big+ct2", "transformer_wmt_en_de_big+ct2int8"], []),
    # One Wide FFN Big on the fast path against CTranslate2 running Transformer Big (fp32)
    "decode_fast_one_wide": (decode_speed, "transformer_wmt_en_de_big+ct2",
                             ["transformer_wmt_en_de_big+fast", "one_wide_ffn_big+fast", "one_wide_ffn_big+int8"], []),
    "decode_fast_base": (decode_speed, "transformer",
                         ["transformer+fast", "transformer+int8", "transformer+ct2", "transformer+ct2int8"], []),
    # the fast path's CAN and SAS steppers (fp32, int8 decoder) on CAN (beam 4, as its recipe) and the
    # simplified blocks, next to their baselines on the fast path
    "decode_fast_can": (decode_speed, "can_decoder",
                        ["can_decoder+fast", "can_decoder+int8", "transformer_balanced", "transformer_balanced+fast"],
                        ["--beam", "4"]),
    # the CAN ablations (--can-compress ffn / attention) on fairseq's step and on the CAN stepper, beside CAN and
    # its balanced baseline on the fast path
    "decode_fast_can_ablations": (decode_speed, "can_ffn=can_decoder@--can-compress ffn",
                                  ["can_ffn=can_decoder@--can-compress ffn+fast",
                                   "can_attention=can_decoder@--can-compress attention",
                                   "can_attention=can_decoder@--can-compress attention+fast", "can_decoder+fast",
                                   "transformer_balanced+fast"], ["--beam", "4", "--repeats", "3"]),
    "decode_fast_sas": (decode_speed, "sas_block",
                        ["sas_block+fast", "sas_block+int8", "transformer", "transformer+fast"], []),
    # the fast path's sparse QKV step (Transformer stepper) on the Scaling Transformer at Big dims, next to
    # Transformer Big on both paths; batch 1, beam 5
    "decode_fast_scaling_sparse": (decode_speed, "scaling_sparse",
                                   ["scaling_sparse+fast", "transformer_wmt_en_de_big",
                                    "transformer_wmt_en_de_big+fast"], []),
    # Simplified blocks: training throughput vs Pre-LN in the paper's LM setting (18 x 768, MLP 3072,
    # context 128; paper: ~15% faster, ~15% fewer parameters), and the translation model vs base
    "train_sas_lm": (train_speed, "preln_lm", ["sas_lm", "sas_p_lm", "sas_p_nonorm_lm"],
                     ["--len", "128", "--tokens", "2048"]),
    "train_sas_block": (train_speed, "transformer", ["sas_block"], []),
    # ... and the Scaling Transformer recipe's models (small dims, 8k vocabulary): training step speed vs dense
    "train_scaling_sparse_small": (train_speed, DENSE_SMALL, SMALL_SPARSE, ["--vocab", "8000"]),
    # Terraformer (§4.2): peak training memory with and without reversible layers at a long length
    # (256 source + 256 target tokens: the decoder runs over 512 positions), and with LSH attention
    "train_terraformer_memory": (train_speed, "terraformer_base@--no-reversible",
                                 ["terraformer_base", "terraformer_base@--lsh-attention both --sparse-qkv-modules 0",
                                  "terraformer_base@--lsh-attention both --sparse-qkv-modules 0 --no-reversible",
                                  "transformer"], ["--len", "256", "--tokens", "2048", "--repeats", "1", "--warmup", "0"]),
    # fp32 vs bf16 autocast training (fairseq-train --bf16 on CPU) of the baseline and each main architecture at
    # the recipes' small dims, through fairseq's Trainer on real batches
    "train_precision": (train_precision, train_precision.MODELS[0], train_precision.MODELS[1:], []),
    # the study's configurations (docs/results) at the study's dims, fp32 and bf16 autocast, one thread (as each
    # study process trains): the training-speed column of the study's table (ratios to the baseline in this run)
    "train_study": (train_precision, STUDY_MODELS[0], STUDY_MODELS[1:], ["--threads", "1"]),
    # ... with bf16 products computed in fp32 (--bf16 on a CPU without native bf16): the study's speed there
    "train_study_fp32_products": (train_precision, STUDY_MODELS[0], STUDY_MODELS[1:],
                                  ["--threads", "1", "--bf16-products", "fp32"]),
    # ... and their decoding speed (fairseq's generator, beam 5, one thread), unbatched and at batch 64: the
    # decoding-speed column of the study's table (batch 64; ratios to the baseline in this run)
    "decode_study": (decode_speed, STUDY_MODELS[0], STUDY_MODELS[1:],
                     ["--threads", "1", "--beam", "5", "--batch-sizes", "1,64", "--vocab", str(_STUDY.vocab),
                      "--repeats", "3"]),
    # glibc malloc vs tcmalloc (what examples/train.sh preloads on a CPU): the study's baseline shape and the
    # recipes' small baseline, in the precision the recipes choose, one process per measurement
    "train_allocator": (train_allocator, f"study_baseline=transformer@{STUDY_DIMS}", train_precision.MODELS[:1], []),
    # The roofline table (docs/benchmarks/decoding.md): every family at its paper's dims on the fast path, fp32
    # and int8 decoder, batch 1, beam 5: bytes per step, % of the weight-streaming roofline, encoder time
    "decode_roofline": (decode_speed, "transformer_wmt_en_de_big+fast",
                        ["transformer_wmt_en_de_big+int8", "one_wide_ffn_big+fast", "one_wide_ffn_big+int8",
                         "scaling_sparse_ff+fast", "scaling_sparse_qkv+fast", "scaling_sparse+fast",
                         "scaling_sparse+int8", "one_wide_sparse_ffn_big+fast", "transformer_balanced+fast",
                         "transformer_balanced+int8", "can_decoder+fast", "can_decoder+int8", "transformer+fast",
                         "transformer+int8", "sas_block+fast", "sas_block+int8", "terraformer+fast"],
                        ["--beam", "5", "--repeats", "3"]),
    # ... its bf16 columns (--bf16: weights read as bf16), each family's fp32 fast path beside it in the same
    # run (a run of its own: every model of both lists at once does not fit a 24 GB machine)
    "decode_roofline_bf16": (decode_speed, "transformer_wmt_en_de_big+fast",
                             ["transformer_wmt_en_de_big+bf16", "one_wide_ffn_big+fast", "one_wide_ffn_big+bf16",
                              "scaling_sparse+fast", "scaling_sparse+bf16", "transformer_balanced+fast",
                              "transformer_balanced+bf16", "can_decoder+fast", "can_decoder+bf16", "transformer+fast",
                              "transformer+bf16", "sas_block+fast", "sas_block+bf16"],
                             ["--beam", "5", "--repeats", "3"]),
    # ... batched: 16 sentences x beam 5 per step, fp32: each family's speed against its paper's baseline next to
    # the ratio of their FLOPs per step (counted on the fast path's arithmetic), sentences/s
    "decode_roofline_batched": (decode_speed, "transformer_wmt_en_de_big+fast",
                                ["one_wide_ffn_big+fast", "scaling_sparse_ff+fast", "scaling_sparse_qkv+fast",
                                 "scaling_sparse+fast", "one_wide_sparse_ffn_big+fast", "transformer_balanced+fast",
                                 "can_decoder+fast", "transformer+fast", "sas_block+fast", "terraformer+fast"],
                                ["--beam", "5", "--batch-sizes", "16", "--repeats", "3"]),
    # Terraformer decoding vs Transformer Big and the Scaling Transformer (paper §4.4: 0.086 s vs 0.061 s
    # per token for Terraformer vs the sparse Transformer), unbatched greedy decoding, with fairseq's
    # generator and on the fast path
    "decode_terraformer": (decode_speed, "transformer_wmt_en_de_big",
                           ["scaling_sparse", "terraformer", "transformer_wmt_en_de_big+fast", "scaling_sparse+fast",
                            "terraformer+fast"], ["--beam", "1"]),
}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="+", choices=sorted(PRESETS))
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--out-dir", default=None)
    args = p.parse_args(argv)
    for name in args.only or PRESETS:
        script, baseline, candidates, extra = PRESETS[name]
        flags = ["--baseline", baseline, "--candidates", *candidates, "--name", name,
                 "--threads", str(args.threads), *extra]
        if args.quick:
            flags.append("--quick")
        if args.out_dir:
            flags += ["--out-dir", args.out_dir]
        print(f"\n## {name}\n", flush=True)
        try:
            script.main(flags)
        except SystemExit as e:  # the baseline itself is missing (e.g. an LM arch not registered yet)
            print(f"skipped {name}: {e}", flush=True)


if __name__ == "__main__":
    main()
