"""Smoke test of the benchmark harness (quick mode, tiny archs): the JSON it writes and that its
ratios come from interleaved rounds. No timing is asserted."""
import json
import os
import statistics
import sys

import pytest
import torch

from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import common  # noqa: E402
import decode_speed  # noqa: E402
import run_presets  # noqa: E402
import train_speed  # noqa: E402

TINY = ["transformer_tiny", "transformer_balanced_tiny"]


def _check_interleaved(order, names, repeats):
    assert len(order) == len(names) * repeats
    rounds = [order[i * len(names):(i + 1) * len(names)] for i in range(repeats)]
    assert all(sorted(r) == sorted(names) for r in rounds), order  # every round runs every model once
    assert rounds[0] != rounds[1], "rounds must alternate which model goes first"


def _check_ratios(ratio, base_seconds, cand_seconds):
    expect = [b / c for b, c in zip(base_seconds, cand_seconds)]
    assert ratio["per_round"] == pytest.approx(expect)
    assert ratio["median"] == pytest.approx(statistics.median(expect))
    assert ratio["min"] <= ratio["median"] <= ratio["max"]


def test_decode_speed_quick(tmp_path):
    decode_speed.main(["--baseline", TINY[0], "--candidates", TINY[1], "not_an_arch", "--quick",
                       "--vocab", "500", "--batch-sizes", "1,3", "--out-dir", str(tmp_path), "--name", "d"])
    r = json.loads((tmp_path / "d.json").read_text())
    assert (tmp_path / "d.png").stat().st_size > 0 and (tmp_path / "d.md").exists()
    assert r["kind"] == "decode" and r["baseline"] == TINY[0] and set(r["models"]) == set(TINY)
    assert r["bandwidth_gb_s"] > 0 and r["machine"]["threads"] >= 1
    for bsz in ("1", "3"):
        _check_interleaved(r["run_order"][bsz], TINY, r["settings"]["repeats"])
        for name in TINY:
            m = r["models"][name]["results"][bsz]
            assert len(m["seconds"]) == r["settings"]["repeats"]
            assert m["tokens_per_s"]["median"] > 0 and m["roofline_pct"] > 0
            assert m["flops_per_step"] == pytest.approx(int(bsz) * r["models"][name]["results"]["1"]["flops_per_step"])
            assert r["models"][name]["params"] > 0
        _check_ratios(r["ratios"][bsz][TINY[1]], r["models"][TINY[0]]["results"][bsz]["seconds"],
                      r["models"][TINY[1]]["results"][bsz]["seconds"])


def test_flops_per_step_is_a_transformers_arithmetic():
    """The counted FLOPs of a step are a stock Transformer's products, worked out by hand: every decoder
    projection and the output projection per hypothesis, attention over the self-attention cache (averaged
    over the steps) and the source, and once per sentence, spread over the steps, the encoder and the
    cross-attention's keys and values (once per sentence, not per beam row)."""
    model, task = common.build_model(TINY[0], 500)
    beam, src, tgt, bsz = 3, 9, 6, 2
    steps, rows = tgt + 1, bsz * beam
    enc, dec = model.encoder.layers, model.decoder.layers
    d, ffn, vocab = dec[0].embed_dim, dec[0].fc1.out_features, len(task.target_dictionary)
    per_row = len(dec) * (6 * d * d + 2 * d * ffn) + vocab * d  # q, k, v, out; cross q, out; FFN; output
    attention = len(dec) * 2 * d * ((tgt + 2) / 2 + src)  # scores and weighted sum, self + cross
    per_sentence = len(enc) * src * (4 * d * d + 2 * d * ffn) + len(enc) * 2 * src * src * d \
        + len(dec) * src * 2 * d * d  # encoder products, encoder attention, cross-attention keys and values
    expect = 2 * (rows * (per_row + attention) + bsz * per_sentence / steps)
    assert decode_speed.flops_per_step(model, task, bsz, beam, src, tgt) == pytest.approx(expect, rel=1e-9)


def test_flop_count_refuses_ops_it_cannot_see():
    """A kernel of this package inside the count would add no FLOPs: the count stops instead."""
    if not hasattr(torch.ops.fairseq_ext, "few_rows_linear"):
        pytest.skip("the extension is not built: its ops cannot run")
    x, w = torch.randn(3, 8), torch.randn(5, 8)
    with pytest.raises(RuntimeError, match="few_rows_linear.*counter does not see"):
        with decode_speed._UncountedOpsRefused():
            torch.ops.fairseq_ext.few_rows_linear(x, w, None)


def test_train_speed_quick(tmp_path):
    train_speed.main(["--baseline", TINY[0], "--candidates", TINY[1], "--quick", "--vocab", "500",
                      "--out-dir", str(tmp_path), "--name", "t"])
    r = json.loads((tmp_path / "t.json").read_text())
    assert r["kind"] == "train" and set(r["models"]) == set(TINY)
    _check_interleaved(r["run_order"], TINY, r["settings"]["repeats"])
    _check_ratios(r["ratios"][TINY[1]], r["models"][TINY[0]]["seconds"], r["models"][TINY[1]]["seconds"])


def test_train_speed_language_models(tmp_path):
    """LM archs train on next-token blocks (the simplified-blocks comparison)."""
    lms = ["preln_lm_tiny", "sas_p_lm_tiny"]
    train_speed.main(["--baseline", lms[0], "--candidates", lms[1], "--quick", "--vocab", "500",
                      "--out-dir", str(tmp_path), "--name", "lm"])
    r = json.loads((tmp_path / "lm.json").read_text())
    assert set(r["models"]) == set(lms) and r["models"][lms[1]]["params"] < r["models"][lms[0]]["params"]


def test_model_specs_pass_flags(tmp_path):
    """ARCH@FLAGS builds the arch with those model flags (the reversible-memory comparison)."""
    specs = ["terraformer_dense_tiny@--no-reversible", "terraformer_dense_tiny@--sru-dim 0 --decoder-layers 1"]
    train_speed.main(["--baseline", specs[0], "--candidates", specs[1], "--quick", "--vocab", "500",
                      "--out-dir", str(tmp_path), "--name", "spec"])
    r = json.loads((tmp_path / "spec.json").read_text())
    assert set(r["models"]) == set(specs) and r["models"][specs[1]]["params"] < r["models"][specs[0]]["params"]
    model, _ = common.build_model(specs[0], 500)
    assert not any(m.reversible for m in model.modules() if hasattr(m, "reversible"))


def test_decode_speed_fast_path_candidates(tmp_path):
    """NAME+fast decodes the same model with the fast path, NAME+int8 a copy with an int8 decoder, NAME+bf16
    a copy with bf16 weights, whose bytes per step count its bf16-read weights at 2 bytes."""
    names = [TINY[0], TINY[0] + "+fast", TINY[0] + "+int8", TINY[0] + "+bf16"]
    decode_speed.main(["--baseline", names[0], "--candidates", *names[1:], "--quick", "--vocab", "500",
                       "--out-dir", str(tmp_path), "--name", "fast"])
    r = json.loads((tmp_path / "fast.json").read_text())
    assert set(r["models"]) == set(names) and set(r["ratios"]["1"]) == set(names[1:])
    fp32, bf16 = (r["models"][n]["results"]["1"]["bytes_per_step"] for n in names[1::2])
    decoder = decode_speed.common.build_model(TINY[0], 500)[0].decoder
    per_step = sum(m.weight.numel() for name, m in decoder.named_modules() if type(m) is torch.nn.Linear
                   and not name.endswith(("encoder_attn.k_proj", "encoder_attn.v_proj")))  # those: once per sentence
    assert fp32 - bf16 == 2 * per_step  # every Linear weight a step reads (tied output projection included) as bf16


def test_decode_speed_ctranslate2_candidates(tmp_path):
    """NAME+ct2 / NAME+ct2int8: the same model converted to CTranslate2 (installed by scripts/bootstrap.sh
    as a benchmark-only dependency), doing the same forced-length work."""
    pytest.importorskip("ctranslate2", reason="benchmark-only dependency: BENCH=1 scripts/bootstrap.sh (make test, make bench) installs it")
    names = [TINY[0], TINY[0] + "+ct2", TINY[0] + "+ct2int8"]
    decode_speed.main(["--baseline", names[0], "--candidates", *names[1:], "--quick", "--vocab", "500",
                       "--out-dir", str(tmp_path), "--name", "ct2"])
    r = json.loads((tmp_path / "ct2.json").read_text())
    assert set(r["models"]) == set(names) and set(r["ratios"]["1"]) == set(names[1:])


def test_ctranslate2_conversion_scores_like_fairseq():
    """The converted model gives fairseq's log-probabilities for a given target (so the speed comparison
    runs the same network), and models CTranslate2 cannot map are refused with the reason."""
    pytest.importorskip("ctranslate2", reason="benchmark-only dependency: BENCH=1 scripts/bootstrap.sh (make test, make bench) installs it")
    import ct2
    import torch

    model, task = common.build_model(TINY[0], 300)
    sample = decode_speed.make_sample(2, 9, 300, task.target_dictionary.eos(), seed=3)
    gen = decode_speed.make_generator(model, task, 3, 6)
    with torch.no_grad():
        hyps = gen.generate([model], sample)
    translator = ct2.translator(model, task, "float32", threads=1)
    src = ct2.source_tokens(sample, task.source_dictionary)
    tgt = [[task.target_dictionary[int(i)] for i in h[0]["tokens"][:-1]] for h in hyps]
    for h, scored in zip(hyps, translator.score_batch(src, tgt)):
        expect = h[0]["positional_scores"].tolist()
        assert scored.log_probs == pytest.approx(expect, abs=1e-4)
    owf, _ = common.build_model("one_wide_ffn_tiny", 300)
    assert "is not fairseq's" in ct2.unsupported_reason(owf)


def test_presets_skip_unregistered_candidates(tmp_path, capsys):
    run_presets.main(["--quick", "--only", "decode_one_wide_ffn_base", "--out-dir", str(tmp_path)])
    r = json.loads((tmp_path / "decode_one_wide_ffn_base.json").read_text())
    assert "transformer" in r["models"]
    if "one_wide_ffn_base" not in r["models"]:
        assert "skipping one_wide_ffn_base" in capsys.readouterr().err


def test_decode_speed_loads_checkpoints_and_named_specs(trained, tmp_path):
    """NAME=checkpoint.pt (also on the fast path: NAME=checkpoint.pt+fast) and NAME=arch@FLAGS."""
    save, _, _ = trained
    ckpt = save / "checkpoint_last.pt"
    decode_speed.main(["--baseline", "transformer_tiny", "--candidates", f"trained={ckpt}", f"trained={ckpt}+fast",
                       "narrow=transformer_tiny@--decoder-ffn-embed-dim 32", "--quick", "--vocab", "500",
                       "--out-dir", str(tmp_path), "--name", "c"])
    r = json.loads((tmp_path / "c.json").read_text())
    assert set(r["models"]) == {"transformer_tiny", "trained", "trained+fast", "narrow"}
    assert r["models"]["narrow"]["params"] < r["models"]["transformer_tiny"]["params"]
    assert all(r["ratios"]["1"][m]["median"] > 0 for m in ("trained", "trained+fast", "narrow"))


def test_sparse_ffn_speed_quick(tmp_path):
    import sparse_ffn_speed

    sparse_ffn_speed.main(["--quick", "--out-dir", str(tmp_path), "--name", "s"])
    r = json.loads((tmp_path / "s.json").read_text())
    assert [(row["block_size"], row["tokens"]) for row in r["rows"]] == [(16, 1), (16, 5)]
    assert set(r["rows"][0]["speed_vs_dense"]) == {"gather (PyTorch)", "kernel"}


def test_few_rows_speed_quick(tmp_path):
    """Every variant at each row count, with its bytes-per-second and both lower bounds of a step; the table
    renders from the JSON (tools.docs' bench blocks)."""
    import few_rows_speed

    few_rows_speed.main(["--quick", "--out-dir", str(tmp_path), "--name", "f"])
    r = json.loads((tmp_path / "f.json").read_text())
    variants = {"F.linear", "kernel", "kernel, panels", "kernel bf16", "kernel bf16, panels",
                "kernel bf16, panels, bf16 products"}
    assert [(row["rows"], row["variant"]) for row in r["rows"]] == [(n, v) for n in (1, 5) for v in
                                                                   few_rows_speed.variants([], []).keys()]
    assert {row["variant"] for row in r["rows"]} == variants
    assert all(row["gb_s"] > 0 and row["compute_bound_ms"] > 0 and row["memory_bound_ms"] > 0 for row in r["rows"])
    assert r["weights"] == 2 * (3 * 40 * 40 + 3 * 40 * 40 + 2 * 72 * 40) + 100 * 40
    assert "in-cache G weights/s" in few_rows_speed.table(r)


def test_step_profile_quick(tmp_path):
    """Every op of a profiled decode lands in one part of the step and one kind of call: the shares cover the
    whole profiled decode, the step's parts each took time, and the table renders from the JSON."""
    import step_profile

    r = step_profile.main(["--quick", "--out-dir", str(tmp_path), "--name", "p"])
    assert json.loads((tmp_path / "p.json").read_text())["kind"] == "step_profile"
    assert set(r["models"]) == {"transformer+fast", "can_decoder+fast"}
    for name, m in r["models"].items():
        share = m["share"]
        assert abs(sum(share.values()) - 1) < 1e-9
        assert {k.split("|")[0] for k in share} <= set(step_profile.PARTS)
        assert {k.split("|")[1] for k in share} <= set(step_profile.KINDS)
        for part in ("encoder", "decoder layers", "embedding + output layer", "log-softmax", "beam search"):
            assert step_profile._sum(share, part=part) > 0, (name, part)
        for kind in step_profile.KINDS:
            assert step_profile._sum(share, kind=kind) > 0, (name, kind)
        # the scopes cover the decode: the attributed time is the profiled decode's wall time
        steps = r["settings"]["tgt_len"] + 1
        assert 0.8 < m["profiled_ms_attributed"] / steps / m["ms_per_step_profiled"] <= 1.01
        assert m["roofline_ms_per_step"] > 0
    assert step_profile._sum(r["models"]["can_decoder+fast"]["share"], part="decoder layers",
                             kind="attention") > 0  # CAN's fused sub-layer
    assert "By part of the step" in step_profile.table(r)
    assert step_profile.kind_of("fairseq_ext::few_rows_linear") == "products"
    assert step_profile.kind_of("fairseq_ext::compressed_attention_decode") == "attention"
    assert step_profile.kind_of("aten::bmm") == "attention" and step_profile.kind_of("aten::topk") == "other ops"
    with pytest.raises(SystemExit):
        step_profile.main(["--quick", "--models", "transformer", "--out-dir", str(tmp_path)])


def test_can_step_speed_quick(tmp_path, monkeypatch):
    import can_step_speed

    monkeypatch.delenv("FAIRSEQ_EXT_NO_KERNELS", raising=False)
    can_step_speed.main(["--quick", "--out-dir", str(tmp_path), "--name", "c"])
    r = json.loads((tmp_path / "c.json").read_text())
    assert set(r["us_per_step"]) == {"general", "reference", "kernel"}
    assert set(r["speed_vs_general"]) == {"reference", "kernel"} and r["us_per_step"]["kernel"] > 0
    assert "FAIRSEQ_EXT_NO_KERNELS" not in os.environ  # the benchmark restores the environment
