"""fairseq-generate with the fast decoding path: the same flags, output and scoring.

    fairseq-ext-generate DATA --user-dir fairseq_ext --path ckpt.pt --beam 5 ... [--int8 | --bf16]
    python -m fairseq_ext.decoding.generate DATA ...       (the same)

--int8 (ours, taken out before fairseq parses the rest): the decoder's Linear layers in int8 (per-row weight
scales, activations quantized per row at each call, exact int32 sums: fairseq_ext/ops/int8_linear.py).
--bf16 on a CPU (ours there; on a GPU it is fairseq's): the weights rounded to bfloat16, the decoder's
products reading them as bfloat16 (half of float32's bytes) with float32 activations and sums; the
hypotheses are fairseq-generate's on the rounded model. fairseq's own --bf16 would run every op in
bfloat16, which CPUs do slowly and less exactly.

fairseq's task.build_generator picks fairseq.sequence_generator.SequenceGenerator when it runs; this entry
point points that name at FastSequenceGenerator (a subclass: same search), then runs fairseq_cli.generate.
Models the fast step does not serve decode with fairseq's step after a one-line notice.
"""
import sys

import fairseq.sequence_generator as sequence_generator
import torch

from .fast_generator import FastSequenceGenerator


def _take(flag, attr, what, exclusive):
    """Take our `flag` out of sys.argv and set FastSequenceGenerator.<attr>; exit naming the first of the
    `exclusive` flags also given."""
    other = [f for f in exclusive if f in sys.argv]
    if other:
        sys.exit(f"fairseq-ext-generate: {flag} {what} and cannot be combined with {other[0]}: drop one of the two")
    sys.argv.remove(flag)
    setattr(FastSequenceGenerator, attr, True)


def main():
    if "-h" in sys.argv or "--help" in sys.argv:
        print("fairseq-ext-generate: fairseq-generate's flags (below), plus\n"
              "  --int8    int8 decoder (its Linear layers in int8, activations quantized per row; fp32 models only)\n"
              "  --bf16    on a CPU: weights rounded to bf16 and read as bf16, float32 arithmetic (fast path)\n")
    on_cpu = "--cpu" in sys.argv or not torch.cuda.is_available()
    if "--bf16" in sys.argv and on_cpu:
        _take("--bf16", "bf16", "on a CPU reads the float32 model's weights as bfloat16",
              ("--int8", "--fp16", "--memory-efficient-fp16", "--memory-efficient-bf16"))
    if "--int8" in sys.argv:
        _take("--int8", "int8", "quantizes the decoder's fp32 weights",
              ("--fp16", "--bf16", "--memory-efficient-fp16", "--memory-efficient-bf16"))
    sequence_generator.SequenceGenerator = FastSequenceGenerator
    from fairseq_cli.generate import cli_main

    cli_main()


if __name__ == "__main__":
    main()
