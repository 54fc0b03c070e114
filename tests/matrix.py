"""Helpers of the shared architecture matrix: build any registered arch from CLI-style args."""
import torch

from conftest import USER_DIR  # noqa: F401  (re-exported for the tests)
from fairseq_ext.tools.params import is_language_model as is_lm  # noqa: F401  (re-exported for the tests)


def matrix_archs():
    """Stock transformer first, then every *_tiny arch this package registers (discovered from
    fairseq's registry: registering a new *_tiny arch puts it in the matrix)."""
    import fairseq_ext  # noqa: F401
    from fairseq_ext.models import package_archs

    return ["transformer_tiny"] + [a for a in package_archs() if a.endswith("_tiny")]


def parse_args(data_dir, arch, extra=(), save_dir=None, share_flag=True):
    """fairseq-train's own parser over a CLI-style argument list (what a user types): translation
    EN-DE, or language modelling on the German side (one sentence per sample) for an LM arch.
    share_flag=False leaves out --share-all-embeddings (what the arch does by itself)."""
    from fairseq import options

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
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, argv + list(extra))


def build(data_dir, arch, extra=(), save_dir=None, share_flag=True):
    """(cfg, task, model, criterion) as fairseq-train builds them."""
    from fairseq import tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = parse_args(data_dir, arch, extra, save_dir, share_flag)
    cfg = convert_namespace_to_omegaconf(args)
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
