"""Helpers of the shared architecture matrix: build any registered arch from CLI-style args."""
import argparse
import copy
import functools

import torch

from conftest import USER_DIR  # noqa: F401  (re-exported for the tests)
from fairseq_ext.tools.params import is_language_model as is_lm  # noqa: F401  (re-exported for the tests)


def matrix_archs():
    """Stock transformer first, then every *_tiny arch this package registers (discovered from
    fairseq's registry: registering a new *_tiny arch puts it in the matrix)."""
    import fairseq_ext  # noqa: F401
    from fairseq_ext.models import package_archs

    return ["transformer_tiny"] + [a for a in package_archs() if a.endswith("_tiny")]


def cli_args(data_dir, arch, extra=(), save_dir=None, share_flag=True):
    """The CLI-style argument list (what a user types): translation EN-DE, or language modelling on the
    German side (one sentence per sample) for an LM arch. share_flag=False leaves out --share-all-embeddings
    (what the arch does by itself)."""
    if is_lm(arch):
        task = [str(data_dir / "lm-bin"), "--task", "language_modeling", "--tokens-per-sample", "64",
                "--sample-break-mode", "eos"]
    else:
        task = [str(data_dir / "bin"), "--task", "translation", "--source-lang", "en", "--target-lang", "de"]
        task += ["--share-all-embeddings"] if share_flag else []
    argv = task + [
        "--user-dir", USER_DIR, "--arch", arch, "--cpu",
        "--optimizer", "adam", "--lr", "0.003", "--lr-scheduler", "fixed",
        "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--max-tokens", "2000", "--dropout", "0.0", "--seed", "7", "--no-progress-bar",
    ]
    if save_dir is not None:
        argv += ["--save-dir", str(save_dir)]
    return argv + [str(x) for x in extra]


@functools.lru_cache(maxsize=None)
def _config(argv):
    """fairseq-train's config for an argument list: its parser, then fairseq's conversion to the structured
    config (hydra's compose: ~0.5 s a call, so each list is converted once per test process). An error is
    not cached: a bad flag fails every time."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), list(argv)))


def config(data_dir, arch, extra=(), save_dir=None, share_flag=True):
    """A private copy of fairseq-train's config: nothing a test or a model build changes in it (building a
    legacy arch writes into cfg.model, an argparse.Namespace inside the DictConfig) reaches another build."""
    from fairseq.dataclass.utils import omegaconf_no_object_check

    cfg = copy.deepcopy(_config(tuple(cli_args(data_dir, arch, extra, save_dir, share_flag))))
    with omegaconf_no_object_check():
        for k in list(cfg.keys()):
            if isinstance(cfg[k], argparse.Namespace):  # deepcopy of a DictConfig shares these
                cfg[k] = copy.deepcopy(cfg[k])
    return cfg


def build(data_dir, arch, extra=(), save_dir=None, share_flag=True):
    """(cfg, task, model, criterion) as fairseq-train builds them."""
    from fairseq import tasks

    cfg = config(data_dir, arch, extra, save_dir, share_flag)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    return cfg, task, model, criterion


def fixed_batch(task, n=6, split="valid"):
    """A padded batch of real sentence pairs, collated by fairseq (left-padded sources), or of real
    sentences for a language-modelling task (right-padded)."""
    task.load_dataset(split)
    ds = task.dataset(split)
    return ds.collater([ds[i] for i in range(n)])


def eval_loss(model, criterion, sample):
    model.eval()
    with torch.no_grad():
        loss, sample_size, _ = criterion(model, sample)
    return (loss / sample_size).item()
