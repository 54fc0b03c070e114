"""Parameter count of any registered arch, in millions and as % of a baseline, for any vocabulary.

    python -m fairseq_ext.tools.params --arch one_wide_ffn_big --vocab 50408
    python -m fairseq_ext.tools.params --arch one_wide_ffn --vocab 50408 --baseline transformer_wmt_en_de_big \\
        -- --encoder-ffn-sharing shared --decoder-ffn-sharing none --arch-flags-after-double-dash

Models are built on the meta device (shapes only: no memory, any size) from the same flags fairseq-train
takes (after `--`), with a joint vocabulary of --vocab entries (fairseq's 4 special symbols included)
and shared source/target embeddings and output projection (LM archs: --task language_modeling). Tied parameters are counted once. The
baseline defaults to the arch's paper baseline where the family declares one (BASELINES).
"""
import argparse
import importlib
import re

import torch


class VocabTask:
    """The dictionaries a translation model's build_model reads, at a given joint vocabulary size."""

    def __init__(self, size):
        from fairseq.data import Dictionary

        d = Dictionary()
        for i in range(size - len(d)):
            d.add_symbol(f"w{i}")
        self.source_dictionary = self.target_dictionary = d


# decoder parameters a decoding step does not read: the cross-attention keys/values (fairseq's attention,
# CAN's sub-layer) are computed once per sentence
ONCE_PER_SENTENCE = re.compile(r"(encoder_attn\.(k_proj|v_proj)|\.(k_enc|v_enc))\.(weight|bias)$")


def decode_weight_split(model):
    """({id: numel} of the distinct decoder parameters a decoding step reads, numel of the parameters read
    once per sentence: the encoder's own and the decoder's ONCE_PER_SENTENCE ones) for the roofline's bytes."""
    once = {id(p) for n, p in model.decoder.named_parameters() if ONCE_PER_SENTENCE.search(n)}
    step = {id(p): p.numel() for p in model.decoder.parameters() if id(p) not in once}  # tied weights once
    per_sentence = sum(p.numel() for p in model.encoder.parameters() if id(p) not in step)
    per_sentence += sum(p.numel() for p in model.decoder.parameters() if id(p) in once)
    return step, per_sentence


def is_language_model(arch):
    """True for a decoder-only LM arch (trained with --task language_modeling)."""
    import fairseq_ext  # noqa: F401  (registers the package's archs)
    from fairseq.models import ARCH_MODEL_REGISTRY, FairseqLanguageModel

    return issubclass(ARCH_MODEL_REGISTRY[arch], FairseqLanguageModel)


def parse_arch_args(arch, argv=()):
    """The args fairseq-train builds for `--arch arch` plus `argv`, without a data folder
    (translation with shared embeddings, or language_modeling for an LM arch)."""
    import fairseq_ext  # noqa: F401  (registers the package's archs)
    from fairseq import options

    parser = options.get_training_parser()
    task = ["--task", "language_modeling"] if is_language_model(arch) else \
        ["--task", "translation", "--share-all-embeddings"]
    return options.parse_args_and_arch(parser, ["/nonexistent", *task, "--arch", arch, *argv])


def build_model(arch, vocab, argv=(), device="meta", task=None):
    """Model of a registered arch from CLI-style flags, on `device` ('meta': shapes only)."""
    from fairseq.models import ARCH_MODEL_REGISTRY

    args = parse_arch_args(arch, argv)
    with torch.device(device):
        return ARCH_MODEL_REGISTRY[arch].build_model(args, task or VocabTask(vocab))


def count_parameters(model):
    """Distinct parameters (tied weights once)."""
    return sum(p.numel() for p in model.parameters())


def default_baseline(arch):
    from fairseq.models import ARCH_CONFIG_REGISTRY

    module = importlib.import_module(ARCH_CONFIG_REGISTRY[arch].__module__)
    return getattr(module, "BASELINES", {}).get(arch)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", required=True)
    p.add_argument("--vocab", type=int, default=32000, help="joint vocabulary size (default 32000)")
    p.add_argument("--baseline", help="arch to report %% against (default: the paper's baseline, if declared)")
    p.add_argument("flags", nargs=argparse.REMAINDER, help="fairseq-train model flags, after --")
    a = p.parse_args(argv)
    flags = a.flags[1:] if a.flags[:1] == ["--"] else a.flags
    n = count_parameters(build_model(a.arch, a.vocab, flags))
    baseline = a.baseline or default_baseline(a.arch)
    line = f"{a.arch}: {n / 1e6:.1f}M parameters (vocabulary {a.vocab})"
    if baseline:
        b = count_parameters(build_model(baseline, a.vocab))
        line += f", {100 * n / b:.0f}% of {baseline} ({b / 1e6:.1f}M)"
    print(line)
    return n


if __name__ == "__main__":
    main()
