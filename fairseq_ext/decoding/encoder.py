"""The encoder on the fast decoding path (fast_generator.py): its products are compute-bound.

The encoder runs once per sentence over all its tokens, so each of its products multiplies many rows by a
weight (a decoding step multiplies a few). Which product is fastest then depends on the CPU and the dtype,
so it is chosen at run time, on the machine that decodes:

- **fp32**: torch's default float32 product (MKL on x86) repacks the weight on every call; oneDNN on a
  weight packed once (`torch.ops.mkldnn._reorder_linear_weight`, `_linear_pointwise`) does not, and on some
  CPUs it is several times faster (AMD EPYC Zen 5, one thread, 30 rows: 2.5-4x). `fp32_packed_reason()`
  times both on a probe product (PROBE, the current thread count, medians of interleaved calls) and packs
  where oneDNN is at least MIN_SPEEDUP times faster; FAIRSEQ_EXT_ENCODER_PRODUCT=packed|default overrides.
  The sums are the same products in another order (results agree to float32 rounding).
- **bf16** (`--bf16`, weights already rounded to bf16: fast_generator.round_to_bf16): the encoder runs under
  `torch.autocast("cpu", bfloat16)` when `bf16_encoder_reason()` finds this CPU's bf16 products faster
  (tools/precision.py's test). The encoder's own Linear weights are then stored in bf16, so autocast does
  not cast float32 weights on every call (One Wide FFN's shared FFN, applied in every layer, would be cast
  six times per sentence), and packed for oneDNN: an unpacked bf16 weight is re-laid out by oneDNN on every
  product, which for One Wide FFN's 49,152-wide FFN costs more than the product.

Where this torch cannot pack bf16 weights (oneDNN's bf16 product needs AVX-512), the bf16 weights stay
unpacked and run through F.linear, cast to the input's dtype outside autocast.

Packed are the encoder's own Linear layers (not those shared with the decoder); fairseq's attention then
takes its general path, which calls its projections as modules (F.multi_head_attention_forward would read
their weights directly). A packed layer falls back to F.linear when
its weight changed after packing, when gradients are being recorded, or under the other precision. The
packed copy is extra memory: the size of those weights (in bf16, their bf16 size).

`EncoderMixin.forward_encoder` prepares each model's encoder on its first call (so any EnsembleModel with
the mixin, fairseq's included, runs the encoder the same way) and returns float32 outputs.
"""
import functools
import os
import statistics
import time
from typing import Optional

import torch
from torch import nn

MIN_SPEEDUP = 1.2
PROBE = (32, 512, 2048)  # rows, in features, out features
ENV = "FAIRSEQ_EXT_ENCODER_PRODUCT"


@functools.lru_cache(maxsize=None)
def bf16_encoder_reason() -> Optional[str]:
    """None when the encoder should run under bf16 autocast with --bf16, else why not (one line)."""
    from ..tools import precision

    if torch.cuda.is_available():
        return "a CUDA device: fairseq's own --bf16"
    choice = precision.choose()
    return None if choice["precision"] == "bf16" else choice["reason"]


def pack_weight(weight):
    """A Linear weight (out, in) laid out once for oneDNN's product (packed_linear)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def packed_linear(rows, packed, bias):
    """rows (n, in) times a pack_weight weight, plus bias (or None): (n, out), in rows' dtype."""
    return torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")


@functools.lru_cache(maxsize=None)
def can_pack(dtype=torch.float32) -> bool:
    """Whether this torch has oneDNN's packed linear for dtype."""
    try:
        packed_linear(torch.zeros(2, 8, dtype=dtype), pack_weight(torch.zeros(8, 8, dtype=dtype)), None)
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def probe_packed_speedup(shape=PROBE, repeats=7) -> float:
    """F.linear's time over oneDNN's on a packed weight, float32, at shape (medians of interleaved calls)."""
    rows, k, n = shape
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(rows, k, generator=gen), torch.randn(n, k, generator=gen)
    b = torch.randn(n, generator=gen)
    packed = pack_weight(w)
    calls = {"default": lambda: nn.functional.linear(x, w, b), "packed": lambda: packed_linear(x, packed, b)}
    times = {name: [] for name in calls}
    with torch.no_grad():
        for f in calls.values():
            f()
        for _ in range(repeats):
            for name, f in calls.items():
                t = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t)
    return statistics.median(times["default"]) / statistics.median(times["packed"])


@functools.lru_cache(maxsize=None)
def fp32_packed_reason() -> Optional[str]:
    """None when the encoder's fp32 products should run on oneDNN-packed weights, else why not (one line)."""
    choice = os.environ.get(ENV, "")
    if choice not in ("", "packed", "default"):
        raise ValueError(f"{ENV}={choice!r}: use packed (oneDNN on packed weights), default (torch's "
                         f"F.linear) or leave it unset (measured)")
    if choice == "default":
        return f"{ENV}=default"
    if not can_pack(torch.float32):
        return "this torch has no oneDNN packed linear (torch.ops.mkldnn._linear_pointwise)"
    if choice == "packed":
        return None
    speedup = probe_packed_speedup()
    if speedup < MIN_SPEEDUP:
        return f"oneDNN on a packed weight ran {speedup:.2f}x F.linear's speed (< {MIN_SPEEDUP})"
    return None


class _Packed:
    """What a prepared module keeps: the dtype and oneDNN-packed copies of a Linear layer's weight and bias
    and the weight's version when packed, or an encoder's prepared dtype (weight None). Not copied: a deep
    copy or a pickle of the module holds None instead (a copied model runs F.linear until prepared again)."""

    def __init__(self, dtype, weight=None, bias=None, version=None):
        self.dtype, self.weight, self.bias, self.version = dtype, weight, bias, version

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return type(None), ()


def _packed_forward(self, x):
    """nn.Linear.forward on the packed weight (float32 in and out; bf16 under autocast, as autocast's
    F.linear), F.linear where the packed copy does not apply."""
    packed, autocast = self._packed, torch.is_autocast_enabled("cpu")
    if (packed is not None and x.device.type == "cpu"
            and (autocast if packed.dtype == torch.bfloat16 else not autocast and x.dtype == torch.float32)
            and self.weight._version == packed.version
            and not (torch.is_grad_enabled() and (self.weight.requires_grad or x.requires_grad))):
        rows = x.reshape(-1, x.size(-1)).to(packed.dtype)
        y = packed_linear(rows, packed.weight, packed.bias)
        return y.view(*x.shape[:-1], y.size(-1))
    if autocast:
        return nn.functional.linear(x, self.weight, self.bias)
    return nn.functional.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))


def prepared_dtype(model):
    """The dtype model's encoder was prepared for (prepare_encoder), or None."""
    marker = getattr(model.encoder, "_packed", None)
    return None if marker is None else marker.dtype


def prepare_encoder(model, dtype=torch.bfloat16):
    """The encoder's own Linear layers on weights packed for oneDNN in dtype (bf16: the weights themselves
    stored in bf16 too); in place, once per dtype (see the module docstring)."""
    if prepared_dtype(model) == dtype:
        return model
    decoder = {id(p) for p in model.decoder.parameters()} if getattr(model, "decoder", None) is not None else set()
    pack = can_pack(dtype)
    with torch.no_grad():
        for m in model.encoder.modules():
            if type(m) is not nn.Linear or id(m.weight) in decoder or m.weight.device.type != "cpu":
                continue
            if dtype == torch.bfloat16:
                if m.weight.dtype not in (torch.float32, torch.bfloat16):
                    continue
                m.weight.data = m.weight.data.to(torch.bfloat16)
            elif m.weight.dtype != torch.float32:
                continue
            if pack or dtype == torch.bfloat16:  # a bf16 weight needs _packed_forward's casts outside autocast
                # unpackable (oneDNN's bf16 product needs AVX-512): None, F.linear on the bf16 weight
                m._packed = _Packed(dtype, pack_weight(m.weight), None if m.bias is None else
                                    m.bias.detach().to(dtype), m.weight._version) if pack else None
                m.forward = functools.partial(_packed_forward, m)  # (a bound method would not pickle)
        if pack:
            from fairseq.modules import MultiheadAttention

            for m in model.encoder.modules():
                if isinstance(m, MultiheadAttention) and all(
                        getattr(getattr(getattr(m, name, None), "_packed", None), "dtype", None) == dtype
                        for name in ("q_proj", "k_proj", "v_proj", "out_proj")):
                    # fairseq's general path calls the projections as modules (on the packed weights), where
                    # F.multi_head_attention_forward would read their weights directly
                    m.skip_embed_dim_check = True
    model.encoder._packed = _Packed(dtype)
    return model


class EncoderMixin:
    """forward_encoder with each model's encoder prepared on first use (prepare_encoder): under
    torch.autocast("cpu", bfloat16) when `encoder_bf16` (outputs back in float32), on fp32 weights packed
    for oneDNN when `encoder_packed`, else as the model runs it."""

    encoder_bf16 = False
    encoder_packed = False

    def forward_encoder(self, net_input):
        if self.encoder_bf16:
            for model in self.models:
                prepare_encoder(model, torch.bfloat16)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outs = super().forward_encoder(net_input)
            return [{k: [t.float() if torch.is_tensor(t) and t.dtype == torch.bfloat16 else t for t in v]
                     for k, v in out.items()} for out in outs]
        if self.encoder_packed:
            for model in self.models:
                prepare_encoder(model, torch.float32)
        return super().forward_encoder(net_input)
