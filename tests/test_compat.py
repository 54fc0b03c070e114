"""The compatibility layer: double import, fairseq data batching, checkpoint loading safety."""
import subprocess
import sys

import numpy as np

from conftest import clean_env
from matrix import USER_DIR


def _python(code):
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", env=clean_env())
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def test_import_then_user_dir_then_reload():
    out = _python(f"""
import argparse, importlib
import fairseq_ext
from fairseq import utils
utils.import_user_module(argparse.Namespace(user_dir={USER_DIR!r}))
import fairseq_ext.models.baseline as b
importlib.reload(b)  # re-executes every register_* call
from fairseq.models import ARCH_MODEL_REGISTRY
print(sorted(a for a in ARCH_MODEL_REGISTRY if a.startswith('transformer_balanced')))
""")
    assert "transformer_balanced_tiny" in out


def test_user_dir_then_import():
    out = _python(f"""
import argparse
from fairseq import utils
utils.import_user_module(argparse.Namespace(user_dir={USER_DIR!r}))
import fairseq_ext
from fairseq_ext.models import package_archs
print(package_archs())
""")
    assert "transformer_balanced" in out


def test_batch_by_size_keeps_the_last_partial_batch():
    import fairseq_ext  # noqa: F401
    from fairseq.data import data_utils

    sizes = np.random.RandomState(0).randint(1, 60, size=101)
    indices = np.argsort(sizes, kind="mergesort").astype(np.int64)
    for kwargs in ({"max_tokens": 4000}, {"max_sentences": 8}, {"max_tokens": 500}):
        for vec in (None, sizes[indices]):
            batches = data_utils.batch_by_size(indices, lambda i: sizes[i], num_tokens_vec=vec,
                                               required_batch_size_multiple=8, **kwargs)
            got = np.concatenate(batches)
            assert sorted(got.tolist()) == list(range(101)), kwargs
            assert all(len(b) % 8 == 0 for b in batches[:-1])


def test_extension_is_optional():
    """Without the compiled extension the package still imports and registers everything."""
    out = _python("""
import sys
sys.modules['fairseq_ext._C'] = None  # makes `from .. import _C` raise ImportError
import fairseq_ext, fairseq_ext.ops as ops
from fairseq_ext.models import package_archs
print(ops.extension_loaded(), ops.kernels_enabled(), len(package_archs()))
""")
    assert out.split()[:2] == ["False", "False"]


def test_extension_built_by_bootstrap():
    """scripts/bootstrap.sh builds fairseq_ext._C; it must load (unless deliberately skipped)."""
    import os

    import fairseq_ext.ops as ops

    if os.environ.get("FAIRSEQ_EXT_NO_BUILD") == "1":
        assert not ops.extension_loaded() or ops.build_info()
        return
    assert ops.extension_loaded(), ops.build_info()
    assert "torch" in ops.build_info()


def test_import_prints_nothing():
    """`import fairseq_ext` writes nothing to stdout or stderr (fairseq's text_to_speech task logs a
    tensorboardX hint at INFO when fairseq is imported; the package drops that one message)."""
    p = subprocess.run([sys.executable, "-c", "import logging; logging.basicConfig(level=logging.INFO); "
                        "import fairseq_ext"], capture_output=True, text=True, cwd="/", env=clean_env())
    assert p.returncode == 0 and p.stdout == "" and p.stderr == "", p.stdout + p.stderr


def test_only_the_tensorboardx_hint_is_silenced():
    out = _python("""
import logging, fairseq_ext
lg = logging.getLogger('fairseq.tasks.text_to_speech')
rec = lambda m: lg.makeRecord(lg.name, logging.INFO, 'x.py', 1, m, (), None)
print(lg.isEnabledFor(logging.INFO), bool(lg.filter(rec('Please install tensorboardX: pip install tensorboardX'))),
      bool(lg.filter(rec('Teacher forcing mode for generation'))))
""")
    assert out.split() == ["True", "False", "True"], out


def test_missing_fairseq_is_a_clear_error(tmp_path):
    """Without fairseq, importing the package names what to install (not a bare "No module named")."""
    (tmp_path / "fairseq.py").write_text("raise ModuleNotFoundError(\"No module named 'fairseq'\", name='fairseq')\n")
    p = subprocess.run([sys.executable, "-c", "import fairseq_ext"], capture_output=True, text=True, cwd="/",
                       env=clean_env(PYTHONPATH=str(tmp_path)))
    assert p.returncode != 0 and "fairseq-fixed==0.12.3.1" in p.stderr, p.stderr[-2000:]
