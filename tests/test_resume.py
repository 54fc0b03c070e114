"""Training survives interruption (fairseq_ext/checkpointing.py): killed anywhere — inside a checkpoint
write, between a write and its rename, during the copy onto checkpoint_last.pt, in the middle of an epoch,
at epoch 2 or later — the same command resumes and ends with the parameters of the uninterrupted run,
bit for bit, having trained on the same batches in the same order. A finished run stays finished; an
unreadable checkpoint_last.pt falls back to the newest readable checkpoint.

The runs train on the first 600 pairs of the tiny set (`resume_data`) with --max-tokens 1200, --update-freq 2,
dropout and saves every 5 updates and at every epoch end (14 updates per epoch: 40 updates end in epoch 3), in
the precision this machine trains in (fairseq_ext/tools/precision.py:
bf16 autocast, --bf16 on CPU, where the CPU has native bf16; fp32 elsewhere, where emulated bf16 would make
each run several times slower). A kill in the middle of an epoch is also tested in bf16 on every machine
(bf16 training draws its dropout masks otherwise: hashed dropout)."""
import hashlib
import json
import os
import re
import signal
import subprocess
import sys

import pytest

from conftest import REPO, clean_env, machine_precision, run
from matrix import USER_DIR

HELPER = os.path.join(REPO, "tests", "train_with_faults.py")
MAX_UPDATE = 40


PRECISION = machine_precision()  # bf16 or fp32 (a CPU: no fp16)


def _args(data, save, max_update=MAX_UPDATE, arch="transformer_tiny", precision=PRECISION):
    return [str(data / "bin"), "--user-dir", USER_DIR, "--cpu", "--task", "translation",
            "--source-lang", "en", "--target-lang", "de", "--arch", arch, "--share-all-embeddings",
            "--optimizer", "adam", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1",
            "--max-tokens", "1200", "--update-freq", "2", *(["--bf16"] if precision == "bf16" else []),
            "--save-dir", str(save),
            "--save-interval-updates", "5", "--keep-interval-updates", "2", "--keep-last-epochs", "2",
            "--max-update", str(max_update), "--seed", "11", "--log-format", "simple", "--log-interval", "5"]


def _train(data, save, kill=None, trace=None, **kw):
    env = clean_env(OMP_NUM_THREADS="1", **({"KILL": kill} if kill else {}), **({"TRACE": str(trace)} if trace else {}))
    p = subprocess.run([sys.executable, HELPER, *_args(data, save, **kw)], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=600)
    return p.returncode, p.stdout + p.stderr


def _effective_batches(trace):
    """The batches the model was finally trained on: the last recorded batch of each update number (an
    update trained after the last checkpoint and lost in a kill is recorded twice)."""
    by_update = {}
    for line in open(trace):
        updates, ids = json.loads(line)
        by_update[updates] = ids
    return by_update


def _params(path):
    from fairseq_ext.compat import load_checkpoint

    state = load_checkpoint(path)
    return state["optimizer_history"][-1]["num_updates"], state["model"]


@pytest.fixture(scope="session")
def resume_data(tiny_data, tmp_path_factory):
    """The first 600 training pairs of the tiny set (its SentencePiece pieces and dictionary) and its 100 valid
    pairs, binarized: with --max-tokens 1200 and --update-freq 2, 14 updates per epoch."""
    root = tmp_path_factory.mktemp("resume_data")
    (root / "tok").mkdir()
    for lang in ("en", "de"):
        lines = (tiny_data / "tok" / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        (root / "tok" / f"train.{lang}").write_text("".join(lines[:600]), encoding="utf-8")
    run(["fairseq-preprocess", "--source-lang", "en", "--target-lang", "de", "--trainpref",
         str(root / "tok" / "train"), "--validpref", str(tiny_data / "tok" / "valid"), "--srcdict",
         str(tiny_data / "bin" / "dict.en.txt"), "--tgtdict", str(tiny_data / "bin" / "dict.de.txt"),
         "--destdir", str(root / "bin"), "--workers", "1"])
    return root


_references = {}


def _reference(data, precision, tmp_path_factory, max_update=MAX_UPDATE):
    """The uninterrupted run in `precision` (one per precision, length and session)."""
    if (precision, max_update) not in _references:
        save = tmp_path_factory.mktemp(f"uninterrupted-{precision}-{max_update}")
        trace = save / "trace.jsonl"
        rc, out = _train(data, save, trace=trace, precision=precision, max_update=max_update)
        assert rc == 0, out[-4000:]
        assert ("bf16 on CPU" in out) == (precision == "bf16"), out[-3000:]
        assert "epoch 003" in out, "the reference run must reach epoch 3"
        assert re.search(r"epoch 001: +5 / 14 ", out), "the kill points assume 14 updates per epoch"
        _references[precision, max_update] = save, trace
    return _references[precision, max_update]


@pytest.fixture
def reference(resume_data, tmp_path_factory):
    return _reference(resume_data, PRECISION, tmp_path_factory)


# kill points, one of each kind: inside a checkpoint write (an epoch save), before a rename, during the
# copy onto checkpoint_last.pt, and at an update in the middle of epoch 2 (the 19th step: epoch 2 is updates
# 15-28), in this machine's precision; the last again in bf16 where that is not this machine's (30 updates:
# into epoch 3)
KILLS = [(kill, PRECISION, MAX_UPDATE) for kill in ("write:5", "rename:3", "copy:4", "step:19")] + (
    [("step:19", "bf16", 30)] if PRECISION != "bf16" else [])


@pytest.mark.parametrize("kill,precision,max_update", KILLS, ids=[f"{k}-{p}" for k, p, _ in KILLS])
@pytest.mark.heavy
def test_killed_anywhere_resumes_exactly(kill, precision, max_update, resume_data, tmp_path, tmp_path_factory):
    ref_save, ref_trace = _reference(resume_data, precision, tmp_path_factory, max_update)
    save, trace = tmp_path / "run", tmp_path / "trace.jsonl"
    how = dict(trace=trace, precision=precision, max_update=max_update)
    rc, out = _train(resume_data, save, kill=kill, **how)
    assert rc == -signal.SIGKILL, f"the fault {kill} did not fire (rc {rc})\n{out[-3000:]}"
    rc, out = _train(resume_data, save, **how)  # the same command again
    assert rc == 0, out[-4000:]
    n_ref, ref = _params(ref_save / "checkpoint_last.pt")
    n, got = _params(save / "checkpoint_last.pt")
    assert n == n_ref == max_update
    different = [k for k in ref if not (ref[k] == got[k]).all()]
    assert not different, f"after {kill} and resume, {len(different)} tensors differ, e.g. {different[:3]}"
    assert _effective_batches(trace) == _effective_batches(ref_trace), "the resumed run trained on other batches"
    for name in os.listdir(save):  # every checkpoint left in the folder is whole
        if name.endswith(".pt"):
            from fairseq_ext.checkpointing import readable_checkpoint

            assert readable_checkpoint(str(save / name)) == "", name


def test_rerunning_a_finished_run_trains_nothing(reference, resume_data, tmp_path):
    ref_save, _ = reference
    digest = hashlib.sha256((ref_save / "checkpoint_last.pt").read_bytes()).hexdigest()
    rc, out = _train(resume_data, ref_save)
    assert rc == 0, out[-3000:]
    assert f"nothing to train: the run in {ref_save} is finished ({MAX_UPDATE} updates, --max-update {MAX_UPDATE})" in out
    assert hashlib.sha256((ref_save / "checkpoint_last.pt").read_bytes()).hexdigest() == digest
    assert "train_inner" not in out


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_unreadable_last_checkpoint_falls_back_to_newest_readable(damage, resume_data, tmp_path):
    save = tmp_path / "run"
    rc, out = _train(resume_data, save, max_update=15)
    assert rc == 0, out[-3000:]
    last = save / "checkpoint_last.pt"
    others = sorted((p for p in save.glob("checkpoint*.pt") if p != last), key=lambda p: p.stat().st_mtime)
    newest = others[-1]
    data = last.read_bytes()
    last.write_bytes({"truncated": data[: len(data) // 3], "empty": b"", "garbage": os.urandom(5000)}[damage])
    rc, out = _train(resume_data, save, max_update=20)
    assert rc == 0, out[-3000:]
    assert f"{last} " in out and f"resuming from {newest} instead" in out, out[-3000:]
    assert (save / "checkpoint_last.pt.unreadable").exists()
    n, _ = _params(last)
    assert n == 20


def test_no_readable_checkpoint_is_a_clear_error(resume_data, tmp_path):
    save = tmp_path / "run"
    save.mkdir()
    (save / "checkpoint_last.pt").write_bytes(b"")
    rc, out = _train(resume_data, save, max_update=5)
    assert rc != 0
    assert f"cannot resume: {save}/checkpoint_last.pt is empty (0 bytes), and no other readable checkpoint" in out
