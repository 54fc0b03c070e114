"""The encoder under `fairseq-ext-generate --bf16` on a CPU (fast_generator.py).

The encoder runs once per sentence over all its tokens: compute-bound products, where a CPU with native
bf16 instructions (AMX, AVX512_BF16) is several times faster in bf16 than in fp32. Under --bf16 (weights
already rounded to bf16: fast_generator.round_to_bf16) it runs under `torch.autocast("cpu", bfloat16)`
when `bf16_encoder_reason()` finds this CPU's bf16 products faster (tools/precision.py's test), and:

- the weights of the encoder's own Linear layers (not shared with the decoder) are stored in bf16, so
  autocast does not cast float32 weights on every call (One Wide FFN's shared FFN, applied in every layer,
  would be cast six times per sentence);
- those called as modules (the FFNs: fairseq's attention reads its projection weights directly) run on a
  weight packed once for oneDNN (`torch.ops.mkldnn._reorder_linear_weight`, `_linear_pointwise`): an
  unpacked bf16 weight is re-laid out by oneDNN on every product, which for One Wide FFN's 49,152-wide FFN
  costs more than the product. Where torch has no such op, the plain bf16 weight is used.

`BF16EncoderMixin.forward_encoder` does both on its first call for each model (so any EnsembleModel with
the mixin, fairseq's included, runs the encoder the same way) and returns the outputs in float32.
"""
import functools
import types
from typing import Optional

import torch
from torch import nn


@functools.lru_cache(maxsize=None)
def bf16_encoder_reason() -> Optional[str]:
    """None when the encoder should run under bf16 autocast with --bf16, else why not (one line)."""
    from ..tools import precision

    if torch.cuda.is_available():
        return "a CUDA device: fairseq's own --bf16"
    choice = precision.choose()
    return None if choice["precision"] == "bf16" else choice["reason"]


def _packed_forward(self, x):
    """nn.Linear.forward on the weight packed for oneDNN: bf16 in, bf16 out (as autocast's F.linear)."""
    if not torch.is_autocast_enabled("cpu"):
        return nn.functional.linear(x, self.weight.to(x.dtype), None if self.bias is None else self.bias.to(x.dtype))
    rows = x.reshape(-1, x.size(-1)).to(torch.bfloat16)
    y = torch.ops.mkldnn._linear_pointwise(rows, self._packed_weight, self._packed_bias, "none", [], "")
    return y.view(*x.shape[:-1], y.size(-1))


def _can_pack() -> bool:
    try:
        w = torch.zeros(8, 8, dtype=torch.bfloat16)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, None)
        torch.ops.mkldnn._linear_pointwise(torch.zeros(2, 8, dtype=torch.bfloat16), packed, None, "none", [], "")
        return True
    except (AttributeError, RuntimeError, NotImplementedError):
        return False


def prepare_encoder(model):
    """The encoder's own Linear weights stored in bf16, and those called as modules run on a packed
    weight (see the module docstring); in place, once."""
    if getattr(model.encoder, "_bf16_prepared", False):
        return model
    decoder = {id(p) for p in model.decoder.parameters()} if getattr(model, "decoder", None) is not None else set()
    pack = _can_pack()
    with torch.no_grad():
        for m in model.encoder.modules():
            if type(m) is not nn.Linear or id(m.weight) in decoder or m.weight.dtype != torch.float32:
                continue
            m.weight.data = m.weight.data.to(torch.bfloat16)
            if pack:
                m._packed_weight = torch.ops.mkldnn._reorder_linear_weight(m.weight.data, None)
                m._packed_bias = None if m.bias is None else m.bias.detach().to(torch.bfloat16)
                m.forward = types.MethodType(_packed_forward, m)
    model.encoder._bf16_prepared = True
    return model


class BF16EncoderMixin:
    """forward_encoder under torch.autocast("cpu", bfloat16) when `encoder_bf16`, each model's encoder
    prepared on first use (prepare_encoder); its outputs back in float32."""

    encoder_bf16 = False

    def forward_encoder(self, net_input):
        if not self.encoder_bf16:
            return super().forward_encoder(net_input)
        for model in self.models:
            prepare_encoder(model)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outs = super().forward_encoder(net_input)
        return [{k: [t.float() if torch.is_tensor(t) and t.dtype == torch.bfloat16 else t for t in v]
                 for k, v in out.items()} for out in outs]
