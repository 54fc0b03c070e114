"""One Wide FFN: sharing plans, and the paper's parameter tables regenerated from our models
(WMT22 EN-DE joint vocabulary of 50,408 tokens; the paper rounds to millions)."""
import pytest

from fairseq_ext.modules.feedforward import ffn_sharing_plan
from fairseq_ext.tools.params import build_model, count_parameters

V = 50408
BIG = "transformer_wmt_en_de_big"
OWF_BIG = ["--encoder-embed-dim", "1024", "--encoder-ffn-embed-dim", "4096", "--encoder-attention-heads", "16",
           "--decoder-embed-dim", "1024", "--decoder-ffn-embed-dim", "4096", "--decoder-attention-heads", "16"]


def enc(mode, m=None, width=None):
    return (["--encoder-ffn-sharing", mode] + (["--encoder-num-shared-ffns", str(m)] if m else [])
            + (["--encoder-shared-ffn-dim", str(width)] if width else []))


def dec(mode, m=None, width=None):
    return (["--decoder-ffn-sharing", mode] + (["--decoder-num-shared-ffns", str(m)] if m else [])
            + (["--decoder-shared-ffn-dim", str(width)] if width else []))


# (paper table, configuration, flags on the `one_wide_ffn` arch at Big dims, |theta| in millions)
PAPER = [
    ("Tab. sharing", "Transformer Big", [], 228),
    ("Tab. sharing", "SharedEnc", enc("shared"), 186),
    ("Tab. sharing", "SharedDec", dec("shared"), 186),
    ("Tab. sharing", "SharedEncSharedDec", enc("shared") + dec("shared"), 144),
    ("Tab. sharing", "SharedEncDec", enc("shared") + dec("encoder"), 136),
    ("Tab. dropping", "NoEnc", enc("none"), 178),
    ("Tab. dropping", "NoDec", dec("none"), 178),
    ("Tab. dropping", "NoEncNoDec", enc("none") + dec("none"), 127),
    ("Tab. dropping", "SharedEncNoDec", enc("shared") + dec("none"), 136),
    ("Tab. dropping", "NoEncSharedDec", enc("none") + dec("shared"), 136),
    ("Tab. wide", "SharedEncNoDec d_ff'=24,576", enc("shared", width=24576) + dec("none"), 177),
    ("Tab. wide", "SharedEncNoDec d_ff'=49,152", enc("shared", width=49152) + dec("none"), 228),
    ("Tab. wide", "SharedEncNoDec d_ff'=98,304", enc("shared", width=98304) + dec("none"), 328),
    ("App. custom sharing", "Sequence M=2", enc("sequence", 2), 194),
    ("App. custom sharing", "Sequence M=3", enc("sequence", 3), 202),
    ("App. custom sharing", "Cycle M=2", enc("cycle", 2), 194),
    ("App. custom sharing", "Cycle Rev M=3", enc("cycle_rev", 3), 202),
    ("App. attention", "shared enc self, dec self, cross",
     ["--share-encoder-self-attn", "--share-decoder-self-attn", "--share-decoder-cross-attn"], 165),
    ("App. attention", "shared enc self, dec self", ["--share-encoder-self-attn", "--share-decoder-self-attn"], 186),
    ("App. attention", "shared enc self", ["--share-encoder-self-attn"], 207),
    ("App. attention", "shared dec cross", ["--share-decoder-cross-attn"], 207),
]


@pytest.mark.parametrize("table,name,flags,expected", PAPER, ids=[f"{t}:{n}" for t, n, _, _ in PAPER])
def test_parameter_counts_match_the_paper(table, name, flags, expected):
    n = count_parameters(build_model("one_wide_ffn", V, OWF_BIG + flags))
    assert abs(n / 1e6 - expected) <= 1.0, f"{name}: {n / 1e6:.1f}M, paper {expected}M"


@pytest.mark.parametrize("flags,expected", [
    ([], 202), (["--decoder-ffn-sharing", "shared"], 110), (["--decoder-shared-ffn-dim", "49152"], 202),
])
def test_decoder_only_parameter_counts_match_the_paper(flags, expected):
    """Decoder-only table: baseline 202M, ShareDec d_ff'=4,096 110M, ShareDec d_ff'=49,152 202M."""
    arch = "one_wide_ffn_prefix_lm_vanilla_big" if not flags or flags[0] != "--decoder-shared-ffn-dim" \
        else "one_wide_ffn_prefix_lm_big"
    n = count_parameters(build_model(arch, V, flags))
    assert abs(n / 1e6 - expected) <= 1.0, f"{flags}: {n / 1e6:.1f}M, paper {expected}M"


@pytest.mark.parametrize("arch,baseline,expected,expected_base", [
    ("one_wide_ffn_big", BIG, 228, 228),
    ("one_wide_ffn_base", "transformer", 70, 70),
    ("one_wide_ffn_deep_shallow", "transformer_balanced_big", 236, 236),
])
def test_one_wide_archs_keep_the_baseline_size(arch, baseline, expected, expected_base):
    assert abs(count_parameters(build_model(arch, V)) / 1e6 - expected) <= 1.0
    assert abs(count_parameters(build_model(baseline, V)) / 1e6 - expected_base) <= 1.0


def test_sharing_plans():
    assert ffn_sharing_plan(6, "independent") == [0, 1, 2, 3, 4, 5]
    assert ffn_sharing_plan(6, "shared") == [0] * 6
    assert ffn_sharing_plan(6, "none") == [None] * 6
    assert ffn_sharing_plan(6, "sequence", 2) == [0, 0, 0, 1, 1, 1]
    assert ffn_sharing_plan(6, "sequence", 3) == [0, 0, 1, 1, 2, 2]
    assert ffn_sharing_plan(6, "cycle", 2) == [0, 1, 0, 1, 0, 1]
    assert ffn_sharing_plan(6, "cycle_rev", 3) == [0, 1, 2, 2, 1, 0]


def test_shared_ffn_is_one_module_and_dropped_layers_have_no_ffn():
    model = build_model("one_wide_ffn_tiny", 1000, device="cpu")
    enc_fc1 = {id(layer.fc1) for layer in model.encoder.layers}
    assert len(enc_fc1) == 1 and model.encoder.layers[0].fc1.out_features == 512
    assert all(not hasattr(layer, "fc1") and not hasattr(layer, "final_layer_norm") for layer in model.decoder.layers)
    model = build_model("one_wide_ffn_shared_enc_dec_tiny", 1000, device="cpu")
    assert model.decoder.layers[1].fc1 is model.encoder.layers[0].fc1
    assert model.encoder.layers[1].self_attn.q_proj is model.encoder.layers[0].self_attn.q_proj
    assert model.encoder.layers[1].self_attn is not model.encoder.layers[0].self_attn  # own incremental state
    assert model.decoder.layers[1].encoder_attn.k_proj is model.decoder.layers[0].encoder_attn.k_proj
    assert model.decoder.layers[1].self_attn.k_proj is not model.decoder.layers[0].self_attn.k_proj


def test_prefix_lm_equals_one_stack_over_source_and_target():
    """The encoder/decoder split of the prefix LM is exactly one layer stack over [source; target] with
    a bidirectional mask on the source and a causal mask on the target (no padding here)."""
    import torch

    torch.manual_seed(0)
    model = build_model("one_wide_ffn_prefix_lm_tiny", 300, device="cpu").eval()
    dec = model.decoder
    src = torch.randint(4, 300, (2, 7))
    tgt = torch.randint(4, 300, (2, 5))
    with torch.no_grad():
        split = dec(tgt, encoder_out=model.encoder(src))[0]
        xs, _ = dec.embed(src)
        xt, _ = dec.embed(tgt)
        x = torch.cat([xs, xt], dim=0)  # (S+T, B, C)
        s, t = src.size(1), tgt.size(1)
        mask = torch.zeros(s + t, s + t)
        mask[:s, s:] = float("-inf")  # the source never sees the target
        mask[s:, s:] = torch.triu(torch.full((t, t), float("-inf")), 1)  # causal over the target
        for layer in dec.layers:
            x = layer(x, attn_mask=mask)
        one_stack = dec.output_layer(dec.layer_norm(x[s:]).transpose(0, 1))
    assert (split - one_stack).abs().max().item() < 1e-5


def _readme_sharing_rows():
    """The flag settings of the One Wide FFN page's configuration table (docs/one_wide_ffn/README.md, Flags;
    each `a` / `b` alternative; D, M and S filled in)."""
    import os
    import re

    page = os.path.join(os.path.dirname(__file__), "..", "docs", "one_wide_ffn", "README.md")
    text = open(page, encoding="utf-8").read()
    table = text.split("## Flags", 1)[1].split("\n\n", 2)[1]
    rows = []
    for line in table.splitlines()[2:]:
        name, flags = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip("|"))[:2]]
        for alt in [a for a in re.findall(r"`([^`]+)`", flags) if a.startswith("--")]:  # not arch names
            alt = alt.replace("\\|", "|").replace(" D", " 2048").replace(" M", " 2").replace(" S ", " 0.5 ")
            alt = re.sub(r"(\w+)\|\S+", r"\1", alt)  # sequence|cycle|cycle_rev -> sequence
            for side in ("encoder", "decoder"):  # a width is a shared FFN's: with its side shared
                if f"--{side}-shared-ffn-dim" in alt and f"--{side}-ffn-sharing" not in alt:
                    alt = f"--{side}-ffn-sharing shared " + alt
            if "--shared-ffn-lr-scale" in alt and "-ffn-sharing" not in alt:  # needs a shared FFN
                alt = "--encoder-ffn-sharing shared " + alt
            rows.append((name, alt.split()))
    return rows


@pytest.mark.parametrize("arch", ["one_wide_ffn", "one_wide_ffn_tiny", "one_wide_ffn_big"])
def test_readme_sharing_settings_build_on_every_one_wide_arch(arch):
    """Each setting of the One Wide FFN page's table works on top of the archs' own defaults (an arch's d_ff' never
    makes --encoder-ffn-sharing none fail)."""
    rows = _readme_sharing_rows()
    assert len(rows) >= 10, rows
    for name, flags in rows:
        if "--encoder-num-shared-ffns" in flags and arch == "one_wide_ffn_tiny":
            flags = [f if f != "cycle_rev" else "cycle" for f in flags]
        try:
            build_model(arch, 1000, flags)
        except ValueError as e:
            raise AssertionError(f"{arch} with the docs page's '{name}' setting {' '.join(flags)}: {e}") from None


def test_shared_ffn_lr_scale_gives_the_shared_ffn_its_own_learning_rate():
    """--shared-ffn-lr-scale S: adam_no_decay_gains puts the shared FFN's weights in groups at S × the
    scheduler's rate (group 0 keeps the scheduler's rate); one Adam step moves them S times as far."""
    import torch
    from fairseq.optim.adam import FairseqAdamConfig
    from omegaconf import OmegaConf

    from fairseq_ext.optim import AdamNoDecayGains

    model = build_model("one_wide_ffn_tiny", 100, ["--shared-ffn-lr-scale", "0.25",
                                                   "--optimizer", "adam_no_decay_gains"], device="cpu")
    shared = {id(p) for p in model.encoder.layers[0].fc1.parameters()} | \
        {id(p) for p in model.encoder.layers[0].fc2.parameters()}
    assert model.encoder.layers[0].fc1 is model.encoder.layers[1].fc1
    assert all(getattr(p, "lr_scale", 1) == (0.25 if id(p) in shared else 1) for p in model.parameters())
    cfg = OmegaConf.structured(FairseqAdamConfig(lr=[1e-3], weight_decay=0.0, tpu=False))
    opt = AdamNoDecayGains(cfg, list(model.parameters()))
    opt.set_lr(2e-3)
    assert opt.get_lr() == 2e-3
    for g in opt.param_groups:
        ids = {id(p) for p in g["params"]}
        assert g["lr"] == (5e-4 if ids <= shared else 2e-3) and (ids <= shared or not ids & shared)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    fc1 = "encoder.layers.0.fc1.weight"
    q_proj = "encoder.layers.0.self_attn.q_proj.weight"
    moved = {n: (p.detach() - before[n]).abs().mean().item() for n, p in model.named_parameters()}
    assert moved[fc1] == pytest.approx(0.25 * moved[q_proj], rel=0.05)
    with pytest.raises(ValueError, match="--shared-ffn-lr-scale 0.5 needs --optimizer adam_no_decay_gains"):
        build_model("one_wide_ffn_tiny", 100, ["--shared-ffn-lr-scale", "0.5", "--optimizer", "adam"])
    with pytest.raises(ValueError, match="no FFN is shared"):
        build_model("one_wide_ffn_tiny", 100, ["--shared-ffn-lr-scale", "0.5", "--encoder-ffn-sharing", "independent"])
