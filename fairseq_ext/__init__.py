"""fairseq_ext: efficient Transformer variants as a fairseq 0.12 plugin.

Use with fairseq's tools via `--user-dir fairseq_ext` (or `import fairseq_ext` in Python). Importing
applies the torch/fairseq compatibility layer and registers every architecture of the package.
Importing twice (user-dir and import) is harmless: registration is idempotent.
"""
from . import compat  # noqa: F401  (must come first: checkpoint loading, registry guard)
from . import models  # noqa: F401  (registers every architecture)
from . import optim  # noqa: F401  (registers the optimizers: adam_no_decay_gains)

__version__ = "0.1.0"
