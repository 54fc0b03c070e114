"""Python entry points of the csrc/ kernels.

Every op has a plain PyTorch reference beside it; the reference is the spec and the test oracle, and
the path taken whenever the compiled extension is absent or disabled. Set FAIRSEQ_EXT_NO_KERNELS=1 to
force the references even when the extension is built.
"""
import logging
import os

import torch  # noqa: F401  (loads libc10/libtorch, which fairseq_ext._C links against)

logger = logging.getLogger(__name__)
ops_logger_name = __name__
_FALLBACKS_LOGGED = set()

try:
    from .. import _C  # noqa: F401  (loading it registers torch.ops.fairseq_ext.*)
except ImportError as e:  # built without the extension, or the build failed: references only
    _C = None
    _IMPORT_ERROR = e
else:
    _IMPORT_ERROR = None


def extension_loaded():
    """True when fairseq_ext._C imported (its ops are registered under torch.ops.fairseq_ext)."""
    return _C is not None


def kernels_enabled():
    """Whether models should call the compiled ops (extension present and not disabled by env)."""
    return _C is not None and os.environ.get("FAIRSEQ_EXT_NO_KERNELS", "0") != "1"


def has_kernel(op, device_type):
    """Whether torch.ops.fairseq_ext.<op> has a compiled implementation for this device type
    ("cpu", "cuda"): the CUDA kernels exist only in builds against a CUDA torch."""
    if _C is None:
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"fairseq_ext::{op}", device_type.upper())


def kernel_serves(op, x, dtypes):
    """Whether a model should call the compiled torch.ops.fairseq_ext.<op> for input `x`: extension built
    and enabled, a kernel for x's device, a dtype `dtypes` lists for that device ({device type: dtypes};
    a device left out is not served), and no autograd (the ops have no backward: training keeps the
    PyTorch path)."""
    if not (kernels_enabled() and not torch.is_grad_enabled() and has_kernel(op, x.device.type)):
        return False
    if x.dtype in dtypes.get(x.device.type, ()):
        return True
    if (op, x.device.type, x.dtype) not in _FALLBACKS_LOGGED:  # once per op, device and dtype
        _FALLBACKS_LOGGED.add((op, x.device.type, x.dtype))
        logger.info(f"{op}: no {x.device.type} kernel for {x.dtype}; the PyTorch reference computes it")
    return False


def build_info():
    return _C.build_info() if _C is not None else f"extension not loaded ({_IMPORT_ERROR})"
