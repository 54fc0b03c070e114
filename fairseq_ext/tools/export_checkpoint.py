"""Make a compact, shippable copy of a fairseq checkpoint for inference.

    python -m fairseq_ext.tools.export_checkpoint IN.pt OUT.pt [--fp16]

Drops the optimizer state and training-only entries (kept: cfg/args, model, the number of updates) and the
build machine's --user-dir path (a shipped file names no folder of the machine that trained it),
optionally stores floating-point weights in fp16 (fairseq loads them into an fp32 model as usual),
writes atomically, and prints the parameter count, the size and the sha256 of the result.
"""
import argparse
import hashlib
import os

import torch

from ..compat import load_checkpoint


def count_parameters(state_dict):
    """Distinct floating-point parameters of a state dict (tied weights counted once)."""
    seen, params = set(), 0
    for v in state_dict.values():
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if torch.is_floating_point(v) and key not in seen:
            seen.add(key)
            params += v.numel()
    return params


def _drop_user_dir(cfg):
    """cfg/args without --user-dir (an absolute path of the training machine; loading does not need it)."""
    if cfg is None:
        return None
    for section in ([cfg] if not hasattr(cfg, "get") or "common" not in cfg else [cfg.get("common"), cfg.get("model")]):
        if section is None:
            continue
        if hasattr(section, "__setitem__") and "user_dir" in section:
            section["user_dir"] = None
        elif hasattr(section, "user_dir"):
            section.user_dir = None
    return cfg


def export(src, dst, fp16=False):
    state = load_checkpoint(src)
    model = state["model"]
    if fp16:
        # tied weights (shared embeddings / output projection) are one storage in the file: keep them so
        converted = {}
        for k, v in list(model.items()):
            if torch.is_floating_point(v):
                key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.stride())
                model[k] = converted.setdefault(key, v.half())
    history = state.get("optimizer_history") or []
    out = {
        "args": _drop_user_dir(state.get("args")),
        "cfg": _drop_user_dir(state.get("cfg")),
        "model": model,
        # fairseq reads the last entry when it loads a checkpoint; keep only the numbers, not the optimizer
        "optimizer_history": history[-1:],
        "extra_state": {k: v for k, v in (state.get("extra_state") or {}).items()
                        if k in ("train_iterator", "previous_training_time")},
    }
    tmp = dst + ".tmp"
    torch.save(out, tmp)
    os.replace(tmp, dst)
    return count_parameters(model), os.path.getsize(dst), sha256_file(dst)


def sha256_file(path):
    """The sha256 hex digest of a file (the format of SHA256SUMS, which examples/evaluate.sh checks)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--fp16", action="store_true", help="store floating-point weights in fp16")
    a = p.parse_args(argv)
    params, size, digest = export(a.src, a.dst, a.fp16)
    print(f"{a.dst}: {params / 1e6:.2f}M distinct parameters, {size / 1e6:.1f} MB, sha256 {digest}")


if __name__ == "__main__":
    main()
