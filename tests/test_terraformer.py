"""Terraformer (fairseq_ext/models/terraformer.py; paper §4) beyond the shared matrix: the reversible model's
gradients equal the storing model's (float64, dropout, sparse FFN choices, sparse QKV, SRU, LSH); the
concatenated decoder gives each sentence the output it gets alone, whatever the source padding side;
the SRU recurrence skips padding and decodes step by step as it runs in full."""
import pytest
import torch
from fairseq import utils

from fairseq_ext.modules.reversible import ReversibleStack
from fairseq_ext.modules.sru import SRU, LowRankRecurrence
from matrix import build, fixed_batch


def _stacks(model):
    return [m for m in model.modules() if isinstance(m, ReversibleStack)]


def _loss_and_grads(model, criterion, sample, seed):
    model.zero_grad()
    torch.manual_seed(seed)
    loss, _, _ = criterion(model, sample)
    loss.backward()
    return [loss.detach()] + [p.grad.clone() for p in model.parameters()]


# the LSH variant with chunks of 8: its training rotations are random, replayed in the recomputation
@pytest.mark.parametrize("arch,flags", [("terraformer_tiny", []), ("terraformer_dense_tiny", []),
                                        ("terraformer_lsh_tiny", ["--lsh-chunk", "8"])])
def test_reversible_gradients_equal_storing_model(arch, flags, tiny_data):
    _, task, model, criterion = build(tiny_data, arch, extra=["--dropout", "0.2", "--attention-dropout", "0.1",
                                                              "--activation-dropout", "0.1", *flags])
    model = model.double().train()
    sample = fixed_batch(task, n=6, split="train")
    assert len(_stacks(model)) == 2 and all(s.reversible for s in _stacks(model))
    rev = _loss_and_grads(model, criterion, sample, seed=11)
    for s in _stacks(model):
        s.reversible = False
    plain = _loss_and_grads(model, criterion, sample, seed=11)
    zero = [n for (n, _), g in zip(model.named_parameters(), plain[1:]) if g.abs().max() == 0]
    assert not zero, f"parameters without gradient: {zero}"
    for (name, _), a, b in zip([("loss", None)] + list(model.named_parameters()), rev, plain):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("arch", ["terraformer_tiny", "terraformer_dense_tiny"])
def test_reversible_recomputes_under_the_forward_autocast(arch, tiny_data, monkeypatch):
    """Autocast around the forward only (as fairseq's --amp on a GPU): the backward pass recomputes each swap
    in bf16 as the forward ran it, so the gradients are the storing model's up to the last bits of the
    rebuilt inputs; recomputed in fp32 (the backward runs outside the autocast region) they are off
    everywhere by bf16's rounding, which this test must tell apart."""
    import fairseq_ext.modules.reversible as rev_module

    _, task, model, criterion = build(tiny_data, arch, extra=["--dropout", "0.0"])
    model = model.train()
    sample = fixed_batch(task, n=6, split="train")

    def grads():  # the forward under autocast, the backward outside it
        model.zero_grad()
        torch.manual_seed(3)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss, _, _ = criterion(model, sample)
        loss.backward()
        return [p.grad.clone() for p in model.parameters()]

    def error(a, b):  # relative error of all gradients together
        return float(torch.cat([(x - y).flatten() for x, y in zip(a, b)]).norm()
                     / torch.cat([y.flatten() for y in b]).norm())

    rev = grads()
    for s in _stacks(model):
        s.reversible = False
    plain = grads()
    for s in _stacks(model):
        s.reversible = True
    with monkeypatch.context() as m:  # the recomputation without the forward's autocast: what must be caught
        m.setattr(rev_module, "_autocast_state", lambda x: (x.device.type, False, torch.bfloat16, True))
        fp32_recompute = grads()
    assert error(fp32_recompute, plain) > 5 * error(rev, plain), (error(rev, plain), error(fp32_recompute, plain))
    assert error(rev, plain) < 1e-3, error(rev, plain)


def _single(model, src, tgt_in, pad):
    keep = src.ne(pad)
    s = src[keep].unsqueeze(0)
    enc = model.encoder(s, src_lengths=torch.tensor([s.size(1)]))
    return model.decoder(tgt_in.unsqueeze(0), encoder_out=enc)[0][0]


@pytest.mark.parametrize("arch", ["terraformer_tiny", "terraformer_dense_tiny"])
def test_each_sentence_decodes_as_alone_for_either_padding_side(arch, tiny_data):
    _, task, model, _ = build(tiny_data, arch)
    model.eval()
    pad = task.source_dictionary.pad()
    sample = fixed_batch(task, n=5)
    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    tgt_in = sample["net_input"]["prev_output_tokens"]
    assert src[:, 0].eq(pad).any(), "fairseq pads sources on the left: the batch must have padding"
    right = utils.convert_padding_direction(src, pad, left_to_right=True)
    with torch.no_grad():
        outs = [model.decoder(tgt_in, encoder_out=model.encoder(s, src_lengths=lengths))[0] for s in (src, right)]
        torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)
        for i in range(src.size(0)):
            n = int(tgt_in[i].ne(pad).sum())  # the real target positions of row i
            alone = _single(model, src[i], tgt_in[i, :n], pad)
            torch.testing.assert_close(outs[0][i, :n], alone, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", [(1, 1, 1), (7, 3, 5), (33, 2, 9)])
def test_linear_recurrence_matches_autograd_through_the_loop(shape):
    """The SRU's c_t = f_t ⊙ c_{t-1} + u_t with its written-out backward (modules/sru.py) against the plain
    loop under autograd (the reference), float64, odd shapes; gradcheck; bf16 inputs run in fp32."""
    from fairseq_ext.modules.sru import _LinearRecurrence, linear_recurrence

    torch.manual_seed(len(shape) + shape[0])
    t, b, d = shape
    f = torch.rand(t, b, d, dtype=torch.float64, requires_grad=True)
    u = torch.randn(t, b, d, dtype=torch.float64, requires_grad=True)
    c0 = torch.randn(b, d, dtype=torch.float64, requires_grad=True)
    c, ref = c0, []
    for i in range(t):
        c = f[i] * c + u[i]
        ref.append(c)
    ref = torch.stack(ref)
    out = linear_recurrence(f, u, c0)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn_like(ref)
    grads = torch.autograd.grad((out * w).sum(), (f, u, c0))
    ref_grads = torch.autograd.grad((ref * w).sum(), (f, u, c0))
    for a, e in zip(grads, ref_grads):
        torch.testing.assert_close(a, e, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(_LinearRecurrence.apply, (f, u, c0))
    low = linear_recurrence(f.detach().bfloat16(), u.detach().bfloat16(), c0.detach().bfloat16())
    assert low.dtype == torch.float32


def test_sru_skips_padding_and_steps_like_the_full_run():
    torch.manual_seed(0)
    rec = LowRankRecurrence(12, rank=5, layers=2).double().eval()
    t, b = 9, 3
    x = torch.randn(t, b, 12, dtype=torch.float64)
    pad = torch.zeros(b, t, dtype=torch.bool)
    pad[0, :3] = True  # leading padding
    pad[1, 4:6] = True  # padding in the middle
    with torch.no_grad():
        full = rec(x, pad)
        for i in range(b):
            keep = ~pad[i]
            alone = rec(x[keep, i:i + 1], None)[:, 0]
            torch.testing.assert_close(full[keep, i], alone)
        state = {}
        steps = torch.cat([rec(x[j:j + 1], pad[:, j:j + 1], incremental_state=state) for j in range(t)])
        torch.testing.assert_close(steps, full)


def test_sru_is_causal_and_has_the_sqrt3_highway():
    torch.manual_seed(1)
    sru = SRU(4).double()
    x = torch.randn(6, 2, 4, dtype=torch.float64, requires_grad=True)
    sru(x)[2].sum().backward()
    assert x.grad[3:].abs().max() == 0 and x.grad[:3].abs().max() > 0
    with torch.no_grad():  # r -> 0: h = x·√3 (trax's highway scaling)
        sru.proj.bias[8:] = -1e4
        torch.testing.assert_close(sru(x), x * 3 ** 0.5)


def test_position_offsets_shift_training_positions_only(tiny_data):
    """--position-offset-max (trax's random position offsets): in training a batch's sinusoidal positions start
    at one offset in [0, M) for every sentence, padding untouched, with the given share of batches; evaluation
    and incremental decoding count from 0; a model without the flag is unchanged."""
    from fairseq.modules import SinusoidalPositionalEmbedding

    _, task, model, _ = build(tiny_data, "terraformer_tiny", extra=["--position-offset-max", "40",
                                                                    "--position-offset-prob", "1"])
    _, _, plain, _ = build(tiny_data, "terraformer_tiny")
    embed, pad = model.encoder.embed, task.source_dictionary.pad()
    for side in (model.encoder, model.decoder):  # encoder and decoder inputs, each its own draws
        assert (side.embed.offset_max, side.embed.offset_prob) == (40, 1.0)
        assert side.embed.embed_positions.weights.size(0) >= pad + 1 + side.max_positions() + 40
    assert plain.encoder.embed.offset_max == plain.decoder.embed.offset_max == 0
    src = fixed_batch(task, n=5)["net_input"]["src_tokens"]
    assert src.eq(pad).any()
    ref = embed.embed_positions
    table = SinusoidalPositionalEmbedding.get_embedding(pad + 1 + src.size(1) + 40, ref.embedding_dim, pad)
    positions = utils.make_positions(src, pad)

    def shifted(start):  # the positions' sinusoids counted from `start`, zeros at padding
        return table[positions + start * src.ne(pad).long()]

    assert table[pad].abs().max() == 0

    embed.eval()
    torch.testing.assert_close(embed.embed_positions(src), shifted(0))
    embed.train()
    x = embed.embed_tokens(src) * embed.embed_scale
    for prob in (1.0, 0.3, 0.0):  # the share of shifted batches (an offset of 0 leaves one unshifted)
        embed.offset_prob = prob
        starts = []
        for seed in range(100):
            torch.manual_seed(seed)
            out = embed(src).transpose(0, 1)  # dropout 0 in the matrix's args
            match = [k for k in range(40) if torch.allclose(out, x + shifted(k), atol=1e-5)]
            assert len(match) == 1, (prob, seed, match)  # one offset in [0, 40) for the whole batch
            starts.append(match[0])
        shifts = sum(k > 0 for k in starts)
        assert abs(shifts - 100 * prob * 39 / 40) <= 15, (prob, shifts)
        assert (shifts == 0) == (prob == 0.0) and (prob < 1 or len(set(starts)) > 20)
    far = embed.offset_positions(src, 5000)  # past the table: it grows
    assert embed.embed_positions.weights.size(0) >= pad + 1 + src.size(1) + 5000
    torch.testing.assert_close(far, SinusoidalPositionalEmbedding.get_embedding(
        pad + 1 + src.size(1) + 5000, ref.embedding_dim, pad)[positions + 5000 * src.ne(pad).long()])
    embed.offset_prob = 1.0
    torch.manual_seed(0)  # a step of incremental decoding in training mode: its position from the length
    step = embed(src, incremental_state={}).transpose(0, 1)
    torch.testing.assert_close(step, x[:, -1:] + embed.embed_positions(src, incremental_state={}))
    embed.eval()
    torch.testing.assert_close(embed(src).transpose(0, 1), x + shifted(0))


@pytest.mark.parametrize("flags,message", [
    (["--position-offset-prob", "0.5"], "--position-offset-prob 0.5 does nothing without --position-offset-max"),
    (["--position-offset-max", "30", "--no-token-positional-embeddings"], "drop --no-token-positional-embeddings"),
    (["--position-offset-max", "30", "--encoder-learned-pos"], "drop --encoder-learned-pos"),
    (["--position-offset-max", "30", "--position-offset-prob", "1.5"], "--position-offset-prob 1.5")])
def test_position_offset_flags_are_checked(flags, message, tiny_data):
    with pytest.raises(ValueError, match=message):
        build(tiny_data, "terraformer_tiny", extra=flags)
