"""The fast decoding path (fairseq_ext/decoding/fast_generator.py): the same hypotheses (tokens) and
scores (to 1e-5) as fairseq's SequenceGenerator (the encoder's fp32 products and the step's products of more
than 16 rows on oneDNN-packed weights) for beam 1 and 5, batch 1 and 8, with and without length penalty, on the
tiny archs it serves; the others fall back with a reason."""
import pytest
import torch
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator

from fairseq_ext.decoding.encoder import can_pack
from fairseq_ext.decoding.fast_generator import FastEnsembleModel, FastSequenceGenerator, unsupported_reason
from matrix import build, fixed_batch

SERVED = ["transformer_tiny", "transformer_balanced_tiny", "one_wide_ffn_tiny", "one_wide_ffn_cycle_tiny",
          "one_wide_sparse_ffn_tiny", "scaling_sparse_ff_tiny", "scaling_sparse_qkv_tiny", "scaling_sparse_tiny",
          "scaling_sparse_loss_tiny", "can_decoder_tiny", "can_decoder_attention_tiny", "can_decoder_ffn_tiny",
          "sas_block_tiny", "sas_block_nonorm_tiny", "sas_block_preln_decoder_tiny", "terraformer_tiny",
          "terraformer_dense_tiny"]


def _sharpened(tiny_data, arch, flags=()):
    """A tiny model in eval mode whose decoder weights are scaled by 1.5 (random weights give flat
    distributions, where near-ties would make the comparison depend on last-bit differences). Seeded
    here: the weights must not depend on what earlier tests drew from torch's generator."""
    torch.manual_seed(7)
    _, task, model, _ = build(tiny_data, arch, extra=flags)
    with torch.no_grad():
        for p in model.decoder.parameters():
            p.mul_(1.5)
    return task, model.eval()


def _same_hypotheses(ref, fast, tol=1e-5):
    assert len(ref) == len(fast)
    for r_hyps, f_hyps in zip(ref, fast):
        assert [h["tokens"].tolist() for h in r_hyps] == [h["tokens"].tolist() for h in f_hyps]
        for r, f in zip(r_hyps, f_hyps):  # the same arithmetic on other memory layouts: last-bit differences
            torch.testing.assert_close(f["positional_scores"], r["positional_scores"], rtol=tol, atol=tol)
            assert abs(float(f["score"]) - float(r["score"])) < tol


def _compare(model, task, sample, gen_cls=FastEnsembleModel, tol=1e-5, **kw):
    """fairseq's SequenceGenerator and FastSequenceGenerator (whose model must be a gen_cls) decode
    `sample` to the same hypotheses."""
    kw.setdefault("max_len_b", 12)
    gen = FastSequenceGenerator([model], task.target_dictionary, **kw)
    assert isinstance(gen.model, gen_cls), gen.fast_reason
    # the packed fp32 encoder and many-row step products wherever torch has them, not only where faster
    half = next(model.parameters()).dtype != torch.float32
    gen.model.encoder_packed = can_pack() and not half
    if isinstance(gen.model, FastEnsembleModel):
        gen.model.stepper.packed = can_pack()
    kw.pop("int8", None)
    with torch.no_grad():
        ref = SequenceGenerator([model], task.target_dictionary, **kw).generate([model], sample)
        fast = gen.generate([model], sample)
    _same_hypotheses(ref, fast, tol)
    return gen


@pytest.mark.parametrize("arch", SERVED)
@pytest.mark.parametrize("beam,bsz,lenpen", [(1, 1, 1.0), (5, 1, 1.0), (5, 8, 0.6), (1, 8, 1.0), (5, 8, 1.0)])
def test_same_hypotheses_as_sequence_generator(arch, beam, bsz, lenpen, tiny_data):
    task, model = _sharpened(tiny_data, arch)
    _compare(model, task, fixed_batch(task, n=bsz), beam_size=beam, len_penalty=lenpen)


@pytest.mark.parametrize("arch,flags", [
    ("scaling_sparse_tiny", ["--sparse-qkv-module-kernel", "1"]), ("scaling_sparse_tiny", ["--sparse-qkv-kernel", "1"]),
    ("scaling_sparse_tiny", ["--sparse-qkv-kernel", "4", "--sparse-qkv-module-kernel", "5"]),
    ("terraformer_tiny", ["--sparse-qkv-kernel", "1"]),
    ("terraformer_tiny", ["--sparse-qkv-kernel", "4", "--sparse-qkv-module-kernel", "5", "--sru-layers", "2"]),
    ("terraformer_tiny", ["--sru-dim", "0", "--decoder-attention-layers", "1"]),
    ("terraformer_tiny", ["--sparse-loss", "4", "--sparse-qkv-kernel", "2"])])
def test_sparse_qkv_step_other_kernels(arch, flags, tiny_data):
    """The sparse QKV step's convolution as one product over (F steps x K modules) patches: other length
    and module kernels than the tiny archs' (F = 1: no conv state; K = 1: no module padding); for the
    Terraformer stepper also two SRU layers, no recurrence with one attention swap per block, and the sparse
    loss layer as its output projection."""
    from fairseq_ext.modules.multiplicative import SparseOutputProjection

    task, model = _sharpened(tiny_data, arch, flags)
    assert isinstance(model.decoder.output_projection, SparseOutputProjection) == ("--sparse-loss" in flags)
    _compare(model, task, fixed_batch(task, n=8), beam_size=5)


def test_search_options_are_fairseqs(tiny_data):
    _, task, model, _ = build(tiny_data, "transformer_tiny")
    model.eval()
    sample = fixed_batch(task, n=4)
    _compare(model, task, sample, beam_size=4, min_len=5, no_repeat_ngram_size=2, unk_penalty=0.5, max_len_b=9)


@pytest.mark.parametrize("arch", ["terraformer_lsh_tiny"])
@pytest.mark.parametrize("beam,bsz", [(5, 1), (3, 4)])
def test_other_archs_take_the_generic_mode_with_fairseqs_hypotheses(arch, beam, bsz, tiny_data):
    """Archs no Stepper serves say why, and decode with their own incremental step
    (OwnStepEnsembleModel: kernel output projection, two-stage top-k) to fairseq's hypotheses."""
    from fairseq_ext.decoding.fast_generator import OwnStepEnsembleModel

    task, model = _sharpened(tiny_data, arch)
    reason = unsupported_reason([model])
    assert reason
    gen = _compare(model, task, fixed_batch(task, n=bsz), gen_cls=OwnStepEnsembleModel, beam_size=beam, max_len_b=8)
    assert gen.fast_reason == reason


@pytest.mark.parametrize("arch", ["transformer_tiny", "can_decoder_tiny", "can_decoder_attention_tiny",
                                  "can_decoder_ffn_tiny", "sas_block_tiny", "terraformer_dense_tiny"])
def test_int8_quantizes_the_decoder_and_decodes_as_fairseq_on_the_quantized_model(arch, tiny_data):
    """--int8: the decoder's Linear layers become Int8Linear layers (the encoder stays fp32) and the fast step
    gives the hypotheses fairseq's own step gives on the same quantized model."""
    from fairseq_ext.ops.int8_linear import Int8Linear as QLinear

    task, model = _sharpened(tiny_data, arch)
    # the same tokens; scores within 1e-3: a last-bit difference before a quantized product (the fp32 steps'
    # other memory layouts) can move one activation across a rounding boundary of its int8 row, which moves
    # that product by one quantization step (1/127 of the row's range): 1.2e-4 in sas_block's scores on a
    # Xeon with AMX, under 3e-6 elsewhere; a wrong layer or scale moves them by far more than 1e-3
    gen = _compare(model, task, fixed_batch(task, n=3), tol=1e-3, int8=True, beam_size=3, max_len_b=8)
    stepper = gen.model.stepper  # the products reading one input run as one concatenated int8 layer
    if arch == "transformer_tiny":
        assert all(isinstance(f, QLinear) for f in stepper.qkv)
    if arch == "can_decoder_tiny":
        assert all(isinstance(f, QLinear) for f in stepper.x_int8)
    assert isinstance(model.decoder.output_projection, QLinear)
    tf = arch.startswith("terraformer")  # (its swaps: attention in/out projections; FFN, SRU down/proj/up)
    layers = model.decoder.stack.blocks if tf else model.decoder.layers
    assert sum(isinstance(m, QLinear) for m in layers.modules()) >= (2 if tf else 4) * len(layers)
    assert not any(isinstance(m, QLinear) for m in model.encoder.modules())  # the encoder stays fp32


def _rounded_model_reference(model, task, gen, kw):
    """fairseq's SequenceGenerator on the (bf16-rounded) model, its encoder run as the bf16 fast path `gen`
    runs it (under bf16 autocast or not: EncoderMixin)."""
    from fairseq_ext.decoding.encoder import EncoderMixin

    class AutocastEncoderEnsemble(EncoderMixin, EnsembleModel):
        pass

    ref_gen = SequenceGenerator([model], task.target_dictionary, **kw)
    ref_gen.model = AutocastEncoderEnsemble([model]).eval()
    ref_gen.model.encoder_bf16 = gen.model.encoder_bf16
    return ref_gen


@pytest.mark.parametrize("arch", SERVED + ["terraformer_lsh_tiny"])
def test_bf16_rounds_the_weights_and_decodes_as_fairseq_on_the_rounded_model(arch, tiny_data, caplog):
    """bf16=True (fairseq-ext-generate --bf16 on a CPU): every weight is rounded to bfloat16 in place, the
    step's products read bfloat16 copies (exactly the rounded values), and the hypotheses are fairseq's on
    the rounded model (the same sums in another order), its encoder run as the fast path runs it (under
    bf16 autocast where this CPU's bf16 products are fast)."""
    from fairseq_ext import ops
    from fairseq_ext.decoding.encoder import bf16_encoder_reason
    from fairseq_ext.decoding.fast_generator import OwnStepEnsembleModel

    task, model = _sharpened(tiny_data, arch)
    sample, kw = fixed_batch(task, n=3), dict(beam_size=5, max_len_b=8)
    with caplog.at_level("INFO", logger="fairseq_ext.decoding.fast_generator"):
        gen = FastSequenceGenerator([model], task.target_dictionary, bf16=True, **kw)
    assert isinstance(gen.model, FastEnsembleModel if arch in SERVED else OwnStepEnsembleModel), gen.fast_reason
    assert "not used" not in caplog.text and ("generic mode" in caplog.text) == (arch not in SERVED)
    assert gen.model.encoder_bf16 == (bf16_encoder_reason() is None)
    assert all(torch.equal(p, p.bfloat16().float()) for p in model.parameters())
    ref_gen = _rounded_model_reference(model, task, gen, kw)
    with torch.no_grad():
        _same_hypotheses(ref_gen.generate([model], sample), gen.generate([model], sample))
    if arch in SERVED and any(type(m) is torch.nn.Linear for m in model.decoder.modules()) and ops.kernels_enabled():
        copies = gen.model.stepper._bf16.values()  # the kernel read bf16 copies of the decoder's Linear weights
        assert copies and all(c[2].dtype == torch.bfloat16 for c in copies)
    if arch not in SERVED:  # the generic mode: its plain output projection read as bf16
        assert (gen.model.output_weight is not None) == gen.model.plain_output
        assert gen.model.output_weight is None or gen.model.output_weight.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="bf16 decoding reads a float32 model"):
        FastSequenceGenerator([model], task.target_dictionary, bf16=True, int8=True, beam_size=5)


@pytest.mark.parametrize("arch", ["transformer_tiny", "can_decoder_ffn_tiny"])
def test_bf16_products_score_as_fairseq_on_the_rounded_model(arch, tiny_data, monkeypatch):
    """FAIRSEQ_EXT_BF16_PRODUCTS=1 with bf16=True: the few-rows kernel's products in bf16 (x rounded to bf16)
    where the CPU has AVX512_BF16. Not fairseq's arithmetic, so a near-tie may pick another token; each
    sentence's best hypothesis scores within 0.05 of fairseq's on the rounded model."""
    from fairseq_ext import ops
    from fairseq_ext.ops import few_rows_linear
    from fairseq_ext.tools.precision import cpu_flags

    monkeypatch.setenv("FAIRSEQ_EXT_BF16_PRODUCTS", "1")
    monkeypatch.delenv("FAIRSEQ_EXT_CPU_ISA", raising=False)
    assert few_rows_linear.bf16_dot() == (ops.kernels_enabled() and {"avx512_bf16", "avx512f"} <= cpu_flags())
    task, model = _sharpened(tiny_data, arch)
    sample, kw = fixed_batch(task, n=3), dict(beam_size=5, max_len_b=8)
    gen = FastSequenceGenerator([model], task.target_dictionary, bf16=True, **kw)
    ref_gen = _rounded_model_reference(model, task, gen, kw)
    with torch.no_grad():
        ref, fast = ref_gen.generate([model], sample), gen.generate([model], sample)
    assert len(ref) == len(fast) == 3
    for r, f in zip(ref, fast):
        assert abs(float(r[0]["score"]) - float(f[0]["score"])) < 0.05


@pytest.mark.parametrize("step,vocab", [(0, 50), (3, 50), (3, 7), (0, 7)])
def test_two_stage_top_k_equals_fairseqs_beam_search(step, vocab):
    """Same candidates, beams and scores as fairseq's BeamSearch.step (distinct scores; -inf entries as
    blocked tokens leave); a vocabulary smaller than 2 x beam takes fairseq's single top-k."""
    from fairseq.search import BeamSearch

    from fairseq_ext.decoding.fast_generator import TwoStageBeamSearch

    class Dict:
        def pad(self): return 1
        def unk(self): return 3
        def eos(self): return 2
        def __len__(self): return vocab

    g = torch.Generator().manual_seed(step * 100 + vocab)
    bsz, beam = 3, 5
    lprobs = torch.randn(bsz, beam, vocab, generator=g).log_softmax(-1)
    lprobs[:, :, 1] = float("-inf")  # pad, blocked as fairseq does
    scores = torch.randn(bsz, beam, step + 1, generator=g).cumsum(-1) if step else None
    ref = BeamSearch(Dict()).step(step, lprobs.clone(), scores)
    out = TwoStageBeamSearch(Dict()).step(step, lprobs.clone(), scores)
    for r, o in zip(ref, out):
        assert torch.equal(r, o)


@pytest.mark.parametrize("mode", ["bf16_autocast", "fp16"])
def test_half_precision_trained_checkpoint_decodes_like_fairseq(mode, tiny_data, tmp_path):
    """A model trained with bf16 autocast (--bf16 on CPU) or fairseq's --fp16 trainer is saved and loaded as
    fairseq-generate loads it; the fast path decodes it to fairseq's hypotheses in fp32 (fast step) and in
    half precision (the model's own step: the fast step is fp32)."""
    import copy

    from fairseq import checkpoint_utils
    from fairseq.trainer import Trainer

    from fairseq_ext.decoding.fast_generator import OwnStepEnsembleModel

    torch.manual_seed(3)
    flags = ["--bf16"] if mode == "bf16_autocast" else ["--fp16", "--fp16-no-flatten-grads"]
    cfg, task, model, criterion = build(tiny_data, "transformer_tiny", extra=flags + ["--save-dir", str(tmp_path)])
    trainer = Trainer(cfg, task, model, criterion)
    sample = fixed_batch(task, n=8)
    for _ in range(3):
        trainer.train_step([sample])
    path = str(tmp_path / "checkpoint_last.pt")
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(path, {"train_iterator": {"epoch": 1}})
    [loaded], _ = checkpoint_utils.load_model_ensemble([path], task=task)
    assert next(loaded.parameters()).dtype == torch.float32
    with torch.no_grad():
        for p in loaded.decoder.parameters():
            p.mul_(1.5)  # away from near-ties (see _sharpened)
    loaded.eval()
    _compare(loaded, task, sample, beam_size=5)
    half = copy.deepcopy(loaded).to(torch.float16 if mode == "fp16" else torch.bfloat16)
    # (half-precision products are slow on a CPU without native fp16: 3 sentences, beam 3)
    gen = _compare(half, task, fixed_batch(task, n=3), gen_cls=OwnStepEnsembleModel, beam_size=3, max_len_b=8,
                   tol=1e-2)
    assert "the fast step is fp32" in gen.fast_reason
    with pytest.raises(ValueError, match="--int8 quantizes the decoder's fp32 weights"):
        FastSequenceGenerator([half], task.target_dictionary, int8=True, beam_size=5)


@pytest.mark.parametrize("arch", ["transformer_tiny", "scaling_sparse_tiny", "scaling_sparse_loss_tiny"])
def test_int8_says_what_it_quantized(arch, tiny_data, caplog):
    """--int8 logs how many of the decoder's Linear layers, and which share of its weights, became int8
    (the sparse models keep their sparse FFN blocks and multiplicative layers in fp32)."""
    import logging
    import re

    from fairseq_ext.decoding.fast_generator import quantize_decoder_int8

    _, _, model, _ = build(tiny_data, arch)
    with caplog.at_level(logging.INFO, logger="fairseq_ext.decoding.fast_generator"):
        quantize_decoder_int8(model)
    m = re.search(r"--int8: (\d+) Linear layers of the decoder quantized, (\d+)% of its weights", caplog.text)
    assert m, caplog.text
    share = int(m.group(2))
    if arch == "transformer_tiny":
        assert share >= 95, share
    else:
        assert share < 95, share  # not everything: the message says so


@pytest.mark.parametrize("unpacked", [False, True])
def test_bf16_encoder_linears_packed_once_and_equal_to_autocast_linear(tiny_data, unpacked, monkeypatch):
    """prepare_encoder (--bf16's encoder): the encoder's own Linear weights become bf16 (those shared with
    the decoder stay float32), and a module-called Linear gives autocast F.linear's result within bf16
    rounding under autocast, and F.linear's exactly outside it; the same where bf16 weights cannot be packed
    (oneDNN's bf16 product needs AVX-512: `unpacked` forces that path on any CPU)."""
    from fairseq_ext.decoding import encoder
    from fairseq_ext.decoding.encoder import prepare_encoder, prepared_dtype as encoder_dtype

    if unpacked:
        monkeypatch.setattr(encoder, "can_pack", lambda dtype=torch.float32: False)
    _, _, model, _ = build(tiny_data, "one_wide_ffn_tiny")
    model.eval()
    shared = {id(p) for p in model.decoder.parameters()}
    fc1 = model.encoder.layers[0].fc1
    x = torch.randn(7, 3, fc1.in_features)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        ref = torch.nn.functional.linear(x, fc1.weight, fc1.bias)
    prepare_encoder(model)
    assert encoder_dtype(model) == torch.bfloat16
    for m in model.encoder.modules():
        if type(m) is torch.nn.Linear:
            assert m.weight.dtype == (torch.float32 if id(m.weight) in shared else torch.bfloat16)
    assert (fc1._packed is not None) == encoder.can_pack(torch.bfloat16)  # False where unpacked
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = fc1(x)
        assert out.dtype == torch.bfloat16 and out.shape == ref.shape
        torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(fc1(x), torch.nn.functional.linear(x, fc1.weight.float(), fc1.bias))


@pytest.mark.skipif(not can_pack(), reason="this torch has no oneDNN packed linear: F.linear runs (tested above)")
def test_fp32_encoder_linears_packed_equal_f_linear_and_fall_back(tiny_data, monkeypatch):
    """prepare_encoder(model, float32): the encoder's own module-called Linear layers run on a weight packed
    for oneDNN and give F.linear's result to float32 rounding; after the weight changes, with gradients, or
    under autocast they run F.linear itself, and so does a deep copy or a pickle until prepared again. fp32_packed_reason: the environment override, a clear error
    for a bad value, and otherwise a measured choice."""
    import copy
    import pickle

    from fairseq_ext.decoding import encoder

    _, _, model, _ = build(tiny_data, "one_wide_ffn_tiny")
    model.eval()
    fc1 = model.encoder.layers[0].fc1
    x = torch.randn(7, 3, fc1.in_features)
    encoder.prepare_encoder(model, torch.float32)
    assert encoder.prepared_dtype(model) == torch.float32 and fc1._packed.dtype == torch.float32
    assert fc1 is model.encoder.layers[-1].fc1  # the shared FFN: one module, packed once
    with torch.no_grad():
        torch.testing.assert_close(fc1(x), torch.nn.functional.linear(x, fc1.weight, fc1.bias), rtol=1e-5, atol=1e-5)
        fc1.weight.mul_(2)  # changed after packing: F.linear on the new weight, exactly
        assert torch.equal(fc1(x), torch.nn.functional.linear(x, fc1.weight, fc1.bias))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert fc1(x).dtype == torch.bfloat16
    fc1._packed.version = fc1.weight._version
    copied = copy.deepcopy(model)  # a copy (or a pickle) runs F.linear until prepared again
    assert copied.encoder.layers[0].fc1._packed is None and encoder.prepared_dtype(copied) is None
    with torch.no_grad():
        assert torch.equal(copied.encoder.layers[0].fc1(x), torch.nn.functional.linear(x, fc1.weight, fc1.bias))
    assert pickle.loads(pickle.dumps(fc1))._packed is None
    out = fc1(x.requires_grad_())  # recording gradients: F.linear, so backward works
    out.sum().backward()
    assert fc1.weight.grad is not None and torch.equal(out, torch.nn.functional.linear(x, fc1.weight, fc1.bias))
    for value, packed in (("default", False), ("packed", True)):
        monkeypatch.setenv(encoder.ENV, value)
        encoder.fp32_packed_reason.cache_clear()
        assert (encoder.fp32_packed_reason() is None) == packed
    monkeypatch.setenv(encoder.ENV, "mkl")
    encoder.fp32_packed_reason.cache_clear()
    with pytest.raises(ValueError, match=encoder.ENV):
        encoder.fp32_packed_reason()
    monkeypatch.delenv(encoder.ENV)
    encoder.fp32_packed_reason.cache_clear()
    assert encoder.probe_packed_speedup(repeats=3) > 0
    for speedup, packed in ((1.0, False), (encoder.MIN_SPEEDUP + 0.5, True)):  # the choice follows the probe
        monkeypatch.setattr(encoder, "probe_packed_speedup", lambda s=speedup: s)
        encoder.fp32_packed_reason.cache_clear()
        reason = encoder.fp32_packed_reason()
        assert (reason is None) == packed and (packed or "1.00x" in reason)
    encoder.fp32_packed_reason.cache_clear()


def test_written_cache_reorders_in_place():
    """kv_cache.reorder_written_cache: the valid prefix of each buffer is the old prefix index-selected by
    the beam order (also when finished sentences shrink the batch), written into the same memory (a fresh
    buffer per step would pay a page fault per page touched), and later writes go on from there."""
    from fairseq_ext.modules.kv_cache import reorder_written_cache, write_to_cache

    torch.manual_seed(0)
    state, steps = {}, [(torch.randn(6, 3, 5), torch.randn(6, 3, 5)) for _ in range(20)]
    for k, v in steps[:17]:  # past the first capacity (16): the buffers have doubled once
        write_to_cache(state, k, v)
    full_k = torch.stack([k for k, _ in steps[:17]], 2)
    ptr = state["kbuf"].data_ptr()
    for order in (torch.tensor([1, 1, 0, 5, 4, 2]), torch.tensor([3, 0, 0, 2])):
        reorder_written_cache(state, order)
        full_k = full_k.index_select(0, order)
        assert state["kbuf"].data_ptr() == ptr and state["kbuf"].size(0) == order.numel()
        assert torch.equal(state["kbuf"][:, :, :17], full_k) and state["len"].tolist() == [17] * order.numel()
    k, v = steps[17][0][:4], steps[17][1][:4]
    kbuf, vbuf, n = write_to_cache(state, k, v)
    assert n == 18 and torch.equal(kbuf[:, :, :18], torch.cat([full_k, k.unsqueeze(2)], 2))


def test_row_cache_reorders_its_table_and_reads_as_the_written_cache():
    """kv_cache.write_to_row_cache + reorder_caches (CAN's stepper): beam search reorders the row table, the
    buffers stay where they were written (no copy), and every history read through the table
    (ops.compressed_attention.gather_history) equals write_to_cache's reordered buffers, across reorders that
    shrink the batch and a capacity doubling."""
    from fairseq_ext.modules.kv_cache import reorder_caches, write_to_cache, write_to_row_cache
    from fairseq_ext.ops.compressed_attention import gather_history

    torch.manual_seed(1)
    plain, table = {}, {}
    orders = {3: torch.tensor([1, 1, 0, 5, 4, 2]), 9: torch.tensor([2, 2, 5, 0, 1, 3]), 15: torch.tensor([3, 0, 0, 2]),
              17: torch.tensor([1, 3, 3, 0])}
    for step in range(20):
        rows = 6 if step <= 15 else 4
        k, v = torch.randn(rows, 3, 5), torch.randn(rows, 3, 7)
        kbuf, vbuf, n = write_to_cache(plain, k, v)
        kt, vt, rt, nt = write_to_row_cache(table, k, v, prefix="can_")
        assert nt == n and kt.size(0) == 6  # the buffers keep the first batch's rows
        assert torch.equal(gather_history(kt, n, rt), kbuf[:, :, :n]) and torch.equal(gather_history(vt, n, rt), vbuf[:, :, :n])
        if step in orders:
            ptr = kt.data_ptr()
            reorder_caches(plain, orders[step])
            reorder_caches(table, orders[step])
            assert table["can_kbuf"].data_ptr() == ptr and table["can_rows"].size(0) == orders[step].numel()
