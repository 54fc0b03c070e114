"""LSH attention (fairseq_ext/modules/lsh_attention.py; Reformer §2-3, Terraformer §4): the chunked
implementation equals a dense reference that builds the same "own chunk + previous chunk of the
(bucket, position)-sorted order" mask explicitly, on odd lengths, padding and several rounds; it is
causal; decoding steps equal a dense reference of the same-bucket rule; short inputs are full attention."""
import math

import pytest
import torch
import torch.nn.functional as F

from fairseq_ext.modules.lsh_attention import MASKED, SELF_SCORE, LSHSelfAttention, hash_buckets, lsh_attention


def reference(qk, v, buckets, chunk, causal, pad):
    """Dense O(L^2) version: per round, positions are sorted by (bucket, position) with every padded position
    after every real one; key j is visible from query i when j's chunk in that order is i's chunk or the
    one before it (the first chunk has none); rounds combined by their log-sum-exp."""
    b, h, length, d = qk.shape
    n = buckets.size(2)
    pos = torch.arange(length)
    outs, lses = [], []
    for r in range(n):
        rank = torch.empty(b, h, length, dtype=torch.long)
        bk = buckets[:, :, r]
        if pad is not None:
            bk = bk.masked_fill(pad.view(b, 1, length), int(buckets.max()) + 1)
        order = (bk * length + pos).argsort(-1)
        rank.scatter_(2, order, pos.expand(b, h, -1).contiguous())
        c = rank // chunk  # (B, H, L)
        ci, cj = c.unsqueeze(-1), c.unsqueeze(-2)
        visible = (cj == ci) | (cj == ci - 1)
        scores = qk @ F.normalize(qk, dim=-1).transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(~visible, float("-inf"))
        if pad is not None:
            scores = torch.where(visible & pad.view(b, 1, 1, length), torch.full_like(scores, MASKED), scores)
        if causal:
            later = pos.view(1, -1) > pos.view(-1, 1)
            scores = torch.where(visible & later, torch.full_like(scores, MASKED), scores)
        eye = torch.eye(length, dtype=torch.bool)
        scores = torch.where(eye, torch.full_like(scores, SELF_SCORE), scores)  # self is always in its own chunk
        lse = torch.logsumexp(scores, -1, keepdim=True)
        outs.append(torch.exp(scores - lse) @ v)
        lses.append(lse)
    w = torch.softmax(torch.stack(lses), dim=0)
    return (torch.stack(outs) * w).sum(0)


@pytest.mark.parametrize("length,chunk,n_hashes,causal,padded", [
    (37, 8, 1, True, False), (37, 8, 3, True, True), (64, 16, 2, False, True), (29, 4, 2, False, False),
    (50, 7, 2, True, True)])
def test_chunked_equals_dense_reference(length, chunk, n_hashes, causal, padded):
    torch.manual_seed(length + chunk)
    b, h, d, n_buckets = 2, 3, 8, 6
    qk = torch.randn(b, h, length, d, dtype=torch.float64)
    v = torch.randn(b, h, length, d, dtype=torch.float64)
    buckets = hash_buckets(qk, torch.randn(d, n_hashes, n_buckets // 2, dtype=torch.float64))
    pad = None
    if padded:
        pad = torch.zeros(b, length, dtype=torch.bool)
        pad[0, :5] = True  # fairseq's left padding
        pad[1, -3:] = True  # right padding
    out = lsh_attention(qk, v, buckets, chunk, causal, pad)
    torch.testing.assert_close(out, reference(qk, v, buckets, chunk, causal, pad))


@pytest.mark.parametrize("causal", [True, False])
def test_a_sequence_result_does_not_depend_on_its_padding(causal):
    """The same sequence alone and inside a longer, left- or right-padded batch row: the same output at its
    positions (its real positions fill the same chunks: padding sorts after them, no wrap-around)."""
    torch.manual_seed(4)
    h, d, length, chunk = 2, 8, 23, 5
    qk = torch.randn(1, h, length, d, dtype=torch.float64)
    v = torch.randn(1, h, length, d, dtype=torch.float64)
    rot = torch.randn(d, 2, 3, dtype=torch.float64)
    alone = lsh_attention(qk, v, hash_buckets(qk, rot), chunk, causal, None)
    for left, right in ((9, 0), (0, 13), (4, 7)):
        qkp = F.pad(qk, (0, 0, left, right), value=0.3)
        vp = F.pad(v, (0, 0, left, right), value=-2.0)
        pad = torch.zeros(1, left + length + right, dtype=torch.bool)
        pad[:, :left] = True
        pad[:, left + length:] = True
        out = lsh_attention(qkp, vp, hash_buckets(qkp, rot), chunk, causal, pad)
        torch.testing.assert_close(out[:, :, left:left + length], alone)


def test_causal_lsh_does_not_read_the_future():
    torch.manual_seed(0)
    att = LSHSelfAttention(16, 2, causal=True, chunk=4, n_buckets=4, n_hashes=2).double().train()
    x = torch.randn(23, 2, 16, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(1)
    att(x)[0][11].sum().backward()
    assert x.grad[12:].abs().max() == 0 and x.grad[:12].abs().max() > 0


def test_short_inputs_take_full_attention():
    torch.manual_seed(0)
    att = LSHSelfAttention(16, 2, causal=True, chunk=32, n_buckets=4).double().eval()
    x = torch.randn(10, 3, 16, dtype=torch.float64)
    with torch.no_grad():
        out = att(x)[0]
        qk = att._heads(att.qk_proj(x))
        v = att._heads(att.v_proj(x))
        ones = torch.zeros(3, 2, 1, 10, dtype=torch.long)  # one bucket, one chunk: everything visible
        ref = reference(qk, v, ones, 10, True, None)
        torch.testing.assert_close(out, att.out_proj(ref.permute(2, 0, 1, 3).reshape(10, 3, 16)))


def test_decoding_attends_to_the_positions_sharing_a_bucket():
    torch.manual_seed(0)
    att = LSHSelfAttention(16, 2, causal=True, chunk=4, n_buckets=4, n_hashes=2).double().eval()
    x = torch.randn(14, 2, 16, dtype=torch.float64)
    state = {}
    with torch.no_grad():
        att(x[:6], incremental_state=state)  # the prefix (LSH path: 6 > one chunk)
        steps = [att(x[t:t + 1], incremental_state=state)[0] for t in range(6, 14)]
        qk, v = att._heads(att.qk_proj(x)), att._heads(att.v_proj(x))
        buckets = att._buckets(qk)  # eval: the fixed seeded rotations, as when decoding
        for t, step in zip(range(6, 14), steps):
            shared = (buckets[..., : t + 1] == buckets[..., t:t + 1]).any(dim=2)  # (B, H, t+1)
            scores = (qk[:, :, t:t + 1] @ F.normalize(qk[:, :, : t + 1], dim=-1).transpose(-1, -2)) / math.sqrt(8)
            scores = scores.masked_fill(~shared.unsqueeze(2), MASKED)
            scores[..., t] = SELF_SCORE
            ref = torch.softmax(scores, -1) @ v[:, :, : t + 1]
            torch.testing.assert_close(step, att.out_proj(ref.permute(2, 0, 1, 3).reshape(1, 2, 16)))


def test_beam_reordering_reorders_every_cache():
    torch.manual_seed(0)
    att = LSHSelfAttention(16, 2, causal=True, chunk=4, n_buckets=4).double().eval()
    x = torch.randn(9, 3, 16, dtype=torch.float64)
    order = torch.tensor([2, 0, 0])
    with torch.no_grad():
        a, b = {}, {}
        att(x[:7], incremental_state=a)
        att.reorder_incremental_state(a, order)
        att(x[:7, order], incremental_state=b)
        torch.testing.assert_close(att(x[7:8, order], incremental_state=a)[0],
                                   att(x[7:8, order], incremental_state=b)[0])
