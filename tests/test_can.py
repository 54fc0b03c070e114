"""The compressed-attention sub-layer against a direct, unfused implementation of Eq. 11 and 13
(per sentence, per head, per query position), with padded sources and a causal decoder side."""
import math

import pytest
import torch

from fairseq_ext.modules.compressed_attention import CompressedAttention


def _reference(m, x, h, src_pad):
    """Eq. 11 (one softmax over [encoder keys; decoder keys up to i]) and Eq. 13, in float64 loops."""
    t, b, _ = x.shape
    heads, dh, dvh = m.num_heads, m.head_dim, m.value_head_dim
    lin = lambda layer, v: v @ layer.weight.double().T + (layer.bias.double() if layer.bias is not None else 0)
    out = torch.zeros(t, b, m.embed_dim, dtype=torch.float64)
    for s in range(b):
        X, H = x[:, s].double(), h[:, s].double()
        q = lin(m.q_proj, X)
        parts_k, parts_v = [], []
        if m.encoder_attention:
            keep = ~src_pad[s]
            parts_k.append(lin(m.k_enc, H)[keep]), parts_v.append(lin(m.v_enc, H)[keep])
        ctx = torch.zeros(t, m.value_dim, dtype=torch.float64)
        for i in range(t):
            ks, vs = list(parts_k), list(parts_v)
            if m.self_attention:
                ks.append(lin(m.k_self, X[: i + 1])), vs.append(lin(m.v_self, X[: i + 1]))
            k, v = torch.cat(ks), torch.cat(vs)
            for hd in range(heads):
                qh = q[i, hd * dh:(hd + 1) * dh]
                a = torch.softmax(k[:, hd * dh:(hd + 1) * dh] @ qh / math.sqrt(dh), dim=0)  # Eq. 11
                ctx[i, hd * dvh:(hd + 1) * dvh] = a @ v[:, hd * dvh:(hd + 1) * dvh]
        if m.ffn:
            out[:, s] = lin(m.fc2, torch.relu(lin(m.fc1, X) + ctx))  # Eq. 13
        else:
            out[:, s] = lin(m.out_proj, ctx)
    return out


@pytest.mark.parametrize("mode", ["all", "attention", "ffn"])
@pytest.mark.parametrize("d,heads,dv,t,s", [(24, 3, 30, 5, 7), (40, 4, 64, 1, 3), (64, 8, 96, 6, 1)])
def test_matches_unfused_equations(mode, d, heads, dv, t, s):
    torch.manual_seed(d + t)
    kw = {"all": {}, "attention": {"ffn": False}, "ffn": {"self_attention": False}}[mode]
    m = CompressedAttention(d, heads, dv, **kw).eval()
    for p in m.parameters():  # random biases too (fairseq initialises them to 0)
        torch.nn.init.normal_(p, std=0.3)
    b = 3
    x, h = torch.randn(t, b, d), torch.randn(s, b, d)
    src_pad = torch.zeros(b, s, dtype=torch.bool)
    src_pad[1, : s // 2] = True  # left-padded sources, as fairseq batches them
    src_pad[2, : s - 1] = True
    causal = torch.triu(torch.full((t, t), float("-inf")), 1)
    with torch.no_grad():
        y = m(x, h, src_pad, self_attn_mask=causal)
        ref = _reference(m, x, h, src_pad)
        assert (y.double() - ref).abs().max().item() < 1e-4 * max(1.0, ref.abs().max().item())
        h2 = h.clone()
        h2[src_pad.t()] = 1e4  # padded encoder positions must not matter
        assert torch.equal(m(x, h2, src_pad, self_attn_mask=causal), y)


def test_incremental_steps_equal_full_and_cache_grows_by_one():
    """Each decoding step equals the full forward; the decoder cache holds one more position per step in
    a preallocated buffer that doubles when full (16, then 32 at step 17)."""
    torch.manual_seed(0)
    m = CompressedAttention(16, 2, 24).eval()
    steps = 20
    x, h = torch.randn(steps, 2, 16), torch.randn(5, 2, 16)
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[0, :2] = True
    causal = torch.triu(torch.full((steps, steps), float("-inf")), 1)
    state = {}
    with torch.no_grad():
        full = m(x, h, pad, self_attn_mask=causal)
        for i in range(steps):
            step = m(x[i:i + 1], h, pad, incremental_state=state)
            assert (step[0] - full[i]).abs().max().item() < 1e-5
            cached = m.get_incremental_state(state, "state")
            assert int(cached["self_len"][0]) == i + 1 and cached["enc_k"].size(2) == 5
            assert cached["self_kbuf"].size(2) == (16 if i < 16 else 32)


def test_fused_decoding_projection_follows_weights_and_autograd():
    """The one-token eval forward reads q, k, v and X·W1 as one concatenated matrix (kept between steps):
    it follows a write through .data after train()/eval() (what fairseq's Adam does between decodes),
    and with autograd on it is differentiable like the unfused layers (gradients reach every projection)."""
    torch.manual_seed(3)
    m = CompressedAttention(16, 2, 24).double()
    x, h = torch.randn(1, 2, 16, dtype=torch.float64), torch.randn(4, 2, 16, dtype=torch.float64)
    pad = torch.zeros(2, 4, dtype=torch.bool)
    m.eval()
    with torch.no_grad():
        m(x, h, pad)  # fills the fused matrix
    m.train()
    for p in m.parameters():
        p.data.add_(torch.randn_like(p))
    m.eval()
    y = m(x, h, pad)  # autograd on: the plain layers' products, no detached copy
    ref = _reference(m, x, h, pad)
    assert (y - ref).abs().max().item() < 1e-5 * ref.abs().max().item()  # (fairseq's softmax runs in fp32)
    with torch.no_grad():
        torch.testing.assert_close(m(x, h, pad), y.detach())
    y.sum().backward()
    for name in ("q_proj", "k_self", "v_self", "fc1"):
        grad = getattr(m, name).weight.grad
        assert grad is not None and grad.abs().sum() > 0, f"no gradient reached {name}"
