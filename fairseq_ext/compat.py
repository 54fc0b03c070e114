"""torch / fairseq glue, in one place.

1. Checkpoint loading under torch >= 2.6. `torch.load` defaults to weights_only=True there, which
   refuses the Python objects a fairseq checkpoint holds besides tensors (argparse.Namespace of the
   training args, omegaconf containers, numpy scalars). We keep weights_only=True -- a checkpoint is
   untrusted input and the full unpickler runs arbitrary code -- and allow exactly those classes with
   `torch.serialization.add_safe_globals`. fairseq imports --user-dir before it loads any checkpoint,
   so fairseq-train (resume), fairseq-generate, fairseq-interactive and fairseq-validate work with no
   environment variable.
2. fairseq.data.data_utils.batch_by_size: the 0.12 forks (as fairseq's main branch) drop the last
   batch when its size is not a multiple of --required-batch-size-multiple (default 8). fairseq-generate
   then silently skips up to 7 test sentences (BLEU on 1,996 of 2,000 lines) and every epoch loses a
   few training pairs. We restore 0.12.2's behaviour (keep every batch) when that drop is detected.
4. numpy >= 2 removed `numpy.compat`, which fairseq's TokenBlockDataset (--task language_modeling) and
   LanguagePairDataset's vectorised sizes still use (`np.compat.long`, numpy 1.x's alias of int).
   `numpy_compat_long` restores that one alias when it is missing.
5. Known-harmless warnings of fairseq 0.12 on today's stack (`quiet_known_warnings`): each is a deprecation
   or a CPU-only notice that a fairseq-train log otherwise prints at every start, none changes a number.
3. Idempotent registration: `register_model` / `register_model_architecture` that tolerate this
   package being imported twice (once through --user-dir, once as `import fairseq_ext`).
"""
import argparse
import collections
import os
import typing

import torch

_SAFE_GLOBALS_DONE = False


def checkpoint_safe_globals():
    """Every non-tensor class that fairseq 0.12 writes into a checkpoint (or broadcasts with
    torch.load on a distributed resume). Nothing here can execute code when unpickled."""
    safe = [
        argparse.Namespace,
        collections.OrderedDict,
        collections.defaultdict,
        dict,
        list,
        int,
        float,
        typing.Any,
    ]
    try:  # numpy scalars and arrays (best scores, --eval-bleu counts)
        import numpy as np

        try:
            from numpy._core.multiarray import _reconstruct, scalar
        except ImportError:  # numpy < 2
            from numpy.core.multiarray import _reconstruct, scalar
        safe += [np.ndarray, np.dtype, _reconstruct, scalar]
        safe += [type(np.dtype(t)) for t in ("float64", "float32", "float16", "int64", "int32", "bool")]
    except ImportError:
        pass
    try:  # omegaconf containers (cfg, distributed broadcast of the checkpoint)
        import omegaconf
        from omegaconf import nodes
        from omegaconf.base import ContainerMetadata, Metadata

        safe += [omegaconf.DictConfig, omegaconf.ListConfig, ContainerMetadata, Metadata]
        safe += [getattr(nodes, n) for n in dir(nodes) if n.endswith("Node") and isinstance(getattr(nodes, n), type)]
    except ImportError:
        pass
    try:
        from fairseq.distributed.utils import _TensorPlaceholder

        safe.append(_TensorPlaceholder)
    except ImportError:
        pass
    return safe


def install_checkpoint_safe_globals():
    global _SAFE_GLOBALS_DONE
    if _SAFE_GLOBALS_DONE or not hasattr(torch.serialization, "add_safe_globals"):
        return
    torch.serialization.add_safe_globals(checkpoint_safe_globals())
    _SAFE_GLOBALS_DONE = True


class CheckpointError(RuntimeError):
    """A checkpoint file that cannot be loaded, with what is wrong with it."""


def checkpoint_error(path, exc):
    """A CheckpointError saying what is wrong with `path`, after torch.load raised `exc` (never torch's
    advice to retry with weights_only=False: that would run whatever code the file carries)."""
    import re

    from .checkpointing import readable_checkpoint

    text = str(exc)
    wanted = re.search(r"GLOBAL ([\w.]+)", text)
    if wanted:  # a pickle that names something to import and call
        return CheckpointError(
            f"refused to load {path}: unpickling it would import and call {wanted.group(1)}, which no fairseq "
            f"checkpoint contains (it holds tensors, numbers, strings and containers). fairseq_ext loads "
            f"checkpoints with weights_only=True and runs no code from a file.")
    problem = readable_checkpoint(str(path))
    if problem:
        return CheckpointError(f"cannot load {path}: it {problem}")
    return CheckpointError(f"cannot load {path}: {type(exc).__name__}: {text.splitlines()[0] if text else ''}")


def load_checkpoint(path):
    """torch.load of a fairseq checkpoint on CPU, weights_only=True, with the safe globals above; a file
    that cannot be loaded raises CheckpointError saying why."""
    install_checkpoint_safe_globals()
    with open(path, "rb") as f:
        try:
            return torch.load(f, map_location="cpu", weights_only=True)
        except Exception as e:
            raise checkpoint_error(path, e) from None


def clear_checkpoint_errors():
    """fairseq's load_checkpoint_to_cpu (fairseq-train resume, fairseq-generate, fairseq-interactive,
    fairseq-validate) raises CheckpointError with what is wrong with the file instead of torch's errors."""
    from fairseq import checkpoint_utils

    original = checkpoint_utils.load_checkpoint_to_cpu
    if getattr(original, "_fairseq_ext", False):
        return

    def load_checkpoint_to_cpu(path, *args, **kwargs):
        try:
            return original(path, *args, **kwargs)
        except FileNotFoundError:
            raise
        except CheckpointError:
            raise
        except Exception as e:
            if not os.path.isfile(str(path)):
                raise
            raise checkpoint_error(path, e) from None

    load_checkpoint_to_cpu._fairseq_ext = True
    checkpoint_utils.load_checkpoint_to_cpu = load_checkpoint_to_cpu


def register_model(name, dataclass=None):
    """fairseq's register_model, but re-registering the same class (same qualified name) is a no-op."""
    from fairseq.models import MODEL_REGISTRY, register_model as fairseq_register_model

    def wrapper(cls):
        existing = MODEL_REGISTRY.get(name)
        if existing is not None and _same_class(existing, cls):
            return existing
        return fairseq_register_model(name, dataclass=dataclass)(cls)

    return wrapper


def register_model_architecture(model_name, arch_name):
    """fairseq's register_model_architecture, idempotent for a re-import of the same function. The
    registered function (what fairseq calls for --arch) also checks the numeric flags once the arch has set
    its defaults (models/common.py check_flags, with the family module's FLAG_RANGES); the module keeps
    the plain function, which other arch functions call."""
    import functools
    import sys

    from fairseq.models import ARCH_CONFIG_REGISTRY
    from fairseq.models import register_model_architecture as fairseq_register_arch

    def wrapper(fn):
        existing = ARCH_CONFIG_REGISTRY.get(arch_name)
        if existing is not None and _same_class(existing, fn):
            return fn

        @functools.wraps(fn)
        def checked(args):
            from .models.common import check_flags

            fn(args)
            check_flags(args, getattr(sys.modules.get(fn.__module__), "FLAG_RANGES", {}), arch_name)

        fairseq_register_arch(model_name, arch_name)(checked)
        return fn

    return wrapper


def _same_class(a, b):
    return (getattr(a, "__module__", None), getattr(a, "__qualname__", None)) == (
        getattr(b, "__module__", None), getattr(b, "__qualname__", None))


def keep_last_batch():
    """Make fairseq's batch_by_size keep a final batch smaller than the batch-size multiple."""
    import numpy as np
    from fairseq.data import data_utils

    if getattr(data_utils.batch_by_size, "_fairseq_ext_keeps_last_batch", False):
        return
    probe = data_utils.batch_by_size(np.arange(3, dtype=np.int64), lambda i: 1, max_sentences=2,
                                     required_batch_size_multiple=2)
    if sum(len(b) for b in probe) == 3:
        return  # this fairseq keeps every index: nothing to fix
    original = data_utils.batch_by_size

    def batch_by_size(indices, num_tokens_fn, num_tokens_vec=None, max_tokens=None, max_sentences=None,
                      required_batch_size_multiple=1, fixed_shapes=None):
        if fixed_shapes is not None or required_batch_size_multiple <= 1:
            return original(indices, num_tokens_fn, num_tokens_vec, max_tokens, max_sentences,
                            required_batch_size_multiple, fixed_shapes)
        from fairseq.data.data_utils_fast import batch_by_size_fn, batch_by_size_vec

        if not isinstance(indices, np.ndarray):
            indices = np.fromiter(indices, dtype=np.int64, count=-1)
        max_tokens = int(max_tokens) if max_tokens is not None else -1
        max_sentences = max_sentences if max_sentences is not None else -1
        if num_tokens_vec is None:
            return batch_by_size_fn(indices, num_tokens_fn, max_tokens, max_sentences, required_batch_size_multiple)
        if not isinstance(num_tokens_vec, np.ndarray):
            num_tokens_vec = np.fromiter(num_tokens_vec, dtype=np.int64, count=-1)
        return batch_by_size_vec(indices, num_tokens_vec, max_tokens, max_sentences, required_batch_size_multiple)

    batch_by_size.__doc__ = original.__doc__
    batch_by_size._fairseq_ext_keeps_last_batch = True
    data_utils.batch_by_size = batch_by_size


def numpy_compat_long():
    """Give numpy >= 2 the `numpy.compat.long` alias fairseq 0.12 still reads (item 4 above)."""
    import types

    import numpy as np

    try:
        np.compat.long  # noqa: B018  (numpy 1.x: present)
    except AttributeError:
        np.compat = types.SimpleNamespace(long=int)


def alignment_needs_source_attention():
    """--print-alignment (fairseq's SequenceGeneratorWithAlignment) reads the decoder's attention over
    source positions; a model class without one says why in `no_alignment` and the generator refuses it
    when built, naming the flag (fairseq itself fails with an IndexError after the first batch)."""
    from fairseq import sequence_generator

    cls = sequence_generator.SequenceGeneratorWithAlignment
    if getattr(cls.__init__, "_fairseq_ext_checked", False):
        return
    original = cls.__init__

    def __init__(self, models, *args, **kwargs):
        for m in models:
            for inner in getattr(m, "models", [m]):
                why = getattr(inner, "no_alignment", None)
                if why:
                    raise ValueError(f"--print-alignment: {type(inner).__name__} {why}; decode without "
                                     f"--print-alignment")
        original(self, models, *args, **kwargs)

    __init__._fairseq_ext_checked = True
    cls.__init__ = __init__


# (message regex, category, module regex, why it is harmless)
KNOWN_WARNINGS = [
    (r"`torch\.cuda\.amp\.autocast\(args\.\.\.\)` is deprecated", FutureWarning, "",
     "fairseq's train step opens a disabled CUDA autocast context; no effect on a CPU or with fairseq's fp16"),
    (r"Support for mismatched key_padding_mask and attn_mask is deprecated", UserWarning, "",
     "fairseq passes a bool padding mask with a float causal mask; torch converts it to the same masking"),
    (r"'pin_memory' argument is set as true but no accelerator is found", UserWarning, "",
     "fairseq's data loader asks for pinned memory, which a CPU-only run does not need"),
    (r"(?s).*", UserWarning, r"hydra(\.|$)",
     "fairseq 0.12 uses Hydra 1.0's API (experimental compose/initialize, strict flag, _group_ headers)"),
    (r"(?s)\s*'config' is validated against ConfigStore schema", UserWarning, "",
     "Hydra's notice about the schema matching fairseq 0.12's config relies on, issued from the top level"),
]


def quiet_known_warnings():
    import warnings

    for message, category, module, _why in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


install_checkpoint_safe_globals()
quiet_known_warnings()
alignment_needs_source_attention()
keep_last_batch()
numpy_compat_long()
clear_checkpoint_errors()
