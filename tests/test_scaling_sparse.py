"""Scaling Transformer layers (Jaszczur et al. 2021 §3) against plain references, on odd shapes.
The archs themselves (train, incremental == full, resume, bad flags) are in the shared matrix."""
import os
import sys

import pytest
import torch
import torch.nn.functional as F

from fairseq_ext.modules.multiplicative import (ModuleConv, MultiplicativeDense, SparseOutputProjection,
                                                SparseQKVAttention)
from fairseq_ext.modules.sparse_feedforward import SparseFeedForward, check_block_size


def _reference_sparse_ffn(ffn, x):
    """§3.1 written out: argmax per block of x·C1·C2 + c, ReLU(x·W1) masked, times W2, plus b2."""
    f1, f2 = ffn.fc1, ffn.fc2
    logits = x @ f1.controller1.T @ f1.controller2.T + f1.controller_bias
    n, N = x.shape[0], f1.block_size
    choice = logits.view(n, -1, N).argmax(-1)
    mask = torch.zeros(n, f1.num_blocks, N, dtype=x.dtype)
    mask.scatter_(2, choice.unsqueeze(-1), 1.0)
    return torch.relu(x @ f1.weight.T) * mask.view(n, -1) @ f2.weight + f2.bias


@pytest.mark.parametrize("d,d_ff,block,tokens", [(24, 96, 8, 1), (40, 120, 12, 7), (64, 192, 32, 33),
                                                 (96, 96, 96, 5)])
def test_sparse_ffn_eval_dense_and_gather_equal_the_reference(d, d_ff, block, tokens):
    torch.manual_seed(d + tokens)
    ffn = SparseFeedForward(d, d_ff, block).double().eval()
    x = torch.randn(tokens, d, dtype=torch.float64)
    ref = _reference_sparse_ffn(ffn, x)
    outs = {}
    for mode in ("dense", "gather", "auto"):
        ffn.mode = mode
        outs[mode] = ffn(x.view(tokens, 1, d)).view(tokens, d)  # (T, B, C) like fairseq
        assert ffn.fc1._pending is None  # fc2 consumed the gathered choices
        torch.testing.assert_close(outs[mode], ref, rtol=1e-10, atol=1e-10)
    # float32: the two paths agree within float32 rounding
    ffn32 = ffn.float()
    x32 = x.float()
    ffn32.mode = "dense"
    dense = ffn32(x32)
    ffn32.mode = "gather"
    torch.testing.assert_close(ffn32(x32), dense, rtol=1e-5, atol=1e-5)


def test_sparse_ffn_reads_only_chosen_rows_in_gather_mode():
    """Poison every unchosen row of W1 and W2 with NaN: the gather path must not read them."""
    torch.manual_seed(0)
    ffn = SparseFeedForward(40, 160, 16).eval()
    x = torch.randn(3, 40)
    ffn.mode = "dense"
    expect = ffn(x)
    idx = ffn.fc1.choose(x) + torch.arange(ffn.fc1.num_blocks) * 16
    keep = torch.zeros(160, dtype=torch.bool)
    keep[idx.view(-1)] = True
    with torch.no_grad():
        ffn.fc1.weight[~keep] = float("nan")
        ffn.fc2.weight[~keep] = float("nan")
    ffn.mode = "gather"
    torch.testing.assert_close(ffn(x), expect)


def test_controller_choices_are_deterministic_in_eval():
    torch.manual_seed(1)
    ffn = SparseFeedForward(24, 96, 8).double().eval()
    x = torch.randn(11, 24, dtype=torch.float64)
    first = ffn.fc1.choose(x)
    assert torch.equal(first, ffn.fc1.choose(x))
    # a token's choice does not depend on the other tokens of the batch
    assert torch.equal(torch.cat([ffn.fc1.choose(x[i:i + 1]) for i in range(11)]), first)
    assert torch.equal(ffn(x), ffn(x))


@pytest.mark.parametrize("quant_prob", [1.0, 0.0])
def test_straight_through_gradients_reach_the_controller(quant_prob):
    torch.manual_seed(2)
    ffn = SparseFeedForward(24, 96, 8, quant_prob=quant_prob).train()
    x = torch.randn(13, 24)
    h = ffn.fc1(x)
    per_block = (h.view(13, -1, 8) != 0).sum(-1)
    if quant_prob == 1.0:  # forward: the one-hot mask, at most one active unit per block
        assert per_block.max() <= 1
    else:  # the softmax mask: every positive ReLU unit contributes
        assert per_block.max() > 1
    ffn.fc2(h).pow(2).sum().backward()
    for p in (ffn.fc1.controller1, ffn.fc1.controller2, ffn.fc1.controller_bias, ffn.fc1.weight):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0


def test_straight_through_gradient_is_the_softmax_gradient():
    """Straight-through: the gradient w.r.t. the controller logits is the one of the soft mask."""
    torch.manual_seed(3)
    ffn = SparseFeedForward(16, 32, 4, quant_prob=1.0, temperature=0.0).train()
    x = torch.randn(5, 16)
    ffn.fc2(ffn.fc1(x)).sum().backward()
    grad_st = ffn.fc1.controller_bias.grad.clone()
    ffn.zero_grad()
    # the same computation with the mask made soft explicitly
    f1 = ffn.fc1
    soft = F.softmax(f1.controller_logits(x), -1).view(5, -1)
    (torch.relu(x @ f1.weight.T) * soft @ ffn.fc2.weight + ffn.fc2.bias).sum().backward()
    torch.testing.assert_close(grad_st, f1.controller_bias.grad)


def test_block_size_must_divide_the_width():
    with pytest.raises(ValueError, match="must divide the FFN width"):
        SparseFeedForward(16, 100, 8)
    check_block_size(96, 8)


def test_multiplicative_layer_represents_any_permutation():
    """Theorem 1: for a bijection f: i -> (s, m) there are D, E with y[f(i)] = x_i."""
    torch.manual_seed(4)
    for d, s in [(12, 3), (64, 8), (40, 5)]:
        m = d // s
        layer = MultiplicativeDense(d, s, m)
        perm = torch.randperm(d)  # f(i) = (perm[i] // M, perm[i] % M)
        with torch.no_grad():
            layer.D.zero_(), layer.E.zero_()
            layer.D[torch.arange(d), perm // m] = 1.0
            layer.E[torch.arange(d), perm % m] = 1.0
        x = torch.randn(7, d)
        y = layer(x).reshape(7, d)
        assert torch.equal(y[:, perm], x)


def test_multiplicative_layer_matches_its_formula_and_parameter_count():
    torch.manual_seed(5)
    layer = MultiplicativeDense(20, 4, 5).double()
    x = torch.randn(3, 20, dtype=torch.float64)
    expect = torch.einsum("bi,is,im->bsm", x, layer.D, layer.E)
    torch.testing.assert_close(layer(x), expect)
    assert sum(p.numel() for p in layer.parameters()) == 20 * 4 + 20 * 5  # d·S + d·M (§3.2)


def test_decoding_caches_follow_optimizer_updates():
    """The eval-time W of the multiplicative layer and the conv's patch matrix are recomputed after a
    training step although fairseq's optimizers write through .data (no version bump), also when a
    train-mode forward without autograd (a reversible layer's) ran before the step."""
    torch.manual_seed(6)
    layer, conv = MultiplicativeDense(12, 3, 4).double(), ModuleConv(4, 3, 3).double().eval()
    x, window = torch.randn(5, 12, dtype=torch.float64), torch.randn(3, 2, 3, 4, dtype=torch.float64)
    for _ in range(2):
        with torch.no_grad():
            layer.eval(), layer(x), conv.eval(), conv.last_step(window)  # fills the caches
            layer.train(), layer(x), conv.train()  # train mode, no autograd
        for p in list(layer.parameters()) + list(conv.parameters()):
            p.data.add_(torch.randn_like(p))  # what fairseq's Adam does
        layer.eval(), conv.eval()
        with torch.no_grad():
            torch.testing.assert_close(layer(x), torch.einsum("bi,is,im->bsm", x, layer.D, layer.E))
            torch.testing.assert_close(conv.last_step(window), conv(window)[-1:])


def test_convolution_parameter_count_and_causality():
    conv = ModuleConv(16, 3, 3, causal=True)
    assert sum(p.numel() for p in conv.parameters()) == 9 * 16 * 16 + 16  # 9M² + M (§3.2)
    x = torch.randn(7, 2, 5, 16)
    y = conv(x)
    x2 = x.clone()
    x2[4:] = torch.randn(3, 2, 5, 16)
    torch.testing.assert_close(conv(x2)[:4], y[:4])  # steps < 4 never see steps >= 4
    # decoding step by step with the last F−1 inputs as state equals the full convolution
    steps = [conv(x[t:t + 1], x[max(0, t - 2):t] if t >= 2 else torch.cat(
        [torch.zeros(2 - t, 2, 5, 16), x[:t]])) for t in range(7)]
    torch.testing.assert_close(torch.cat(steps), y)


@pytest.mark.parametrize("causal", [False, True])
def test_sparse_qkv_self_attention_padded_batch_equals_single_sentences(causal):
    """Left-padded batch (fairseq's sources) == each sentence alone, for the encoder (centred conv)."""
    torch.manual_seed(6)
    attn = SparseQKVAttention(24, 3, 6, length_kernel=3, module_kernel=3, causal=causal).double().eval()
    lengths = [5, 2, 7]
    t = max(lengths)
    x = torch.randn(t, 3, 24, dtype=torch.float64)
    pad = torch.zeros(3, t, dtype=torch.bool)
    for b, n in enumerate(lengths):
        pad[b, : t - n] = True
    mask = None
    if causal:  # right-padded like fairseq's targets
        pad = pad.flip(1)
        mask = torch.triu(torch.full((t, t), float("-inf"), dtype=torch.float64), 1)
    out, _ = attn(x, x, x, key_padding_mask=pad, attn_mask=mask, need_weights=False)
    for b, n in enumerate(lengths):
        keep = ~pad[b]
        xb = x[keep, b:b + 1]
        mb = None if mask is None else mask[:n, :n]
        alone, _ = attn(xb, xb, xb, attn_mask=mb, need_weights=False)
        torch.testing.assert_close(out[keep, b], alone[:, 0])


def test_sparse_qkv_cross_attention_decodes_like_the_full_forward():
    torch.manual_seed(7)
    attn = SparseQKVAttention(32, 4, 4, causal=True, encoder_decoder_attention=True).eval()
    enc = torch.randn(6, 2, 32)
    enc_pad = torch.tensor([[True, True, False, False, False, False], [False] * 6])
    x = torch.randn(5, 2, 32)
    full, w = attn(x, enc, enc, key_padding_mask=enc_pad, static_kv=True, need_weights=True)
    assert w.shape == (2, 5, 6) and torch.all(w[0, :, :2] == 0)
    state = {}
    steps = [attn(x[t:t + 1], enc, enc, key_padding_mask=enc_pad, incremental_state=state, static_kv=True)[0]
             for t in range(5)]
    torch.testing.assert_close(torch.cat(steps), full, rtol=1e-5, atol=1e-6)


def test_sparse_output_projection():
    layer = SparseOutputProjection(16, 40, 4)
    assert layer(torch.randn(3, 2, 16)).shape == (3, 2, 40)
    assert sum(p.numel() for p in layer.parameters()) == 16 * 4 + 16 * 10
    with pytest.raises(ValueError, match="--sparse-loss 3: the output vocabulary"):
        SparseOutputProjection(16, 40, 3)


def test_full_size_parameter_counts_match_the_dense_model():
    """Paper §3.2: with sparse QKV, d_ff is raised so the model keeps the dense model's size."""
    from fairseq_ext.tools.params import build_model, count_parameters

    dense = count_parameters(build_model("transformer_wmt_en_de_big", 32000))
    for arch in ("scaling_sparse", "scaling_sparse_qkv"):
        n = count_parameters(build_model(arch, 32000))
        assert abs(n / dense - 1) < 0.002, (arch, n, dense)
    model = build_model("one_wide_sparse_ffn_big", 32000)
    ffns = {id(layer.fc1) for layer in model.encoder.layers}
    assert len(ffns) == 1 and not any(hasattr(layer, "fc1") for layer in model.decoder.layers)
    fc1 = model.encoder.layers[0].fc1
    assert (fc1.out_features, fc1.num_blocks, fc1.lowrank_dim) == (49152, 768, 64)


def test_gather_path_gives_the_models_dense_outputs(tiny_data):
    """The whole model with every sparse FFN forced to the gather path equals the dense eval path."""
    from matrix import build, fixed_batch
    from fairseq_ext.modules.sparse_feedforward import SparseFFNInput

    for arch in ("scaling_sparse_tiny", "one_wide_sparse_ffn_tiny"):
        _, task, model, _ = build(tiny_data, arch)
        model.eval()
        sample = fixed_batch(task, n=4)
        fc1s = [m for m in model.modules() if isinstance(m, SparseFFNInput)]
        assert fc1s
        outs = []
        for mode in ("dense", "gather"):
            for m in fc1s:
                m.mode = mode
            with torch.no_grad():
                outs.append(model(**sample["net_input"])[0])
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


def test_decode_roofline_counts_only_gathered_rows():
    from conftest import REPO
    from fairseq_ext.tools.params import build_model

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from decode_speed import bytes_per_step

    model = build_model("scaling_sparse_ff", 32000, ["--encoder-layers", "1", "--decoder-layers", "1"])
    fc1 = model.decoder.layers[0].fc1
    assert fc1.use_gather(1) and fc1.use_gather(16) and not fc1.use_gather(17)
    # the compiled op: up to N tokens; on a CPU any number for N >= 32 (N = 64 here), on CUDA up to N
    assert fc1.use_gather(64, kernel=True, device_type="cuda") and not fc1.use_gather(65, kernel=True, device_type="cuda")
    assert fc1.use_gather(5000, kernel=True, device_type="cpu")
    fc1.block_size = 16
    assert fc1.use_gather(16, kernel=True) and not fc1.use_gather(17, kernel=True)
    fc1.block_size = 64
    sparse = bytes_per_step(model, 1, 1, 20, 20)
    fc1.mode = "dense"
    dense = bytes_per_step(model, 1, 1, 20, 20)
    assert dense - sparse == 4 * 2 * (4096 - 64) * 1024  # 64 of 4,096 rows of W1 and W2 (fp32)


def test_block_size_message_suggests_distinct_widths():
    """N not dividing the width: the hint names the multiples of N either side of it, each once."""
    from fairseq_ext.modules.sparse_feedforward import check_block_size

    with pytest.raises(ValueError, match=r"\(e\.g\. 128\)") as small:
        check_block_size(100, 128)
    assert "128 or 128" not in str(small.value)
    with pytest.raises(ValueError, match=r"\(e\.g\. 256 or 320\)"):
        check_block_size(300, 64)


def test_sparse_qkv_scope_decoder_self_is_trax_placement():
    """--sparse-qkv-scope decoder-self: only the decoder's causal self-attention is sparse QKV; encoder
    self-attention and cross-attention stay fairseq's dense attention (trax's encoder-decoder placement);
    the default (all) replaces every attention."""
    from fairseq.modules import MultiheadAttention

    from fairseq_ext.modules.multiplicative import SparseQKVAttention
    from fairseq_ext.tools.params import build_model

    flags = ["--sparse-qkv-modules", "4", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64"]
    every = build_model("scaling_sparse_qkv_tiny", 1000, flags + ["--sparse-qkv-scope", "all"], device="cpu")
    dec = build_model("scaling_sparse_qkv_tiny", 1000, flags, device="cpu")
    for model, enc_type, cross_type in ((every, SparseQKVAttention, SparseQKVAttention),
                                        (dec, MultiheadAttention, MultiheadAttention)):
        assert all(type(l.self_attn) is enc_type for l in model.encoder.layers)
        assert all(type(l.self_attn) is SparseQKVAttention for l in model.decoder.layers)
        assert all(type(l.encoder_attn) is cross_type for l in model.decoder.layers)


@pytest.mark.parametrize("d,s,rows", [(12, 3, 1), (20, 4, 7), (24, 6, 64), (24, 6, 65)])
def test_multiplicative_layer_decodes_in_factored_form(d, s, rows):
    """An eval forward of few rows (a decoding step) computes y from D and E (d·(S+M) weights read), never
    materialising W = D⊗E (d·S·M); its result equals the W product (the training path) on odd shapes."""
    from fairseq_ext.modules.multiplicative import FACTORED_MAX_ROWS, MultiplicativeDense

    torch.manual_seed(0)
    layer = MultiplicativeDense(d, s, d // s).eval()
    x = torch.randn(rows, 1, d)
    reference = torch.matmul(x, (layer.D.unsqueeze(2) * layer.E.unsqueeze(1)).flatten(1)).unflatten(-1, (s, d // s))
    with torch.no_grad():
        y = layer(x)
    assert torch.allclose(y, reference, atol=1e-5, rtol=1e-5)
    built = "W" in layer.__dict__.get("_eval_cache", {})
    assert built == (rows > FACTORED_MAX_ROWS), f"{rows} rows: W materialised = {built}"
