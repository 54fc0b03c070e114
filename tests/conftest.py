"""Shared fixtures: a small binarized EN-DE set cut from the committed sample, and model builders."""
import functools
import gzip
import os
import subprocess
import sys

import pytest
import torch


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "fairseq_ext")
SAMPLE = os.path.join(REPO, "data", "en-de-sample")
BIN = os.path.dirname(sys.executable)  # .venv/bin: fairseq-train etc.

# Threads of this test process and of the commands it runs: the cores shared among pytest-xdist's workers
# (`make test` runs one worker per core), at most 2.
THREADS = max(1, min(2, (os.cpu_count() or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))))
torch.set_num_threads(THREADS)


def pytest_configure(config):
    config.addinivalue_line("markers", "heavy(minutes=1): takes about that long on 2 cores; scheduled first, "
                                       "longest first (pytest_collection_modifyitems)")


def _minutes(item):
    mark = item.get_closest_marker("heavy")
    return 0 if mark is None else (mark.args[0] if mark.args else 1)


def pytest_collection_modifyitems(session, config, items):
    """The heavy tests first, longest first: `make test` (pytest-xdist --dist worksteal) gives them to one
    worker at the start while the other runs the short in-process tests, then takes tests from the busier
    worker's queue as it frees up; no worker ends waiting on a long test started late. (Two workers both on
    heavy tests, each of which starts processes of its own, ran the suite 1.3x slower: --dist load.)"""
    items.sort(key=lambda item: -_minutes(item))


def clean_env(**extra):
    """The environment of a CLI run: no torch.load override anywhere (checkpoints must load as is)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.setdefault("OMP_NUM_THREADS", str(THREADS))
    env.update(extra)
    return env


@functools.lru_cache(maxsize=None)
def machine_precision():
    """The precision this machine trains in (fairseq_ext/tools/precision.py): bf16 where the CPU has native
    bf16, else fp32 (tests that train choose by it: emulated bf16 is many times slower)."""
    from fairseq_ext.tools.precision import choose

    return choose()["precision"]


def run(cmd, cwd=REPO, timeout=600, **env):
    p = subprocess.run(cmd, cwd=cwd, env=clean_env(**env), capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"command failed ({p.returncode}): {' '.join(cmd)}\n--- stdout\n{p.stdout[-4000:]}"
                             f"\n--- stderr\n{p.stderr[-6000:]}")
    return p


def _cut(src, dst, name, n):
    with gzip.open(os.path.join(src, name), "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(n)]
    with gzip.open(os.path.join(dst, name), "wt", encoding="utf-8") as f:
        f.writelines(lines)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """Binarized data dir (joined dictionary, SentencePiece 1000) from the first lines of the sample:
    2,000 training pairs, 100 valid, 100 test. Returns the dir with bin/, spm.model, tok/, and lm-bin/
    (the German side binarized for --task language_modeling)."""
    root = tmp_path_factory.mktemp("tiny_data")
    corpus = root / "corpus"
    corpus.mkdir()
    for split, n in (("train", 2000), ("valid", 100), ("test", 100)):
        for lang in ("en", "de"):
            _cut(SAMPLE, corpus, f"{split}.{lang}.gz", n)
    data = root / "data"
    run(["bash", os.path.join(REPO, "examples/data/binarize.sh"), str(corpus), str(data), "--vocab", "1000"])
    # the German side as a language-modelling set (lm-bin/, same dictionary) for the LM archs
    lm_tok = data / "lm-tok"
    lm_tok.mkdir()
    for split in ("train", "valid", "test"):
        (lm_tok / split).write_bytes((data / "tok" / f"{split}.de").read_bytes())
    run(["fairseq-preprocess", "--only-source", "--trainpref", str(lm_tok / "train"), "--validpref",
         str(lm_tok / "valid"), "--testpref", str(lm_tok / "test"), "--srcdict", str(data / "bin" / "dict.de.txt"),
         "--destdir", str(data / "lm-bin"), "--workers", "2"])
    return data


@pytest.fixture(scope="session")
def trained(tiny_data, tmp_path_factory):
    """transformer_tiny trained by fairseq-train for 30 updates, then resumed to 40 (checkpoints every
    10 updates, BLEU validation); returns (save_dir, first run's log, resumed run's log)."""
    save = tmp_path_factory.mktemp("ckpt")
    common = [str(tiny_data / "bin"), "--user-dir", USER_DIR, "--cpu", "--task", "translation",
              "--source-lang", "en", "--target-lang", "de", "--arch", "transformer_tiny",
              "--share-all-embeddings", "--optimizer", "adam", "--lr", "2e-3",
              "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "10",
              "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
              "--max-tokens", "2000", "--save-dir", str(save), "--save-interval-updates", "10",
              "--keep-interval-updates", "3", "--log-format", "simple", "--log-interval", "5", "--seed", "3",
              # BLEU validation stores numpy values in the checkpoint: resume must still load it
              "--eval-bleu", "--eval-bleu-detok", "space", "--eval-bleu-remove-bpe", "sentencepiece",
              "--eval-bleu-args", '{"beam": 1, "max_len_b": 20}',
              "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]
    first = run(["fairseq-train", *common, "--max-update", "30"])
    resumed = run(["fairseq-train", *common, "--max-update", "40"])
    return save, first.stdout + first.stderr, resumed.stdout + resumed.stderr
