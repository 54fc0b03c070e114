"""The shared matrix: every architecture this package registers, at its *_tiny size.

Adding an arch family = registering its archs (with a *_tiny one); it joins this matrix with no new
test code. A family can add bad-flag cases by defining BAD_FLAGS in its models/ module.
"""
import importlib

import pytest
import torch

from matrix import build, eval_loss, fixed_batch, is_lm, matrix_archs, parse_args

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
