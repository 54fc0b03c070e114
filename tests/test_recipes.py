"""The shell recipes run end to end (tiny sizes, a few updates): what a user copies must work."""
import os

import pytest

from conftest import REPO, clean_env, machine_precision, run


@pytest.mark.heavy
def test_one_wide_ffn_compare_recipe(tiny_data, tmp_path):
    out = tmp_path / "owf"
    p = run(["bash", os.path.join(REPO, "examples/one_wide_ffn/compare.sh"), str(tiny_data.parent / "corpus"),
             str(out), "6", "tiny"], VOCAB="1000", EVAL_FLAGS="--max-len-a 1 --max-len-b 5")
    table = (out / "results.md").read_text()
    for row in ("| baseline |", "| one_wide_ffn |", "| copy source (trivial) |"):
        assert row in table, table
    assert "100 test sentences" in table and "BLEU nrefs:1" in table
    assert "sentences" in p.stdout


@pytest.mark.heavy
def test_can_distillation_recipe(trained, tiny_data, tmp_path):
    """The transformer_tiny checkpoint of the CLI fixture is the teacher; a tiny CAN student trains on
    its translations of the 2,000 training sentences."""
    save, _, _ = trained
    out = tmp_path / "kd"
    p = run(["bash", os.path.join(REPO, "examples/can/distill.sh"), str(save / "checkpoint_last.pt"),
             str(tiny_data), str(out), "can_tiny", "--max-update", "3", "--no-save"],
            GEN_FLAGS="--max-len-a 1 --max-len-b 5")
    assert "distilled 2000 training pairs" in p.stdout
    lines = (out / "tok" / "train.de").read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2000 and sum(bool(l.strip()) for l in lines) > 1000
    assert "done training" in p.stdout + p.stderr


@pytest.mark.heavy
def test_scaling_sparse_compare_recipe(tiny_data, tmp_path):
    """Dense vs sparse FFN+QKV at tiny size through fairseq-train / fairseq-generate (beam 5):
    the table carries the valid perplexity of each run."""
    out = tmp_path / "sparse"
    run(["bash", os.path.join(REPO, "examples/scaling_sparse/compare.sh"), str(tiny_data.parent / "corpus"),
         str(out), "6", "tiny"], VOCAB="1000", EVAL_FLAGS="--max-len-a 1 --max-len-b 5")
    table = (out / "results.md").read_text()
    assert "| model | parameters | valid ppl | BLEU |" in table, table
    for row in ("| dense |", "| sparse_ff_qkv |", "| copy source (trivial) |"):
        assert row in table, table
    assert "100 test sentences" in table


@pytest.mark.heavy
def test_sas_translation_recipe(tiny_data, tmp_path):
    """sas_block (adam_no_decay_gains) vs the baseline through fairseq-train / fairseq-generate."""
    out = tmp_path / "sas"
    run(["bash", os.path.join(REPO, "examples/sas/compare.sh"), str(tiny_data.parent / "corpus"),
         str(out), "6", "tiny"], VOCAB="1000", EVAL_FLAGS="--max-len-a 1 --max-len-b 5")
    table = (out / "results.md").read_text()
    for row in ("| dense |", "| sas_block |"):
        assert row in table, table


@pytest.mark.heavy
def test_sas_code_lm_recipe(tmp_path):
    """The code-LM pipeline end to end on the first 60 files of the repository's code corpus (data/code,
    prepare-code.sh's default): split, SentencePiece, binarize, the four blocks, curves."""
    assert os.path.exists(os.path.join(REPO, "data", "code", "python_stdlib.txt.gz"))
    data = tmp_path / "code"
    run(["bash", os.path.join(REPO, "examples/sas/prepare-code.sh"), str(data), "--max-files", "60",
         "--vocab", "500"])
    assert not (data / "python_stdlib.txt.gz").exists()  # the committed corpus was used, not a rebuild
    out = tmp_path / "cmp"
    run(["bash", os.path.join(REPO, "examples/sas/compare_lm.sh"), str(data / "bin"), str(out), "4", "tiny"],
        VALID_EVERY="2", LOG_INTERVAL="1")
    table = (out / "curves.md").read_text()
    for block in ("preln", "sas", "sas_p", "sas_p_nonorm"):
        assert f"| {block} |" in table, table
    assert (out / "curves.png").stat().st_size > 10000


@pytest.mark.heavy
def test_terraformer_synthetic_recipe(tmp_path):
    """Copy-task data, a Terraformer trained 2 updates, greedy decoding of valid and test, the scores."""
    import json
    import subprocess

    data, save = tmp_path / "data", tmp_path / "tf"
    run(["bash", os.path.join(REPO, "examples/terraformer/synthetic.sh"), "copy", "terraformer", str(data), str(save),
         "--max-tokens", "1000"], TRAIN="200", VALID="8", TEST="4", MAX_UPDATE="2")
    symbols = {line.split()[0] for line in (data / "bin" / "dict.src.txt").read_text().splitlines()}
    assert set("0123456789") <= symbols  # one token per digit
    for split, n in (("valid", 8), ("test", 4)):
        score = json.loads((save / f"score-{split}.json").read_text())
        assert score["examples"] == n and 0 <= score["token_accuracy"] <= 100
    # the data carries its DATA_FORMAT version (data of another version is made again); a bad TASK is refused
    from fairseq_ext.tools.synthetic import DATA_FORMAT

    assert (data / "bin" / "format").read_text().strip() == str(DATA_FORMAT["copy"])
    bad = subprocess.run(["bash", os.path.join(REPO, "examples/terraformer/synthetic.sh"), "multiply", "terraformer",
                          str(tmp_path / "d3"), str(tmp_path / "tf3")], cwd=REPO, env=clean_env(),
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "TASK multiply: choose copy or addition" in bad.stderr, bad.stderr


def test_terraformer_translation_recipe(tiny_data, tmp_path):
    save = tmp_path / "tf"
    p = run(["bash", os.path.join(REPO, "examples/terraformer/train.sh"), "tiny", str(tiny_data / "bin"), str(save),
             "--max-update", "2", "--no-epoch-checkpoints"])
    assert (save / "checkpoint_last.pt").exists() and "done training" in p.stdout + p.stderr


@pytest.mark.heavy
def test_train_recipe_allocator(tiny_data, tmp_path):
    """examples/train.sh on a CPU preloads tcmalloc when the linker cache has it (ALLOCATOR=system keeps
    glibc's): the allocator changes no number, so both runs log the same losses; a bad ALLOCATOR is refused.
    Both train in this machine's precision (bf16 autocast where the CPU has native bf16, else fp32)."""
    import re
    import subprocess

    precision = machine_precision()
    has_tcmalloc = "libtcmalloc_minimal.so.4 " in subprocess.run(["ldconfig", "-p"], capture_output=True,
                                                                  text=True).stdout
    logs = {}
    for alloc in ("auto", "system"):
        p = run(["bash", os.path.join(REPO, "examples/train.sh"), str(tiny_data / "bin"), str(tmp_path / alloc),
                 "--arch", "transformer_tiny", "--share-all-embeddings", "--max-update", "4", "--log-interval", "1",
                 "--disable-validation", "--no-save", "--num-workers", "0"],
                ALLOCATOR=alloc, PRECISION=precision, OMP_NUM_THREADS="1")
        out = p.stdout + p.stderr
        assert ("memory allocator: tcmalloc" in out) == (has_tcmalloc and alloc == "auto"), out[-2000:]
        logs[alloc] = re.findall(r"\bloss[ =]([0-9.]+).*?nll_loss[ =]([0-9.]+).*?num_updates[ =](\d+).*?"
                                 r"gnorm[ =]([0-9.]+)", out)
    assert len(logs["auto"]) >= 4 and logs["auto"] == logs["system"], logs
    p = subprocess.run(["bash", os.path.join(REPO, "examples/train.sh"), str(tiny_data / "bin"), str(tmp_path / "bad")],
                       env={**os.environ, "ALLOCATOR": "jemalloc"}, capture_output=True, text=True)
    assert p.returncode == 2 and "ALLOCATOR=jemalloc: use auto or system" in p.stderr
