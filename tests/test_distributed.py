"""fairseq's own data-parallel training (legacy_ddp over gloo, one process per rank) with the plugin:
2 ranks x 1 batch per update must give the same model as 1 process x --update-freq 2 (fp32, and bf16
autocast within a stated tolerance).

Rank r of 2 takes batches r, r+2, ... of the epoch; one process with --update-freq 2 groups batches
(0, 1), (2, 3), ... into one update, so both see the same batches per update, and fairseq normalises
the summed gradient by the summed sample size in both cases. Dropout is off so no random stream
differs; what remains is float summation order (all-reduce vs local accumulation).
"""
import socket
import subprocess

import pytest

from conftest import REPO, clean_env, run
from matrix import USER_DIR


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _common(data, save, arch):
    return [str(data / "bin"), "--user-dir", USER_DIR, "--cpu", "--task", "translation",
            "--source-lang", "en", "--target-lang", "de", "--arch", arch,
            "--dropout", "0", "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--max-tokens", "1000", "--max-update", "4", "--save-dir", str(save), "--no-epoch-checkpoints",
            "--seed", "5", "--log-format", "simple", "--ddp-backend", "legacy_ddp"]


# the baseline, a model with a shared (tied) FFN, the CAN decoder on a shared-FFN encoder, and the
# Terraformer's reversible layers (dense: the sparse FFN's Gumbel noise differs between 1 and 2 ranks)
# ... and the baseline trained with bf16 autocast (--bf16 on CPU) over gloo
CASES = [(a, []) for a in ["transformer_balanced_tiny", "one_wide_ffn_shared_enc_dec_tiny", "can_decoder_ffn_tiny",
                           "terraformer_dense_tiny"]] + [("transformer_balanced_tiny", ["--bf16"])]


@pytest.mark.parametrize("arch,extra", CASES, ids=[a + "".join(e) for a, e in CASES])
def test_two_gloo_ranks_equal_one_process_with_update_freq_2(arch, extra, tiny_data, tmp_path):
    single = tmp_path / "single"
    run(["fairseq-train", *_common(tiny_data, single, arch), *extra, "--update-freq", "2"], OMP_NUM_THREADS="1")

    ddp = tmp_path / "ddp"
    out = _two_ranks(tiny_data, ddp, arch, extra)
    assert "distributed init (rank 1)" in out, out[-3000:]
    if extra:
        assert "bf16 on CPU" in out, out[-3000:]  # the master rank logs it

    from fairseq_ext.compat import load_checkpoint

    a = load_checkpoint(single / "checkpoint_last.pt")
    b = load_checkpoint(ddp / "checkpoint_last.pt")
    assert a["optimizer_history"][-1]["num_updates"] == b["optimizer_history"][-1]["num_updates"] == 4
    worst = max((a["model"][k] - b["model"][k]).abs().max().item() for k in a["model"])
    print("max |single - ddp| =", worst)
    # fp32: the same model to float summation order. bf16 autocast: the all-reduce and the local accumulation
    # sum the same bf16-rounded gradients in another order, and Adam's normalisation magnifies the last-bit
    # differences of near-zero gradients into steps of size ~lr: within a quarter of one step (lr 1e-3) of
    # each other after 4 updates (a wrapped model that lost the fused loss differed by 3.4e-3)
    tol = 2.5e-4 * 4 if extra else 1e-5
    assert worst < tol, f"2-rank DDP differs from 1 process with --update-freq 2 by {worst}"
    moved = max((a["model"][k].float().abs().max().item()) for k in a["model"])
    assert moved > 0


def _two_ranks(data, save, arch, extra):
    port = _free_port()
    procs = [
        subprocess.Popen(
            ["fairseq-train", *_common(data, save, arch), *extra, "--distributed-world-size", "2",
             "--distributed-rank", str(rank), "--distributed-no-spawn", "--distributed-backend", "gloo",
             "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--device-id", str(rank)],
            cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        for rank in range(2)
    ]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for p, out in zip(procs, outs):
        assert p.returncode == 0, out[-4000:]
    return outs[0] + outs[1]


@pytest.mark.heavy
def test_two_gloo_ranks_resume_exactly_mid_epoch_after_the_first(tiny_data, tmp_path):
    """2 ranks stopped inside epoch 2 and resumed by the same command end bit-equal to 2 ranks trained
    without a stop (dropout on, --update-freq 2, fp32)."""
    from fairseq_ext.compat import load_checkpoint

    arch = "transformer_balanced_tiny"
    extra = ["--dropout", "0.1", "--update-freq", "2", "--max-tokens", "4000"]  # 7 updates per epoch
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    _two_ranks(tiny_data, whole, arch, extra + ["--max-update", "12"])
    _two_ranks(tiny_data, parts, arch, extra + ["--max-update", "10"])
    first = load_checkpoint(parts / "checkpoint_last.pt")
    assert first["extra_state"]["train_iterator"]["epoch"] >= 2, "the stop is not after the first epoch"
    assert first["extra_state"]["train_iterator"]["iterations_in_epoch"] > 0, "the stop is not mid-epoch"
    out = _two_ranks(tiny_data, parts, arch, extra + ["--max-update", "12"])
    assert "Loaded checkpoint" in out, out[-3000:]
    a, b = load_checkpoint(whole / "checkpoint_last.pt"), load_checkpoint(parts / "checkpoint_last.pt")
    assert a["optimizer_history"][-1]["num_updates"] == b["optimizer_history"][-1]["num_updates"] == 12
    differ = [k for k in a["model"] if not (a["model"][k] == b["model"][k]).all()]
    assert not differ, f"resumed 2-rank run differs from the uninterrupted one in {differ[:5]}"
