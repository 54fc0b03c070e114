"""bf16 mixed-precision training on CPU: `fairseq-train --bf16` on a CPU run.

fairseq 0.12's `--bf16` means TPU (it sets `--tpu` and casts the whole model to bf16), which cannot run
on a CPU. With this package loaded, `--bf16` in a CPU training run (`--cpu`, or no CUDA device) means
autocast instead:
- weights, gradients and optimizer state stay fp32 (the plain optimizer, no FP16Optimizer wrapper);
  checkpoints are fp32 and decode as any other;
- each training forward (and so its backward) runs under `torch.autocast("cpu", torch.bfloat16)`:
  matrix products in bf16, everything autocast keeps in fp32 in fp32 (the residual stream, LayerNorm
  and its statistics, every softmax of this package's modules and of the loss, the sparse FFN's
  controller log-softmax);
- attention through `F.scaled_dot_product_attention` (fairseq's MultiheadAttention in training) runs in
  fp32: torch's CPU flash-attention backward is 3x slower in bf16 than in fp32 on these machines
  (benchmarks/train_speed.py --precisions measures it);
- label-smoothed cross-entropy is computed from the logits by one fused kernel
  (fairseq_ext/ops/cross_entropy.py), in fp32, instead of materialising fp32 log-probabilities of the
  whole batch: the value and gradient of fairseq's criterion;
- FairseqDropout draws its mask by a counter-based hash (fairseq_ext/ops/dropout.py) instead of torch's
  `bernoulli_`, most of a CPU dropout call; the backward recomputes it from the seed;
- validation stays fp32;
- on a CPU without native bf16 (neither avx512_bf16 nor amx_bf16: torch emulates a bf16 product there at
  under 1 GFLOP/s, ~100x slower than fp32), each bf16 matrix product and convolution (forward and backward)
  is computed in fp32 from its bf16 inputs and rounded back to bf16 (`Bf16ProductsInFp32`): the products of
  two bf16 numbers are exact in fp32 and native bf16 kernels sum in fp32 too, so the result is the native
  one up to the order of the sums, at fp32's speed. Every other op of the step is unchanged.
The choice is logged once per process. `fairseq_ext.tools.precision` decides whether a CPU should train
in bf16 at all (native bf16 instructions and a probe product that is faster than fp32); the recipes
ask it (examples/train.sh).
"""
import contextlib
import functools
import logging

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from .ops.cross_entropy import label_smoothed_ce
from .ops.dropout import hashed_dropout
from .tools.precision import NATIVE_BF16_FLAGS, cpu_flags

logger = logging.getLogger(__name__)

aten = torch.ops.aten
# the precision line a --bf16 training run logs once per process (the study reads them back: tools/study.py)
BF16_LINE = "--bf16 on CPU: training forward/backward under torch.autocast('cpu', bfloat16)"
FP32_PRODUCTS_LINE = "no native bf16 on this CPU: bf16 products computed in fp32 from the bf16 values"


@functools.lru_cache(maxsize=None)
def native_bf16():
    """Whether this CPU multiplies bf16 natively (avx512_bf16 or amx_bf16 in its flags)."""
    return bool(cpu_flags() & NATIVE_BF16_FLAGS)


class Bf16ProductsInFp32(TorchDispatchMode):
    """Every CPU matrix product with a bf16 operand, inside this mode (forward and backward), computed in fp32
    from the same bf16 values and rounded to bf16: the value of a native bf16 product (exact products, fp32
    sums) up to the order of the sums, at fp32's speed on a CPU without native bf16. Other ops pass through."""

    PRODUCTS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
                aten.addbmm.default, aten.mv.default, aten.addmv.default, aten.dot.default, aten.vdot.default,
                aten._addmm_activation.default,
                # convolutions (the sparse QKV's): forward, and backward's input / weight / bias gradients
                aten.convolution.default, aten.convolution_backward.default}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.PRODUCTS and any(isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16
                                         and a.device.type == "cpu" for a in args):
            wide = [a.float() if isinstance(a, torch.Tensor) and a.dtype == torch.bfloat16 else a for a in args]
            out = func(*wide, **kwargs)
            if isinstance(out, tuple):  # convolution_backward: (grad input, grad weight, grad bias), None if unasked
                return tuple(None if o is None else o.bfloat16() for o in out)
            return out.bfloat16()
        return func(*args, **kwargs)


def cpu_autocast_dtype(cfg):
    """torch.bfloat16 when a trainer built from `cfg` trains with CPU autocast (--bf16, not on a
    CUDA device or TPU), else None."""
    common = cfg.common
    if not getattr(common, "bf16", False) or getattr(common, "tpu", False):
        return None
    if torch.cuda.is_available() and not getattr(common, "cpu", False):
        return None
    return torch.bfloat16


def _sdpa_fp32(orig):
    @functools.wraps(orig)
    def sdpa(query, key, value, attn_mask=None, *args, **kwargs):
        if not torch.is_autocast_enabled("cpu") or query.device.type != "cpu":
            return orig(query, key, value, attn_mask, *args, **kwargs)
        if attn_mask is not None and attn_mask.is_floating_point():
            attn_mask = attn_mask.float()
        with torch.autocast("cpu", enabled=False):
            return orig(query.float(), key.float(), value.float(), attn_mask, *args, **kwargs)

    sdpa._fairseq_ext_fp32 = True
    return sdpa


def _dropout_forward(self, x, inplace: bool = False):
    """FairseqDropout.forward inside cpu_autocast: hashed dropout on CPU tensors."""
    if self.p > 0 and (self.training or self.apply_during_inference):
        if x.device.type == "cpu":
            return hashed_dropout(x, self.p)
        return F.dropout(x, p=self.p, training=True, inplace=inplace)
    return x


def fp32_products(dtype=torch.bfloat16):
    """Whether cpu_autocast(dtype) computes its bf16 products in fp32 here (a CPU without native bf16)."""
    return dtype == torch.bfloat16 and not native_bf16()


@contextlib.contextmanager
def cpu_autocast(dtype=torch.bfloat16, products=None):
    """The training forward's precision context: CPU autocast, attention in fp32, FairseqDropout as
    hashed dropout (fairseq_ext/ops/dropout.py); on a CPU without native bf16 (or products="fp32") its bf16
    matrix products are computed in fp32 (Bf16ProductsInFp32). products: None (by the CPU), "fp32" or
    "native"."""
    from fairseq.modules.fairseq_dropout import FairseqDropout

    if products not in (None, "fp32", "native"):
        raise ValueError(f"cpu_autocast: products={products!r}; use None, 'fp32' or 'native'")
    wide = fp32_products(dtype) if products is None else (products == "fp32" and dtype == torch.bfloat16)

    orig_sdpa, orig_dropout = F.scaled_dot_product_attention, FairseqDropout.forward
    outer = getattr(orig_sdpa, "_fairseq_ext_fp32", False)
    if not outer:
        F.scaled_dot_product_attention = _sdpa_fp32(orig_sdpa)
        FairseqDropout.forward = _dropout_forward
    try:
        with torch.autocast("cpu", dtype=dtype), (Bf16ProductsInFp32() if wide else contextlib.nullcontext()):
            yield
    finally:
        if not outer:
            F.scaled_dot_product_attention = orig_sdpa
            FairseqDropout.forward = orig_dropout


def _standard_log_probs(model):
    """True when the model's log-probabilities are fairseq's plain log_softmax of net_output[0]."""
    from fairseq.models import BaseFairseqModel, FairseqDecoder
    from fairseq.models.transformer import TransformerModelBase

    decoder = getattr(model, "decoder", None)
    if decoder is None or getattr(decoder, "adaptive_softmax", None) is not None:
        return False
    model_fn = getattr(type(model), "get_normalized_probs", None)
    decoder_fns = (getattr(type(decoder), "get_normalized_probs", None),
                   getattr(type(decoder), "get_normalized_probs_scriptable", None))
    return (model_fn in (BaseFairseqModel.get_normalized_probs, TransformerModelBase.get_normalized_probs)
            and decoder_fns == (FairseqDecoder.get_normalized_probs,
                                FairseqDecoder.get_normalized_probs_scriptable))


def _unwrap(model):
    """The fairseq model inside data-parallel wrappers (which forward attribute access to it)."""
    from fairseq.models import BaseFairseqModel

    while not isinstance(model, BaseFairseqModel) and hasattr(model, "module"):
        model = model.module
    return model


def _fused_compute_loss(orig):
    @functools.wraps(orig)
    def compute_loss(self, model, net_output, sample, reduce=True):
        if (not torch.is_autocast_enabled("cpu") or not reduce or self.ignore_prefix_size
                or not _standard_log_probs(_unwrap(model))):
            return orig(self, model, net_output, sample, reduce=reduce)
        target = model.get_targets(sample, net_output)
        return label_smoothed_ce(net_output[0], target, self.eps, self.padding_idx)

    compute_loss._fairseq_ext_fused = True
    return compute_loss


def install():
    """Patch fairseq (idempotent): --bf16 on a CPU training run means autocast (see module doc)."""
    from fairseq import options
    from fairseq.criterions.label_smoothed_cross_entropy import LabelSmoothedCrossEntropyCriterion
    from fairseq.trainer import Trainer

    if getattr(options.parse_args_and_arch, "_fairseq_ext_precision", False):
        return

    parse = options.parse_args_and_arch

    @functools.wraps(parse)
    def parse_args_and_arch(parser, input_args=None, *args, **kwargs):
        result = parse(parser, input_args, *args, **kwargs)
        ns = result[0] if isinstance(result, tuple) else result
        training = hasattr(ns, "max_update")
        on_cpu = getattr(ns, "cpu", False) or not torch.cuda.is_available()
        if training and on_cpu and getattr(ns, "bf16", False):
            ns.tpu = False  # fairseq's --bf16 implies --tpu: here it means CPU autocast
        return result

    parse_args_and_arch._fairseq_ext_precision = True
    options.parse_args_and_arch = parse_args_and_arch

    def without_bf16(method):
        """Run a Trainer method with cfg.common.bf16 off when the trainer autocasts: no bf16 model
        cast, no FP16Optimizer, no sample conversion."""

        @functools.wraps(method)
        def wrapped(self, *args, **kwargs):
            cfg = args[0] if method.__name__ == "__init__" else self.cfg
            if cpu_autocast_dtype(cfg) is None:
                return method(self, *args, **kwargs)
            from omegaconf import open_dict

            with open_dict(cfg):
                cfg.common.bf16 = False
                cfg.common.memory_efficient_bf16 = False
                try:
                    return method(self, *args, **kwargs)
                finally:
                    cfg.common.bf16 = True

        return wrapped

    Trainer.__init__ = without_bf16(Trainer.__init__)
    Trainer._build_optimizer = without_bf16(Trainer._build_optimizer)
    Trainer._fp_convert_sample = without_bf16(Trainer._fp_convert_sample)

    train_step = Trainer.train_step

    @functools.wraps(train_step)
    def autocast_train_step(self, samples, raise_oom=False):
        dtype = cpu_autocast_dtype(self.cfg)
        if dtype is None:
            return train_step(self, samples, raise_oom)
        if not getattr(self, "_fairseq_ext_logged_precision", False):
            logger.info(BF16_LINE + ", fp32 weights, optimizer state, attention, softmax, loss and validation"
                        + (f"; {FP32_PRODUCTS_LINE}" if fp32_products(dtype) else ""))
            self._fairseq_ext_logged_precision = True
        with cpu_autocast(dtype):
            return train_step(self, samples, raise_oom)

    Trainer.train_step = autocast_train_step
    LabelSmoothedCrossEntropyCriterion.compute_loss = _fused_compute_loss(
        LabelSmoothedCrossEntropyCriterion.compute_loss)
