"""Shaped attention and the simplified blocks (He & Hofmann 2024) at the module level; the archs
themselves (train, incremental == full, resume, bad flags) are in the shared matrix."""
import pytest
import torch

from fairseq_ext.modules.shaped_attention import ShapedAttention, SimplifiedBlock


def _matrix(attn, x, pad=None):
    q, k = attn._heads(attn.q_proj(x)), attn._heads(attn.k_proj(x))
    return attn.attention_matrix(q, k, pad, 0)


def _left_padded(lengths, d, dtype=torch.float64):
    t = max(lengths)
    x = torch.randn(t, len(lengths), d, dtype=dtype)
    pad = torch.zeros(len(lengths), t, dtype=torch.bool)
    for b, n in enumerate(lengths):
        pad[b, : t - n] = True
    return x, pad


@pytest.mark.parametrize("causal", [True, False])
def test_shaped_attention_is_the_identity_at_initialisation(causal):
    torch.manual_seed(0)
    attn = ShapedAttention(24, 3, causal=causal).double()
    x, pad = _left_padded([5, 3, 7], 24)
    if causal:
        pad = pad.flip(1)  # fairseq's targets are right-padded
    a = _matrix(attn, x, pad)  # (B, H, T, S)
    eye = torch.eye(x.size(0), dtype=torch.float64).expand_as(a)
    real = ~pad  # rows of real tokens
    torch.testing.assert_close(a[real.unsqueeze(1).expand(-1, 3, -1)], eye[real.unsqueeze(1).expand(-1, 3, -1)])
    out, _ = attn(x, key_padding_mask=pad)
    torch.testing.assert_close(out[real.t()], x[real.t()])  # the attention path is an identity map


@pytest.mark.parametrize("causal", [True, False])
def test_rows_sum_to_alpha_plus_beta_minus_gamma(causal):
    torch.manual_seed(1)
    attn = ShapedAttention(32, 4, causal=causal).double()
    with torch.no_grad():
        attn.q_proj.weight.normal_()
        attn.alpha.uniform_(0.5, 2), attn.beta.uniform_(0.5, 2), attn.gamma.uniform_(0.0, 1)
    x, pad = _left_padded([6, 2, 4], 32)
    a = _matrix(attn, x, pad)
    expect = (attn.alpha + attn.beta - attn.gamma).view(1, 4, 1).expand(3, 4, x.size(0))
    rows = a.sum(-1)
    real = (~pad).unsqueeze(1).expand(-1, 4, -1)  # rows of real tokens
    torch.testing.assert_close(rows[real], expect[real])
    # the causal part C: row i uniform over its i+1 first keys (no padding)
    if causal:
        attn0 = ShapedAttention(8, 1, causal=True).double()
        with torch.no_grad():
            attn0.alpha.zero_(), attn0.beta.zero_(), attn0.gamma.fill_(-1.0)  # A = C
        c = _matrix(attn0, torch.randn(4, 1, 8, dtype=torch.float64))[0, 0]
        expect_c = torch.tril(torch.ones(4, 4, dtype=torch.float64)) / torch.arange(1, 5).view(4, 1)
        torch.testing.assert_close(c, expect_c)


def test_non_causal_padded_batch_equals_each_sentence_alone():
    torch.manual_seed(2)
    block = SimplifiedBlock(24, 3, 48, parallel=True, causal=False, value_matrix=True).double().eval()
    with torch.no_grad():
        for p in block.parameters():  # away from the initial identity
            p.add_(0.1 * torch.randn_like(p))
    x, pad = _left_padded([5, 2, 7], 24)
    out, _ = block(x, key_padding_mask=pad)
    for b in range(3):
        keep = ~pad[b]
        alone, _ = block(x[keep, b:b + 1])
        torch.testing.assert_close(out[keep, b], alone[:, 0])


def test_incremental_identity_uses_absolute_positions():
    """Decoding with a cache: the identity term hits the query's own (absolute) position."""
    torch.manual_seed(3)
    attn = ShapedAttention(16, 2, causal=True).double().eval()
    with torch.no_grad():
        attn.q_proj.weight.normal_()
        attn.alpha.fill_(3.0)
    x = torch.randn(6, 2, 16, dtype=torch.float64)
    full, _ = attn(x)
    state = {}
    steps = [attn(x[t:t + 1], incremental_state=state)[0] for t in range(6)]
    torch.testing.assert_close(torch.cat(steps), full)


def test_sas_block_shapes_and_beta_ff():
    block = SimplifiedBlock(16, 2, 32, parallel=False, causal=True)
    assert block.beta_ff.item() == pytest.approx(0.1)
    assert not any(m.bias is not None for m in (block.fc1, block.fc2))  # bias-free MLP
    with pytest.raises(ValueError, match="no place for cross-attention"):
        SimplifiedBlock(16, 2, 32, parallel=True, causal=True, cross_attention=torch.nn.Identity())


def test_lm_parameter_counts_against_pre_ln():
    """No values/projections: ~15% fewer parameters than Pre-LN at the paper's size (rebuttal)."""
    from fairseq_ext.tools.params import build_model, count_parameters

    pre = count_parameters(build_model("preln_lm", 32000))
    for arch in ("sas_lm", "sas_p_lm", "sas_p_nonorm_lm"):
        n = count_parameters(build_model(arch, 32000))
        assert 0.10 < 1 - n / pre < 0.20, (arch, n, pre)
    # 18 layers x (W_Q, W_K, MLP) + first-layer W_V - nothing else of size d x d
    model = build_model("sas_lm", 32000)
    assert len(model.decoder.layers) == 18
    assert sum(1 for n, _ in model.named_parameters() if n.endswith("attn.value")) == 1


def test_no_weight_decay_on_gains_norms_and_biases(tiny_data):
    from fairseq.trainer import Trainer
    from matrix import build

    cfg, task, model, criterion = build(tiny_data, "sas_lm_tiny",
                                         extra=["--optimizer", "adam_no_decay_gains", "--weight-decay", "0.1"])
    trainer = Trainer(cfg, task, model, criterion)
    groups = trainer.optimizer.optimizer.param_groups
    by_id = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    names = dict(model.named_parameters())
    for name, p in names.items():
        expect = 0.1 if p.dim() >= 2 else 0.0
        assert by_id[id(p)] == expect, name
    assert any(n.endswith(("alpha", "beta", "gamma", "beta_ff")) for n in names)


@pytest.mark.parametrize("causal", [True, False])
def test_forward_equals_the_explicit_attention_matrix_times_values(causal):
    """forward computes α·V + β·P·V − γ·C·V (running means) without forming A: same numbers."""
    torch.manual_seed(4)
    attn = ShapedAttention(24, 3, causal=causal, value_matrix=True).double()
    with torch.no_grad():
        for p in attn.parameters():
            p.add_(0.3 * torch.randn_like(p))
    x, pad = _left_padded([6, 3, 4], 24)
    if causal:
        pad = pad.flip(1)
    out, _ = attn(x, key_padding_mask=pad)
    q, k = attn._heads(attn.q_proj(x)), attn._heads(attn.k_proj(x))
    v = attn._heads(x + x @ attn.value)
    expect = torch.matmul(attn.attention_matrix(q, k, pad, 0), v).permute(2, 0, 1, 3).reshape(x.shape)
    real = (~pad).t()
    torch.testing.assert_close(out[real], expect[real])
