"""Model families of fairseq_ext. Importing this package registers every architecture.

One small file per family (docs/architecture.md: Layout, Contributing). A new family adds its module name
to FAMILIES; its `*_tiny` archs then join the shared test matrix in tests/ with no new test code.
"""
import importlib

FAMILIES = [
    "baseline",  # transformer_balanced (pre-norm 12/2) and its sizes
    "one_wide_ffn",  # One Wide FFN: FFN sharing / dropping / widening, attention sharing
    "one_wide_ffn_prefix_lm",  # One Wide FFN's decoder-only (prefix-LM) translation model
    "can",  # Compressed Attention Network decoder (+ any One Wide FFN encoder)
    "scaling_sparse",  # Scaling Transformers: sparse FFN, sparse QKV, sparse loss (+ One Wide FFN placement)
    "sas",  # Simplified Transformer blocks: sas_block (translation), SAS / SAS-P language models
    "terraformer",  # Terraformer: concatenated decoder, reversible layers, SRU (+ the Scaling Transformer parts)
]

for _name in FAMILIES:
    importlib.import_module(f"{__name__}.{_name}")


def package_archs():
    """Names of the architectures this package registers (from fairseq's registry), in order."""
    from fairseq.models import ARCH_CONFIG_REGISTRY

    return [name for name, fn in ARCH_CONFIG_REGISTRY.items()
            if getattr(fn, "__module__", "").startswith(__name__ + ".")]
