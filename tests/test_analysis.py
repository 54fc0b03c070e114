"""Representational similarity (fairseq_ext.analysis): the measures' defining properties, the
activation collection (incl. shared FFNs), and the CLI on tiny trained checkpoints."""
import json

import pytest
import torch

from fairseq_ext.analysis import linear_cka, local_neighborhood_similarity
from fairseq_ext.analysis.activations import collect
from matrix import build


def _data(n=60, d=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g, dtype=torch.float64)


def test_cka_identity_orthogonal_and_scaling_invariance():
    x, y = _data(), _data(d=9, seed=1)
    q, _ = torch.linalg.qr(_data(12, 12, seed=2))
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x, 3.7 * x @ q) == pytest.approx(1.0, abs=1e-12)
    assert linear_cka(x @ q, 0.2 * y) == pytest.approx(linear_cka(x, y), abs=1e-12)
    assert linear_cka(x, y) == pytest.approx(linear_cka(y, x), abs=1e-12)
    assert linear_cka(x, y) < 0.5  # unrelated random features
    assert linear_cka(x + 5.0, x) == pytest.approx(1.0, abs=1e-12)  # centering


def test_lns_identity_scaling_and_unrelated():
    x, y = _data(), _data(seed=1)
    assert local_neighborhood_similarity(x, x, k=3) == 1.0
    assert local_neighborhood_similarity(x, 4.0 * x, k=3) == 1.0  # cosine neighbourhoods
    assert local_neighborhood_similarity(x, y, k=3) < 0.3
    with pytest.raises(ValueError, match="same sentences"):
        local_neighborhood_similarity(x, y[:10])


def test_collect_attributes_a_shared_ffn_to_each_layer(tiny_data):
    _, task, model, _ = build(tiny_data, "one_wide_ffn_shared_enc_dec_tiny")
    model.eval()
    feats = collect(model, task, "valid", max_sentences=40)
    names = set(feats)
    assert {"enc.0.ffn", "enc.1.ffn", "dec.0.ffn", "dec.1.ffn", "dec.1.ca", "enc.1.out"} <= names
    assert all(v.shape[0] == 40 for v in feats.values())
    assert not torch.allclose(feats["enc.0.ffn"], feats["enc.1.ffn"])  # one module, two call sites
    _, task, model, _ = build(tiny_data, "one_wide_ffn_tiny")
    feats = collect(model.eval(), task, "valid", max_sentences=20)
    assert not any(n.startswith("dec.") and n.endswith(".ffn") for n in feats)  # NoDec
    assert {"dec.0.out", "dec.1.out"} <= set(feats)


def test_cli_compare_and_self(trained, tiny_data, tmp_path):
    from fairseq_ext.analysis.__main__ import main

    save, _, _ = trained
    by_update = sorted(save.glob("checkpoint_*_*.pt"), key=lambda p: int(p.stem.rsplit("_", 1)[1]))
    last, early = str(save / "checkpoint_last.pt"), str(by_update[0])  # 40 vs 20 updates
    r = main(["compare", str(tiny_data / "bin"), "--a", last, "--b", early, "--benchmark-a", last,
              "--benchmark-b", last, "--out", str(tmp_path)])
    assert r["sentences"] == 100
    for name, s in r["corresponding"].items():
        assert 0 <= s["cka"] <= 1 + 1e-9 and 0 <= s["lns"] <= 1
        assert s["cka_normalised"] == pytest.approx(s["cka"])  # the benchmark pair is identical: scores 1
    assert min(s["cka"] for s in r["corresponding"].values()) < 0.999  # 20 vs 40 updates do differ
    assert (tmp_path / "cka_encoder.png").stat().st_size > 0
    r = main(["self", str(tiny_data / "bin"), "--a", last, "--out", str(tmp_path / "self")])
    m = r["self_cka_decoder"]["matrix"]
    assert all(m[i][i] == pytest.approx(1.0) for i in range(len(m)))
    assert json.loads((tmp_path / "self" / "similarity.json").read_text())["a"] == last
