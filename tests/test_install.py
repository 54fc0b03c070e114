"""The package as a researcher installs it into their own environment, and the recipes' language pair.

test_installed_copy_*: `pip install --no-deps --no-build-isolation .` of this repository (non-editable,
FAIRSEQ_EXT_NO_BUILD=1: no C++ extension) into a folder that stands for their site-packages, then
fairseq-train and fairseq-generate run from another folder with `--user-dir "$(python -m fairseq_ext.path)"`.
A sitecustomize hook takes the dev venv's editable install of fairseq_ext out of those processes and
records which fairseq_ext each imported (the installed copy) and whether a C++ extension was loaded (no).

test_recipes_take_the_language_pair: examples/data/binarize.sh, train.sh and evaluate.sh on a tiny corpus
whose files are named fr/it instead of en/de.
"""
import gzip
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, SAMPLE, clean_env, run

ORIGIN_HOOK = '''
import atexit, os, sys

# The dev venv's editable install of fairseq_ext is a finder on sys.meta_path that also resolves submodules
# the installed copy lacks (it would hand it this repository's fairseq_ext._C): drop it, as a researcher's
# environment has no such finder.
sys.meta_path[:] = [f for f in sys.meta_path
                    if not getattr(f, "__module__", "").startswith("__editable___fairseq_ext")]

def _origin():
    m = sys.modules.get("fairseq_ext")
    if m is not None:
        with open(os.environ["FAIRSEQ_EXT_ORIGIN_LOG"], "a") as f:
            f.write(f"{os.path.basename(sys.argv[0])}\\t{m.__file__}\\t{'fairseq_ext._C' in sys.modules}\\n")

atexit.register(_origin)
'''


def _stage_sources(dst):
    """What the repository's setup.py packages, copied so that the build leaves nothing in the repo
    (setuptools writes build/ and *.egg-info beside setup.py) and sees no built extension."""
    for name in ("setup.py", "pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(os.path.join(REPO, name), dst / name)
    shutil.copytree(os.path.join(REPO, "fairseq_ext"), dst / "fairseq_ext",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc", "*.egg-info"))


def test_installed_copy_trains_and_decodes_from_any_folder(tiny_data, tmp_path):
    src, site, hook, elsewhere = (tmp_path / d for d in ("src", "site", "hook", "elsewhere"))
    for d in (src, hook, elsewhere):
        d.mkdir()
    _stage_sources(src)
    run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-build-isolation", "--no-compile", "--target", str(site), str(src)],
        cwd=str(tmp_path), FAIRSEQ_EXT_NO_BUILD="1")
    pkg = site / "fairseq_ext"
    assert (pkg / "__init__.py").is_file() and (pkg / "models" / "one_wide_ffn.py").is_file()
    assert not list(pkg.glob("_C*.so")), "FAIRSEQ_EXT_NO_BUILD=1 must leave the extension out"
    meta = (site / "fairseq_ext-0.1.0.dist-info" / "METADATA").read_text().splitlines()
    requires = [line.split(":", 1)[1].strip() for line in meta if line.startswith("Requires-Dist:")]
    assert "torch>=2.1" in requires and not any(r.startswith("fairseq") for r in requires), requires
    assert (site / "bin" / "fairseq-ext-user-dir").is_file()

    (hook / "sitecustomize.py").write_text(ORIGIN_HOOK)
    log = tmp_path / "origin.log"
    env = dict(PYTHONPATH=f"{hook}{os.pathsep}{site}", FAIRSEQ_EXT_ORIGIN_LOG=str(log), OMP_NUM_THREADS="1")
    # what README's install section tells the researcher to pass to --user-dir
    user_dir = run([sys.executable, "-m", "fairseq_ext.path"], cwd=str(elsewhere), **env).stdout
    assert user_dir == f"{pkg}\n"
    save = tmp_path / "ckpt"
    run(["fairseq-train", str(tiny_data / "bin"), "--user-dir", user_dir.strip(), "--cpu",
         "--task", "translation", "--source-lang", "en", "--target-lang", "de", "--arch", "one_wide_ffn_tiny",
         "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3", "--criterion", "cross_entropy",
         "--max-tokens", "2000", "--max-update", "3", "--disable-validation", "--no-epoch-checkpoints",
         "--save-dir", str(save), "--num-workers", "0", "--log-format", "simple", "--seed", "1"],
        cwd=str(elsewhere), **env)
    assert (save / "checkpoint_last.pt").is_file()
    gen = run(["fairseq-generate", str(tiny_data / "bin"), "--user-dir", user_dir.strip(), "--cpu",
               "--path", str(save / "checkpoint_last.pt"), "--gen-subset", "test", "--beam", "2",
               "--max-len-a", "0", "--max-len-b", "8", "--batch-size", "50", "--num-workers", "0"],
              cwd=str(elsewhere), **env).stdout
    assert sum(line.startswith("H-") for line in gen.splitlines()) == 100  # every test sentence decoded

    origins = [line.split("\t") for line in log.read_text().splitlines()]
    assert sorted({prog for prog, _, _ in origins}) == ["fairseq-generate", "fairseq-train", "path.py"], origins
    for prog, file, extension in origins:
        assert file == str(pkg / "__init__.py"), f"{prog} imported {file}, not the installed copy"
        assert extension == "False", f"{prog} loaded a C++ extension the install left out"


@pytest.mark.heavy
def test_recipes_take_the_language_pair(tmp_path):
    """The sample's en/de files renamed fr/it (200 / 20 / 20 lines): binarize.sh --src fr --tgt it names
    the dictionaries and binaries fr/it; train.sh (SRC/TGT) trains on them and evaluate.sh (--src/--tgt)
    translates and scores the fr test set."""
    corpus, out = tmp_path / "corpus", tmp_path / "fr-it"
    corpus.mkdir()
    for split, n in (("train", 200), ("valid", 20), ("test", 20)):
        for old, new in (("en", "fr"), ("de", "it")):
            with gzip.open(os.path.join(SAMPLE, f"{split}.{old}.gz"), "rt", encoding="utf-8") as f:
                lines = [next(f) for _ in range(n)]
            with gzip.open(corpus / f"{split}.{new}.gz", "wt", encoding="utf-8") as f:
                f.writelines(lines)
    p = run(["bash", os.path.join(REPO, "examples/data/binarize.sh"), str(corpus), str(out), "--src", "fr",
             "--tgt", "it", "--vocab", "300"])
    assert "binarized fr-it" in p.stdout
    bin_dir = out / "bin"
    names = {f.name for f in bin_dir.iterdir()}
    assert {"dict.fr.txt", "dict.it.txt", "spm.model"} <= names and "dict.en.txt" not in names, names
    for split in ("train", "valid", "test"):
        for lang in ("fr", "it"):
            assert {f"{split}.fr-it.{lang}.bin", f"{split}.fr-it.{lang}.idx"} <= names, names
            assert (out / "tok" / f"{split}.{lang}").is_file()

    save = tmp_path / "ckpt"
    run(["bash", os.path.join(REPO, "examples/train.sh"), str(bin_dir), str(save), "--arch", "transformer_tiny",
         "--share-all-embeddings", "--max-update", "2", "--max-tokens", "2000", "--disable-validation",
         "--no-epoch-checkpoints", "--num-workers", "0"], SRC="fr", TGT="it", PRECISION="fp32", OMP_NUM_THREADS="1")
    run(["bash", os.path.join(REPO, "examples/evaluate.sh"), str(bin_dir), str(corpus), str(tmp_path / "eval"),
         "--src", "fr", "--tgt", "it", "--beam", "1", "--max-len-a", "0", "--max-len-b", "5"],
        CKPT=str(save / "checkpoint_last.pt"), OMP_NUM_THREADS="1")
    eval_bin = {f.name for f in (tmp_path / "eval" / "bin").iterdir()}
    assert {"test.fr-it.fr.bin", "test.fr-it.it.bin"} <= eval_bin, eval_bin
    gen = (tmp_path / "eval" / "generate.out").read_text()
    assert sum(line.startswith("H-") for line in gen.splitlines()) == 20
    assert (tmp_path / "eval" / "score.json").is_file()

    # TEST_BIN=binarize.sh's bin/: its test split is evaluate.sh's own binarization byte for byte, decoded as is
    for f in ("fr.bin", "fr.idx", "it.bin", "it.idx"):
        assert (bin_dir / f"test.fr-it.{f}").read_bytes() == (tmp_path / "eval" / "bin" / f"test.fr-it.{f}").read_bytes()
    evaluate = ["bash", os.path.join(REPO, "examples/evaluate.sh"), str(bin_dir), str(corpus), str(tmp_path / "eval2"),
                "--src", "fr", "--tgt", "it", "--beam", "1", "--max-len-a", "0", "--max-len-b", "5"]
    run(evaluate, CKPT=str(save / "checkpoint_last.pt"), OMP_NUM_THREADS="1", TEST_BIN=str(bin_dir))
    assert not (tmp_path / "eval2" / "bin").exists()
    hyps = lambda d: sorted(l for l in (d / "generate.out").read_text().splitlines() if l[:2] in ("H-", "D-"))  # noqa: E731
    assert hyps(tmp_path / "eval2") == hyps(tmp_path / "eval")
    own, reused = (json.loads((tmp_path / d / "score.json").read_text()) for d in ("eval", "eval2"))
    assert (reused["bleu"], reused["chrf"]) == (own["bleu"], own["chrf"])
    # ... and one binarized with another dictionary is refused, naming the file and the fix
    other = tmp_path / "other-bin"
    shutil.copytree(bin_dir, other)
    with open(other / "dict.fr.txt", "a", encoding="utf-8") as f:
        f.write("autre 1\n")
    bad = subprocess.run(evaluate, cwd=REPO, env=clean_env(CKPT=str(save / "checkpoint_last.pt"), TEST_BIN=str(other)),
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "its dict.fr.txt is not" in bad.stderr and "unset TEST_BIN" in bad.stderr, bad.stderr
