"""fairseq's own command-line tools with --user-dir fairseq_ext, end to end, on the committed sample:
train -> resume -> average -> generate (sacrebleu) -> interactive, with no environment variable
touching torch.load, and a crafted checkpoint refused."""
import os
import random
import re
import subprocess
import sys

import pytest
import torch

from conftest import REPO, clean_env, run
from matrix import USER_DIR


def test_train_then_resume(trained):
    save, first, resumed = trained
    assert "done training" in first
    # fairseq 0.12's known-harmless warnings are filtered by the plugin (compat.KNOWN_WARNINGS): none left
    assert "Warning" not in first + resumed, [l for l in (first + resumed).splitlines() if "Warning" in l]
    m = re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch (\d+) @ (\d+) updates\)", resumed)
    assert m and int(m.group(2)) == 30, resumed[-3000:]
    assert re.search(r"num_updates 40\b|num_updates=40\b|\| 40 updates", resumed), resumed[-3000:]
    assert os.path.exists(save / "checkpoint_best.pt")
    with open(save / "checkpoint_last.pt", "rb") as f:  # the resume above really read numpy objects
        import zipfile

        with zipfile.ZipFile(f) as z:
            pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    assert b"numpy" in pkl


def _generate(tiny_data, ckpt, extra=()):
    p = run(["fairseq-generate", str(tiny_data / "bin"), "--user-dir", USER_DIR, "--cpu",
             "--path", str(ckpt), "--gen-subset", "test", "--beam", "5", "--max-tokens", "4000",
             "--scoring", "sacrebleu", "--post-process", "sentencepiece", *extra])
    return p.stdout


def test_generate_scores_with_sacrebleu(trained, tiny_data):
    save, _, _ = trained
    out = _generate(tiny_data, save / "checkpoint_last.pt")
    assert re.search(r"Generate test with beam=5: BLEU = \d+\.\d+", out), out[-2000:]
    hyps = [l for l in out.splitlines() if l.startswith("D-")]
    assert len(hyps) == 100
    assert not any("▁" in h for h in hyps), "detokenization (--post-process sentencepiece) did not apply"


def test_average_checkpoints_then_generate(trained, tiny_data, tmp_path):
    save, _, _ = trained
    avg = tmp_path / "avg.pt"
    run(["fairseq-ext-average-checkpoints", "--inputs", str(save), "--num-update-checkpoints", "3",
         "--output", str(avg)])
    from fairseq_ext.compat import load_checkpoint

    inputs = [load_checkpoint(save / f"checkpoint_{e}_{u}.pt")["model"]
              for e, u in _update_checkpoints(save)[-3:]]
    averaged = load_checkpoint(avg)["model"]
    for k, v in averaged.items():
        expect = sum(s[k].double() for s in inputs) / 3
        assert torch.allclose(v.double(), expect, atol=1e-6), k
    assert "BLEU" in _generate(tiny_data, avg)


def test_exported_checkpoint_decodes_the_same_and_names_no_build_folder(trained, tiny_data, tmp_path):
    """export_checkpoint: no optimizer state, no --user-dir path of the training machine, same translations
    (fp32); fp16 weights load into the fp32 model. The shipped checkpoint is such an export."""
    from fairseq_ext.compat import load_checkpoint
    from fairseq_ext.tools.export_checkpoint import export

    save, _, _ = trained
    src = save / "checkpoint_last.pt"
    out = tmp_path / "export.pt"
    export(str(src), str(out))
    state = load_checkpoint(out)
    assert state["cfg"]["common"]["user_dir"] is None and state["cfg"]["model"].user_dir is None
    assert "last_optimizer_state" not in state
    hyps = lambda text: sorted(l for l in text.splitlines() if l.startswith("H-"))  # noqa: E731
    assert hyps(_generate(tiny_data, out)) == hyps(_generate(tiny_data, src))
    export(str(src), str(tmp_path / "half.pt"), fp16=True)
    assert {v.dtype for v in load_checkpoint(tmp_path / "half.pt")["model"].values()
            if torch.is_floating_point(v)} == {torch.float16}
    assert "BLEU" in _generate(tiny_data, tmp_path / "half.pt")
    shipped = load_checkpoint(os.path.join(REPO, "shipped", "en-de-small-baseline", "checkpoint.pt"))
    assert shipped["cfg"]["common"]["user_dir"] is None


def test_average_checkpoints_refuses_bad_input(trained, tmp_path, capsys):
    """Bad counts are refused before anything is read; checkpoints of different models are named with
    the parameter that differs; nothing is written at --output in either case."""
    from fairseq_ext.compat import install_checkpoint_safe_globals, load_checkpoint
    from fairseq_ext.tools.average_checkpoints import main

    save, _, _ = trained
    out = tmp_path / "avg.pt"
    for flags, expect in ((["--num-update-checkpoints", "-2"], "--num-update-checkpoints -2: must be >= 1"),
                          (["--num-epoch-checkpoints", "0"], "--num-epoch-checkpoints 0: must be >= 1")):
        with pytest.raises(SystemExit):
            main(["--inputs", str(save), *flags, "--output", str(out)])
        assert expect in capsys.readouterr().err
    state = load_checkpoint(save / "checkpoint_last.pt")
    name = next(k for k, v in state["model"].items() if v.dim() == 2)
    state["model"][name] = state["model"][name][:, :-1].clone()
    install_checkpoint_safe_globals()
    torch.save(state, tmp_path / "other.pt")
    with pytest.raises(SystemExit, match=f"parameter {re.escape(name)} has shape"):
        main(["--inputs", str(save / "checkpoint_last.pt"), str(tmp_path / "other.pt"), "--output", str(out)])
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(SystemExit, match="empty"):
        main(["--inputs", str(save / "checkpoint_last.pt"), str(tmp_path / "empty.pt"), "--output", str(out)])
    assert not out.exists()


def _update_checkpoints(save):
    found = [re.fullmatch(r"checkpoint_(\d+)_(\d+)\.pt", f) for f in os.listdir(save)]
    return sorted(((int(m.group(1)), int(m.group(2))) for m in found if m), key=lambda x: x[1])


def test_interactive_translates_stdin(trained, tiny_data):
    save, _, _ = trained
    import subprocess
    from conftest import clean_env

    p = subprocess.run(
        ["fairseq-interactive", str(tiny_data / "bin"), "--user-dir", USER_DIR, "--cpu",
         "--path", str(save / "checkpoint_last.pt"), "--source-lang", "en", "--target-lang", "de",
         "--beam", "4", "--bpe", "sentencepiece", "--sentencepiece-model", str(tiny_data / "spm.model")],
        input="The house is small.\nThank you very much.\n", capture_output=True, text=True,
        env=clean_env(), cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert len([l for l in p.stdout.splitlines() if l.startswith("D-")]) == 2, p.stdout


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/fairseq_ext_pwned",))


def test_crafted_checkpoint_is_refused(tmp_path):
    """weights_only=True stays on: a checkpoint that would run code on load is rejected."""
    import fairseq_ext  # noqa: F401  (installs the safe globals)
    from fairseq import checkpoint_utils

    marker = "/tmp/fairseq_ext_pwned"
    if os.path.exists(marker):
        os.remove(marker)
    from fairseq_ext.compat import CheckpointError, load_checkpoint

    bad = tmp_path / "bad.pt"
    torch.save({"model": {}, "args": _Exploit()}, bad)
    for load in (checkpoint_utils.load_checkpoint_to_cpu, load_checkpoint):
        with pytest.raises(CheckpointError, match=f"refused to load {bad}: unpickling it would import and call "
                                                  f"posix.system") as info:
            load(str(bad))
        assert "weights_only=False" not in str(info.value)  # torch's advice would run the file's code
    assert not os.path.exists(marker)


@pytest.mark.parametrize("content,problem", [
    (b"", "is empty (0 bytes)"), (random.Random(3000).randbytes(3000), "is truncated or not a torch checkpoint (3,000 bytes"),
    ("half", "is truncated or not a torch checkpoint")])
def test_unloadable_checkpoint_says_what_is_wrong(content, problem, tmp_path):
    import fairseq_ext  # noqa: F401
    from fairseq import checkpoint_utils

    from fairseq_ext.compat import CheckpointError, load_checkpoint

    path = tmp_path / "checkpoint.pt"
    if content == "half":
        torch.save({"model": {"w": torch.randn(300, 300)}}, path)
        content = path.read_bytes()[:50_000]
    path.write_bytes(content)
    for load in (checkpoint_utils.load_checkpoint_to_cpu, load_checkpoint):
        with pytest.raises(CheckpointError, match=re.escape(f"cannot load {path}: it {problem}")):
            load(str(path))


def test_fast_generate_translates_as_fairseq_generate(trained, tiny_data):
    """fairseq-ext-generate (the fast decoding path) takes fairseq-generate's flags and prints the same
    hypotheses and BLEU."""
    save, _, _ = trained
    flags = [str(tiny_data / "bin"), "--user-dir", USER_DIR, "--cpu", "--path", str(save / "checkpoint_last.pt"),
             "--gen-subset", "test", "--beam", "5", "--batch-size", "8", "--lenpen", "0.6", "--scoring", "sacrebleu"]
    outs = [run([cmd, *flags]).stdout for cmd in ("fairseq-generate", "fairseq-ext-generate")]

    def hyps(out):
        return sorted((l.split("\t")[0], l.split("\t")[2]) for l in out.splitlines() if l.startswith("H-"))

    assert len(hyps(outs[0])) == 100 and hyps(outs[1]) == hyps(outs[0])
    bleu = [l for out in outs for l in out.splitlines() if l.startswith("Generate test")]
    assert len(bleu) == 2 and bleu[0] == bleu[1]


def test_bf16_generate_translates_as_fairseq_generate_on_the_rounded_checkpoint(trained, tiny_data, tmp_path):
    """fairseq-ext-generate --bf16 on a CPU (weights rounded to bf16 and read as bf16, float32 arithmetic;
    the encoder under bf16 autocast where this CPU's bf16 products are fast) prints the hypotheses and BLEU
    of fairseq-generate on a checkpoint whose weights are rounded to bf16, its encoder run the same way;
    combined with --int8 it refuses, naming both flags."""
    save, _, _ = trained
    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    state["model"] = {k: v.bfloat16().float() if v.dtype == torch.float32 else v for k, v in state["model"].items()}
    torch.save(state, tmp_path / "rounded.pt")
    flags = [str(tiny_data / "bin"), "--user-dir", USER_DIR, "--cpu", "--gen-subset", "test", "--beam", "5",
             "--batch-size", "8", "--scoring", "sacrebleu"]
    reference = ("import sys, fairseq.sequence_generator as sg; "
                 "from fairseq_ext.decoding.encoder import EncoderMixin, bf16_encoder_reason; "
                 "sg.EnsembleModel = type('E', (EncoderMixin, sg.EnsembleModel), "
                 "{'encoder_bf16': bf16_encoder_reason() is None}); "
                 "from fairseq_cli.generate import cli_main; sys.argv[0] = 'fairseq-generate'; cli_main()")
    ref = run([sys.executable, "-c", reference, *flags, "--path", str(tmp_path / "rounded.pt")]).stdout
    out = run(["fairseq-ext-generate", *flags, "--path", str(save / "checkpoint_last.pt"), "--bf16"]).stdout

    def hyps(text):
        return sorted((l.split("\t")[0], l.split("\t")[2]) for l in text.splitlines() if l.startswith("H-"))

    assert len(hyps(ref)) == 100 and hyps(out) == hyps(ref)
    bleu = [l for text in (ref, out) for l in text.splitlines() if l.startswith("Generate test")]
    assert len(bleu) == 2 and bleu[0] == bleu[1]
    bad = subprocess.run(["fairseq-ext-generate", *flags, "--path", str(save / "checkpoint_last.pt"), "--bf16",
                          "--int8"], cwd=REPO, env=clean_env(), capture_output=True, text=True)
    assert bad.returncode != 0 and "--bf16" in bad.stderr and "--int8" in bad.stderr


def test_python_loading_translates_as_fairseq_interactive():
    """README's Python example (fairseq's hub interface after `import fairseq_ext`) on the shipped model gives
    fairseq-interactive's translations (README's command-line example), beam 5."""
    import subprocess

    import fairseq_ext  # noqa: F401  (registers the package's models: any arch loads this way)
    from fairseq.models.transformer import TransformerModel

    from conftest import clean_env

    model_dir = os.path.join(REPO, "shipped", "en-de-small-baseline")
    sentences = ["The house is small.", "Thank you very much.", "Where is the station?"]
    hub = TransformerModel.from_pretrained(model_dir, checkpoint_file="checkpoint.pt", data_name_or_path=model_dir,
                                           bpe="sentencepiece", sentencepiece_model=os.path.join(model_dir, "spm.model"),
                                           source_lang="en", target_lang="de")
    hub.eval()
    python = hub.translate(sentences, beam=5)
    p = subprocess.run(
        ["fairseq-interactive", model_dir, "--user-dir", USER_DIR, "--cpu", "--path",
         os.path.join(model_dir, "checkpoint.pt"), "--source-lang", "en", "--target-lang", "de", "--beam", "5",
         "--bpe", "sentencepiece", "--sentencepiece-model", os.path.join(model_dir, "spm.model")],
        input="\n".join(sentences) + "\n", capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    cli = [line.split("\t")[2] for line in p.stdout.splitlines() if line.startswith("D-")]
    assert python == cli and all(python), (python, cli)
