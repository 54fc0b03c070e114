"""The shared matrix: every architecture this package registers, at its *_tiny size.

Adding an arch family = registering its archs (with a *_tiny one); it joins this matrix with no new
test code. A family can add bad-flag cases by defining BAD_FLAGS in its models/ module.
"""
import importlib

import pytest
import torch

from matrix import build, eval_loss, fixed_batch, is_lm, matrix_archs

ARCHS = matrix_archs()


def test_matrix_has_stock_transformer_first():
    assert ARCHS[0] == "transformer_tiny" and len(ARCHS) > 1


def _trainer(cfg, task, model, criterion):
    from fairseq.trainer import Trainer

    return Trainer(cfg, task, model, criterion)


@pytest.mark.parametrize("arch", ARCHS)
def test_trains_loss_decreases(arch, tiny_data):
    cfg, task, model, criterion = build(tiny_data, arch)
    sample = fixed_batch(task, n=8)
    trainer = _trainer(cfg, task, model, criterion)
    losses = [eval_loss(model, criterion, sample)]
    for _ in range(3):
        trainer.train_step([sample])
        losses.append(eval_loss(model, criterion, sample))
    assert all(torch.isfinite(torch.tensor(losses))), losses
    assert all(b < a for a, b in zip(losses, losses[1:])), f"loss not decreasing: {losses}"


def _beam_order(bsz, beam, generator):
    """A beam-search reordering: each row takes a (possibly repeated) row of its own sentence."""
    pick = torch.randint(0, beam, (bsz, beam), generator=generator)
    return (torch.arange(bsz).unsqueeze(1) * beam + pick).view(-1)


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoding_equals_full_forward(arch, tiny_data):
    _, task, model, _ = build(tiny_data, arch)
    model.eval()
    g = torch.Generator().manual_seed(0)
    bsz, beam, steps, reorder_at = 3, 4, 9, 4
    lm = is_lm(arch)  # a decoder-only language model: no encoder, same decoder interface
    enc = None
    with torch.no_grad():
        expand = torch.arange(bsz).repeat_interleave(beam)  # as SequenceGenerator expands to beams
        if not lm:
            sample = fixed_batch(task, n=bsz)  # real sentences of different lengths: left-padded sources
            src_tokens, src_lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
            assert (src_tokens == task.source_dictionary.pad()).any(), "the batch must contain padding"
            enc = model.encoder(src_tokens, src_lengths=src_lengths)
            enc = model.encoder.reorder_encoder_out(enc, expand)
        vocab = len(task.target_dictionary)
        tokens = torch.randint(4, vocab, (bsz * beam, steps), generator=g)
        tokens[:, 0] = task.target_dictionary.eos()

        full = model.decoder(tokens, encoder_out=enc)[0]  # (B*beam, T, V)
        state = {}
        order = _beam_order(bsz, beam, g)
        for t in range(steps):
            if t == reorder_at:  # what beam search does between steps
                model.decoder.reorder_incremental_state_scripting(state, order)
                if not lm:
                    enc = model.encoder.reorder_encoder_out(enc, order)
                tokens = torch.cat([tokens[order, :t], tokens[:, t:]], dim=1)
                full = model.decoder(tokens, encoder_out=enc)[0]
            step = model.decoder(tokens[:, : t + 1], encoder_out=enc, incremental_state=state)[0]
            assert step.shape == (bsz * beam, 1, full.size(-1))
            diff = (step[:, 0] - full[:, t]).abs().max().item()
            assert diff <= 1e-5, f"step {t}: incremental differs from full forward by {diff}"


@pytest.mark.parametrize("arch", ARCHS)
def test_decoding_follows_training_steps(arch, tiny_data):
    """What a model keeps for decoding (fused or derived weights) follows fairseq's optimizer, which writes
    parameters through .data (their version stays): decode (fills any cache), train a step, decode again;
    the incremental steps and a no-grad full forward must equal a full forward with autograd on."""
    cfg, task, model, criterion = build(tiny_data, arch)
    sample = fixed_batch(task, n=4)
    trainer = _trainer(cfg, task, model, criterion)
    lm = is_lm(arch)
    tokens = torch.randint(4, len(task.target_dictionary), (4, 6), generator=torch.Generator().manual_seed(1))
    tokens[:, 0] = task.target_dictionary.eos()

    def encode():
        net = sample["net_input"]
        return None if lm else model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])

    def decode():
        model.eval()
        with torch.no_grad():
            enc, state = encode(), {}
            steps = torch.stack([model.decoder(tokens[:, : t + 1], encoder_out=enc, incremental_state=state)[0][:, -1]
                                 for t in range(tokens.size(1))], dim=1)
            full_no_grad = model.decoder(tokens, encoder_out=enc)[0]
        with torch.enable_grad():
            full = model.decoder(tokens, encoder_out=encode())[0].detach()
        for name, out in (("incremental", steps), ("no-grad full forward", full_no_grad)):
            diff = (out - full).abs().max().item()
            assert diff <= 1e-5, f"{name} differs from the autograd forward by {diff} (stale decoding cache?)"

    decode()
    trainer.train_step([sample])
    decode()


@pytest.mark.parametrize("arch", ARCHS)
def test_save_resume_identical(arch, tiny_data, tmp_path):
    cfg, task, model, criterion = build(tiny_data, arch, save_dir=tmp_path)
    sample = fixed_batch(task, n=8)
    trainer = _trainer(cfg, task, model, criterion)
    trainer.train_step([sample])
    path = str(tmp_path / "checkpoint_last.pt")
    trainer.consolidate_optimizer()  # what fairseq's checkpoint_utils.save_checkpoint calls first
    trainer.save_checkpoint(path, {"train_iterator": {"epoch": 1}})

    cfg2, task2, model2, criterion2 = build(tiny_data, arch, save_dir=tmp_path)
    trainer2 = _trainer(cfg2, task2, model2, criterion2)
    extra = trainer2.load_checkpoint(path)  # torch.load with weights_only=True (torch >= 2.6)
    assert extra is not None and trainer2.get_num_updates() == 1
    with torch.no_grad():
        model.eval(), model2.eval()
        out1 = model(**sample["net_input"])[0]
        out2 = model2(**sample["net_input"])[0]
    assert torch.equal(out1, out2)
    trainer.train_step([sample])
    trainer2.train_step([sample])
    for (n1, p1), (n2, p2) in zip(model.named_parameters(), model2.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2), f"{n1} differs after the resumed training step"


def _tiny_sibling(arch, tiny_archs):
    return any(arch.startswith(t[: -len("_tiny")]) for t in tiny_archs)


def test_every_package_arch_has_a_tiny_sibling():
    from fairseq_ext.models import package_archs

    tiny = [a for a in package_archs() if a.endswith("_tiny")]
    lonely = [a for a in package_archs() if not _tiny_sibling(a, tiny)]
    assert not lonely, f"archs without a *_tiny size in the matrix: {lonely}"


def _full_size_archs():
    import fairseq_ext  # noqa: F401
    from fairseq_ext.models import package_archs

    return package_archs()


@pytest.mark.parametrize("arch", _full_size_archs())
def test_full_size_builds_on_meta_device(arch):
    """Every registered arch, at its real size and a 32k vocabulary, builds (on the meta device:
    shapes only, no memory)."""
    from fairseq_ext.tools.params import build_model, count_parameters

    assert count_parameters(build_model(arch, 32000, device="meta")) > 1_000_000


def _bad_flag_cases():
    import fairseq_ext  # noqa: F401
    from fairseq_ext.models import FAMILIES

    cases = []
    for family in FAMILIES:
        mod = importlib.import_module(f"fairseq_ext.models.{family}")
        cases += [pytest.param(arch, flags, message, id=f"{arch}:{' '.join(flags)}")
                  for arch, flags, message in getattr(mod, "BAD_FLAGS", [])]
    return cases


@pytest.mark.parametrize("arch,flags,message", _bad_flag_cases())
def test_bad_flags_fail_at_build_time_with_clear_message(arch, flags, message, tiny_data):
    with pytest.raises((ValueError, AssertionError, SystemExit)) as info:
        build(tiny_data, arch, extra=flags)
    assert message in str(info.value), f"unclear error for {flags}: {info.value!r}"


# ---- the precision axis: every arch in fp16 and bf16 (model cast, as fairseq's --fp16 does) and through
# the trainers that train in half precision (FP16Optimizer, MemoryEfficientFP16Optimizer, bf16 autocast)

HALF = [torch.float16, torch.bfloat16]
# tolerances relative to the largest |value| of the fp32 reference (logits), and the gradient's cosine
# similarity to fp32's: a half-precision model is the fp32 model with rounded weights and activations.
# Discrete choices (the sparse FFN's unit per block, LSH buckets) can flip at near-ties when rounded
# (0.2-0.6% of them in these random tiny models): the logits are compared with the fp32 model making the
# half model's choices (recorded and replayed, as a reversible layer's recomputation does).
LOGIT_TOL = {torch.float16: 0.02, torch.bfloat16: 0.08}
GRAD_COS = {torch.float16: 0.99, torch.bfloat16: 0.95}


def _makes_discrete_choices(model):
    from fairseq_ext.modules.lsh_attention import LSHSelfAttention
    from fairseq_ext.modules.sparse_feedforward import SparseFFNInput

    return any(isinstance(m, (SparseFFNInput, LSHSelfAttention)) for m in model.modules())


def _padded_batches(task, arch):
    """A left-padded batch (fairseq's default for sources) and the same sentences right-padded."""
    sample = fixed_batch(task, n=5)
    if is_lm(arch):
        return [("right", sample)]
    ds = task.dataset("valid")
    left_pad = ds.left_pad_source
    try:
        ds.left_pad_source = False
        right = ds.collater([ds[i] for i in range(5)])
    finally:
        ds.left_pad_source = left_pad
    return [("left", sample), ("right", right)]


def _loss_and_grads(model, sample):
    model.zero_grad(set_to_none=True)
    out = model(**sample["net_input"])[0]
    lprobs = torch.log_softmax(out.float(), dim=-1)
    target = sample["target"]
    loss = -(lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1) * target.ne(1)).sum()
    loss.backward()
    return torch.cat([p.grad.float().reshape(-1) for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_half_precision_forward_backward_matches_fp32(arch, dtype, tiny_data):
    import copy

    from fairseq_ext.modules.reversible import DecisionTape

    _, task, model, _ = build(tiny_data, arch)
    model.eval()  # no dropout: the only difference is the precision
    half = copy.deepcopy(model).to(dtype)
    for side, sample in _padded_batches(task, arch):
        tape = DecisionTape()
        with torch.no_grad():
            with tape.active(replay=False):
                out16 = half(**sample["net_input"])[0].float()
            with tape.active(replay=True):
                out32 = model(**sample["net_input"])[0]
        keep = sample["target"].ne(1)  # positions of real target tokens
        assert torch.isfinite(out16[keep]).all(), f"{side}-padded: non-finite logits in {dtype}"
        err = (out16 - out32).abs().amax(-1)[keep].max().item() / out32.abs().max().item()
        assert err <= LOGIT_TOL[dtype], f"{side}-padded: {dtype} logits differ from fp32 by {err:.3f} of their maximum"
        g32, g16 = _loss_and_grads(model, sample), _loss_and_grads(half, sample)
        assert torch.isfinite(g16).all(), f"{side}-padded: non-finite gradient in {dtype}"
        cos = torch.nn.functional.cosine_similarity(g16, g32, dim=0).item()
        assert cos >= GRAD_COS[dtype], f"{side}-padded: {dtype} gradient's cosine similarity to fp32's is {cos:.3f}"


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("arch", ARCHS)
def test_half_precision_incremental_decoding_equals_full_forward(arch, dtype, tiny_data):
    _, task, model, _ = build(tiny_data, arch)
    model.eval().to(dtype)
    tokens = torch.randint(4, len(task.target_dictionary), (3, 7), generator=torch.Generator().manual_seed(2))
    tokens[:, 0] = task.target_dictionary.eos()
    with torch.no_grad():
        enc = None
        if not is_lm(arch):
            net = fixed_batch(task, n=3)["net_input"]
            enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
        full = model.decoder(tokens, encoder_out=enc)[0].float()
        state = {}
        steps = torch.stack([model.decoder(tokens[:, : t + 1], encoder_out=enc, incremental_state=state)[0][:, -1]
                             for t in range(tokens.size(1))], dim=1).float()
    assert torch.isfinite(full).all() and torch.isfinite(steps).all()
    err = (steps - full).abs().amax(-1) / full.abs().max()  # per position
    # a discrete choice (sparse FFN unit, LSH bucket) may flip at a near-tie between the two computations,
    # which round differently: such models may exceed the tolerance at one position in seven
    allowed = 1 / 7 if _makes_discrete_choices(model) else 0.0
    over = (err > LOGIT_TOL[dtype] / 2).float().mean().item()
    assert over <= allowed, (f"{dtype}: incremental differs from the full forward by up to {err.max():.4f} of the "
                             f"maximum at {100 * over:.0f}% of the positions")


@pytest.mark.parametrize("mode", ["fp16", "memory_efficient_fp16", "bf16_autocast"])
@pytest.mark.parametrize("arch", ARCHS)
def test_half_precision_trainers_reduce_the_loss(arch, mode, tiny_data):
    """One of fairseq's half-precision trainers (fp32 master weights, dynamic loss scaling) or the package's
    bf16 autocast (--bf16 on CPU, fp32 weights) lowers the loss on a repeated batch; the weights the
    trainer keeps are fp32 where they must be."""
    # FP16Optimizer's flat fp32 copy is allocated on torch.cuda.current_device(): on a CPU it needs
    # --fp16-no-flatten-grads (one fp32 copy per parameter), which is what a CPU run of --fp16 uses
    flags = {"fp16": ["--fp16", "--fp16-no-flatten-grads"], "memory_efficient_fp16": ["--memory-efficient-fp16"],
             "bf16_autocast": ["--bf16"]}[mode]
    cfg, task, model, criterion = build(tiny_data, arch, extra=flags + ["--fp16-init-scale", "128"])
    sample = fixed_batch(task, n=4)
    trainer = _trainer(cfg, task, model, criterion)
    before = eval_loss(trainer.model, trainer.criterion, trainer._prepare_sample(sample)[0])
    for _ in range(2):
        trainer.train_step([sample])
    after = eval_loss(trainer.model, trainer.criterion, trainer._prepare_sample(sample)[0])
    assert after < before, f"{mode}: loss {before:.4f} -> {after:.4f}"
    weights = {p.dtype for p in trainer.model.parameters()}
    assert weights == ({torch.float32} if mode == "bf16_autocast" else {torch.float16}), weights
    if mode == "fp16":
        assert all(p.dtype == torch.float32 for p in trainer.optimizer.fp32_params)


@pytest.mark.parametrize("arch", ARCHS)
def test_bf16_products_in_fp32_match_native_bf16(arch, tiny_data):
    """On a CPU without native bf16, a --bf16 training step computes its bf16 matrix products in fp32 from the
    bf16 values (fairseq_ext/precision.py, Bf16ProductsInFp32): the native bf16 step's logits and gradient up
    to the order of the sums, and no product with a bf16 operand is left to torch (its emulation, ~100x
    slower than fp32 there). Discrete choices are replayed from the native step (near-ties may round apart)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from fairseq_ext.modules.reversible import DecisionTape
    from fairseq_ext.precision import Bf16ProductsInFp32, cpu_autocast

    class Products(TorchDispatchMode):  # below Bf16ProductsInFp32: sees the products it passes on
        def __init__(self):
            super().__init__()
            self.dtypes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in Bf16ProductsInFp32.PRODUCTS:
                self.dtypes.append({a.dtype for a in args if isinstance(a, torch.Tensor)})
            return func(*args, **(kwargs or {}))

    _, task, model, _ = build(tiny_data, arch)
    model.eval()  # no dropout: the two steps differ only in how the products are computed
    sample = fixed_batch(task, n=5)
    tape, results = DecisionTape(), {}
    for products in ("native", "fp32"):
        seen = Products()
        with tape.active(replay=products == "fp32"), seen, cpu_autocast(products=products):
            logits = model(**sample["net_input"])[0].float()
            grads = _loss_and_grads(model, sample)
        results[products] = logits, grads, seen.dtypes
    (l_nat, g_nat, _), (l_fp32, g_fp32, dtypes) = results["native"], results["fp32"]
    assert dtypes and all(torch.bfloat16 not in d for d in dtypes), dtypes
    keep = sample["target"].ne(1)
    err = (l_fp32 - l_nat).abs().amax(-1)[keep].max().item() / l_nat.abs().max().item()
    cos = torch.nn.functional.cosine_similarity(g_fp32, g_nat, dim=0).item()
    # one bf16 rounding that the order of the sums flips (0.4-0.8%) can grow through the layers: up to 4% of the
    # logits' maximum seen at a few positions, half of what bf16 may differ from fp32 (LOGIT_TOL)
    assert err <= LOGIT_TOL[torch.bfloat16] / 2 and cos >= 0.999, f"logits differ by {err:.4f} of their maximum, gradient cosine {cos:.4f}"


# every translation arch, and LSH attention with chunks of 5 positions (its chunked path on these sentences)
BATCH_CASES = [(a, ()) for a in ARCHS if not is_lm(a)] + [("terraformer_lsh_tiny", ("--lsh-chunk", "5"))]


@pytest.mark.parametrize("arch,flags", BATCH_CASES, ids=[a + "".join(f) for a, f in BATCH_CASES])
def test_translation_does_not_depend_on_the_batch(arch, flags, tiny_data):
    """Each sentence translates to the same tokens alone and inside mixed-length batches, with its source
    left-padded (fairseq's default) or right-padded. Sentences of the valid set, beam 3."""
    from fairseq.sequence_generator import SequenceGenerator

    torch.manual_seed(5)
    _, task, model, _ = build(tiny_data, arch, extra=list(flags))
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.mul_(1.5)  # away from near-ties (random weights give flat distributions)
    model.eval()
    ds = task.dataset("valid") if "valid" in task.datasets else (task.load_dataset("valid"), task.dataset("valid"))[1]
    ids = sorted(range(40), key=lambda i: ds.src_sizes[i])[::5][:7]  # lengths from short to long
    gen = SequenceGenerator([model], task.target_dictionary, beam_size=3, max_len_b=10)

    def translate(items, left_pad):
        ds.left_pad_source = left_pad
        try:
            sample = ds.collater([ds[i] for i in items])
        finally:
            ds.left_pad_source = True
        with torch.no_grad():
            hyps = gen.generate([model], sample)
        return {int(i): h[0]["tokens"].tolist() for i, h in zip(sample["id"], hyps)}

    alone = {}
    for i in ids:
        alone.update(translate([i], True))
    for left_pad in (True, False):
        together = translate(ids, left_pad)
        differ = [i for i in ids if together[i] != alone[i]]
        assert not differ, (f"{'left' if left_pad else 'right'}-padded batch: sentences {differ} translate "
                            f"differently than alone (source lengths {[int(ds.src_sizes[i]) for i in differ]})")


@pytest.mark.parametrize("arch", [a for a in ARCHS if not is_lm(a)])
def test_print_alignment_aligns_or_is_refused(arch, tiny_data):
    """--print-alignment through the translation task's generator: a hard alignment of every hypothesis
    token to a real (non-padding) source position, or, for an arch without source attention, a
    ValueError naming the flag when the generator is built. Translations are those of decoding without it."""
    from fairseq.sequence_generator import SequenceGenerator, SequenceGeneratorWithAlignment

    from omegaconf import open_dict

    cfg, task, model, _ = build(tiny_data, arch)
    with open_dict(cfg):
        cfg.generation.print_alignment, cfg.generation.beam = "hard", 2  # fairseq-generate --print-alignment
    model.eval()
    model.prepare_for_inference_(cfg)  # as fairseq-generate does
    why = getattr(model, "no_alignment", None)
    if why:
        with pytest.raises(ValueError, match="--print-alignment: .* decode without --print-alignment"):
            task.build_generator([model], cfg.generation)
        return
    gen = task.build_generator([model], cfg.generation)
    assert isinstance(gen, SequenceGeneratorWithAlignment)
    sample = fixed_batch(task)
    with torch.no_grad():
        hyps = gen.generate([model], sample)
    pad = task.source_dictionary.pad()
    for row, h in enumerate(hyps):
        n_src = int(sample["net_input"]["src_tokens"][row].ne(pad).sum())
        n_tgt = int(h[0]["tokens"].ne(task.target_dictionary.eos()).sum())
        align = h[0]["alignment"]  # (source word, target word) pairs, one per target token
        assert len(align) == n_tgt > 0, f"{arch}: {len(align)} alignment pairs for {n_tgt} target tokens"
        assert all(0 <= s < n_src for s, _ in align), align
    for m in model.modules():  # decode again without alignments: the same translations
        if hasattr(m, "need_attn"):
            m.need_attn = False
    with torch.no_grad():
        plain = SequenceGenerator([model], task.target_dictionary, beam_size=2).generate([model], sample)
    assert [h[0]["tokens"].tolist() for h in hyps] == [h[0]["tokens"].tolist() for h in plain]


@pytest.mark.parametrize("arch", ARCHS[1:])  # the package's archs (fairseq's transformer_tiny shares on request)
def test_arch_shares_its_embeddings_by_itself(arch, tiny_data):
    """Every arch (no --share-all-embeddings given) has one vocabulary-sized matrix: source and target
    embeddings and the output projection are the same parameter (joined dictionary), as README says."""
    _, task, model, _ = build(tiny_data, arch, share_flag=False)
    vocab = len(task.target_dictionary)
    matrices = [n for n, p in model.named_parameters() if p.dim() == 2 and vocab in p.shape]
    assert len(matrices) == 1, f"{arch}: {len(matrices)} vocabulary-sized matrices: {matrices}"


# ---- every numeric flag is validated at build time: cases generated from the package's argparse definitions

def _numeric_flag_cases():
    """(tiny arch, flag, argparse type, Range) for every numeric flag a family adds to fairseq's base model
    (its add_args minus the base class's) and, on one arch, fairseq's Transformer dims (COMMON_RANGES)."""
    import argparse
    import sys

    import fairseq_ext  # noqa: F401
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    from fairseq.models.transformer import TransformerModel
    from fairseq.models.transformer_lm import TransformerLanguageModel

    from fairseq_ext.models.common import COMMON_RANGES

    def numeric(cls):
        p = argparse.ArgumentParser()
        cls.add_args(p)
        return {a.dest: a for a in p._actions if a.type in (int, float)}

    cases, seen = [], set()
    for arch in ARCHS[1:]:
        cls = ARCH_MODEL_REGISTRY[arch]
        if cls in seen:
            continue
        seen.add(cls)
        base = TransformerLanguageModel if issubclass(cls, TransformerLanguageModel) else TransformerModel
        ranges = getattr(sys.modules[ARCH_CONFIG_REGISTRY[arch].__module__], "FLAG_RANGES", {})
        for dest, action in numeric(cls).items():
            if dest not in numeric(base):
                cases.append((arch, action.option_strings[0], action.type, ranges.get(dest)))
    for dest, action in numeric(TransformerModel).items():
        if dest in COMMON_RANGES:
            cases.append(("transformer_balanced_tiny", action.option_strings[0], action.type, COMMON_RANGES[dest]))
    return cases


FLAG_CASES = [pytest.param(arch, flag, typ, rng, value, id=f"{arch}:{flag}={value}")
              for arch, flag, typ, rng in _numeric_flag_cases() for value in ("0", "-1", "nan", "inf")]


@pytest.mark.parametrize("arch,flag,typ,rng,value", FLAG_CASES)
def test_every_numeric_flag_is_checked_at_build_time(arch, flag, typ, rng, value, tiny_data, capsys):
    """0, -1, nan and inf for every numeric flag: a clear error naming the flag and the value, or a documented
    meaning (a Range's special values: the build may then still fail, with a clear error)."""
    assert rng is not None, f"{flag} ({arch}) has no documented range: add it to its family's FLAG_RANGES"
    if typ is int and value in ("nan", "inf"):  # argparse refuses these for an int flag, naming the flag
        with pytest.raises(SystemExit):
            build(tiny_data, arch, extra=[flag, value])
        assert f"argument {flag}" in capsys.readouterr().err
        return
    parsed = typ(value)
    if rng.valid(parsed):  # a documented meaning, or in range: builds, or refuses with a clear error
        try:
            build(tiny_data, arch, extra=[flag, value])
        except ValueError as e:
            assert str(e).startswith("--"), f"{flag} {value}: unclear error {e!r}"
        return
    with pytest.raises(ValueError) as info:
        build(tiny_data, arch, extra=[flag, value])
    assert f"{flag} {parsed}" in str(info.value), f"the error does not name {flag} {parsed}: {info.value}"
