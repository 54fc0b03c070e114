"""fairseq-train with faults injected, for tests/test_resume.py.

    python tests/train_with_faults.py FAIRSEQ_TRAIN_ARGS...

KILL=KIND:N sends SIGKILL to this process at the N-th (1-based) occurrence of KIND:
  write   halfway through writing a checkpoint's bytes (inside torch.save)
  rename  just before a finished temporary checkpoint file is renamed over its target
  copy    halfway through copying a checkpoint onto another name (checkpoint_last.pt, ...)
  step    at the start of a training step (anywhere in an epoch)
TRACE=PATH appends one JSON line per training step: [num_updates before the step, sorted sample ids].
"""
import json
import os
import shutil
import signal
import sys

import torch

KIND, _, N = os.environ.get("KILL", "none:0").partition(":")
N = int(N or 0)
counts = {}


def hit(kind):
    counts[kind] = counts.get(kind, 0) + 1
    if kind == KIND and counts[kind] == N:
        os.kill(os.getpid(), signal.SIGKILL)


class HalfwayKill:
    """A file wrapper that kills the process once half of the expected bytes are written."""

    def __init__(self, f, expected):
        self.f, self.expected, self.written = f, expected, 0

    def write(self, b):
        self.written += len(b)
        if self.written >= self.expected // 2:
            self.f.write(b[: max(0, len(b) // 2)])
            self.f.flush()
            hit("write")
        return self.f.write(b)

    def __getattr__(self, name):
        return getattr(self.f, name)


import fairseq_ext  # noqa: E402, F401  (installs the package's patches)
from fairseq_ext import checkpointing  # noqa: E402, F401  (patched by the faults below)

_save, _replace, _copyfileobj = torch.save, os.replace, shutil.copyfileobj


def save(obj, f, *args, **kwargs):
    if KIND == "write" and counts.get("write", 0) + 1 == N and hasattr(f, "write"):
        import io

        buf = io.BytesIO()
        _save(obj, buf, *args, **kwargs)
        f = HalfwayKill(f, len(buf.getvalue()))
        f.write(buf.getvalue())
        return None
    if KIND == "write" and hasattr(f, "write"):
        counts["write"] = counts.get("write", 0) + 1
    return _save(obj, f, *args, **kwargs)


def replace(src, dst, *args, **kwargs):
    if ".tmp" in os.path.basename(str(src)) and str(dst).endswith(".pt"):
        hit("rename")
    return _replace(src, dst, *args, **kwargs)


def copyfileobj(fsrc, fdst, length=0):
    if KIND == "copy" and counts.get("copy", 0) + 1 == N:
        data = fsrc.read()
        fdst.write(data[: len(data) // 2])
        fdst.flush()
    hit("copy")
    return _copyfileobj(fsrc, fdst, length) if length else _copyfileobj(fsrc, fdst)


torch.save = save
os.replace = replace
shutil.copyfileobj = copyfileobj

from fairseq.trainer import Trainer  # noqa: E402

_step = Trainer.train_step
trace = open(os.environ["TRACE"], "a") if os.environ.get("TRACE") else None


def train_step(self, samples, raise_oom=False):
    hit("step")
    if trace is not None:
        ids = sorted(i for s in samples if s for i in s["id"].tolist())
        trace.write(json.dumps([self.get_num_updates(), ids]) + "\n")
        trace.flush()
    return _step(self, samples, raise_oom)


Trainer.train_step = train_step

from fairseq_cli import train  # noqa: E402

sys.argv = ["fairseq-train"] + sys.argv[1:]
train.cli_main()
