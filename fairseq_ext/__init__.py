"""fairseq_ext: efficient Transformer variants as a fairseq 0.12 plugin.

Use with fairseq's tools via `--user-dir fairseq_ext` (or `import fairseq_ext` in Python). Importing
applies the torch/fairseq compatibility layer and registers every architecture of the package.
Importing twice (user-dir and import) is harmless: registration is idempotent.

FAIRSEQ_EXT_OPS_ONLY=1 imports the package without fairseq (nothing is registered): the kernels in
fairseq_ext.ops and the tools that need only torch, e.g. the CUDA kernel tests on a GPU machine whose
Python has no fairseq (scripts/gpu_check.sh).
"""
import logging as _logging
import os as _os


class _NoTensorboardXHint(_logging.Filter):
    """fairseq's text_to_speech task logs "Please install tensorboardX" at INFO when it is imported (any
    fairseq import loads it). The package prints nothing on import and tensorboardX is optional
    (--tensorboard-logdir), so that one message is dropped; the logger's other messages pass."""

    def filter(self, record):
        return not str(record.msg).startswith("Please install tensorboardX")


_tts_logger = _logging.getLogger("fairseq.tasks.text_to_speech")
if not any(type(f).__name__ == "_NoTensorboardXHint" for f in _tts_logger.filters):
    _tts_logger.addFilter(_NoTensorboardXHint())

if _os.environ.get("FAIRSEQ_EXT_OPS_ONLY") != "1":
    try:
        import fairseq  # noqa: F401
    except ModuleNotFoundError as _e:
        if _e.name != "fairseq":
            raise
        raise ModuleNotFoundError(
            "fairseq_ext is a fairseq 0.12 plugin and needs fairseq in this environment: on Python 3.11 "
            "`pip install --no-deps fairseq-fixed==0.12.3.1` plus its runtime dependencies (README: Install "
            "into your environment); FAIRSEQ_EXT_OPS_ONLY=1 imports only the kernels", name="fairseq") from None
    from . import compat  # noqa: F401  (must come first: checkpoint loading, registry guard)
    from . import models  # noqa: F401  (registers every architecture)
    from . import optim  # noqa: F401  (registers the optimizers: adam_no_decay_gains)
    from . import checkpointing as _checkpointing
    from . import precision as _precision

    _checkpointing.install()  # atomic checkpoints, exact resume, finished runs stay finished
    _precision.install()  # --bf16 on a CPU training run: autocast with fp32 weights

__version__ = "0.1.0"
