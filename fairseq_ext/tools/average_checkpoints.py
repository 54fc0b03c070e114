"""Average the model parameters of several fairseq checkpoints (fairseq's scripts/average_checkpoints.py,
which is not installed with fairseq and calls torch.load without the safe globals torch >= 2.6 needs).

    python -m fairseq_ext.tools.average_checkpoints --inputs CKPT_DIR --num-epoch-checkpoints 5 --output avg.pt
    fairseq-ext-average-checkpoints --inputs a.pt b.pt c.pt --output avg.pt

Same flags as fairseq's script. Loads with weights_only=True. The output keeps every other entry
(args/cfg, extra_state) of the newest input, so fairseq-generate and fine-tuning can read it; the
optimizer state is dropped (it does not correspond to the averaged weights). Written atomically.
"""
import argparse
import collections
import os
import re

import torch

from ..checkpointing import atomic_save
from ..compat import CheckpointError, install_checkpoint_safe_globals, load_checkpoint


def last_n_checkpoints(paths, n, update_based, upper_bound=None):
    """The n newest checkpoint_{epoch}.pt / checkpoint_{epoch}_{update}.pt files of a folder."""
    if len(paths) != 1 or not os.path.isdir(paths[0]):
        raise SystemExit(f"--num-{'update' if update_based else 'epoch'}-checkpoints takes exactly one folder in "
                         f"--inputs, got {' '.join(paths)}")
    path = paths[0]
    pattern = re.compile(r"checkpoint_\d+_(\d+)\.pt" if update_based else r"checkpoint(\d+)\.pt")
    entries = []
    for f in os.listdir(path):
        m = pattern.fullmatch(f)
        if m is not None:
            num = int(m.group(1))
            if upper_bound is None or num <= upper_bound:
                entries.append((num, os.path.join(path, f)))
    if len(entries) < n:
        raise SystemExit(f"found {len(entries)} checkpoints matching {pattern.pattern} in {path}, need {n}")
    return [p for _, p in sorted(entries, reverse=True)[:n]]


def average_checkpoints(inputs):
    """Mean of the 'model' tensors over `inputs` (accumulated in float64, stored in each tensor's
    dtype); every other entry comes from the newest (first) input."""
    sums, new_state = collections.OrderedDict(), None
    keys = None
    for path in inputs:
        state = load_checkpoint(path)
        if new_state is None:
            new_state = state
        model = state["model"]
        if keys is None:
            keys = list(model.keys())
        elif set(model.keys()) != set(keys):
            extra = sorted(set(model.keys()) ^ set(keys))
            raise SystemExit(f"{path}: its parameters differ from {inputs[0]}'s (e.g. {extra[0]}); cannot average")
        for k in keys:
            p = model[k]
            first = new_state["model"][k]
            if p.shape != first.shape:
                raise SystemExit(f"{path}: parameter {k} has shape {tuple(p.shape)}, {inputs[0]} has "
                                 f"{tuple(first.shape)}: the checkpoints are of different models; cannot average")
            if not torch.is_floating_point(p):
                sums.setdefault(k, p.clone())  # integer buffers: keep the first
                continue
            sums[k] = sums[k] + p.double() if k in sums else p.double().clone()
    averaged = collections.OrderedDict()
    for k in keys:
        v = sums[k]
        ref = new_state["model"][k]
        averaged[k] = (v / len(inputs)).to(ref.dtype) if torch.is_floating_point(ref) else v
    new_state["model"] = averaged
    new_state.pop("last_optimizer_state", None)
    return new_state


def write_average(inputs, output):
    """The average of `inputs` written to `output` atomically (never a half-written file under that name)."""
    state = average_checkpoints(inputs)
    install_checkpoint_safe_globals()
    atomic_save(state, output)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--inputs", required=True, nargs="+", help="checkpoint files, or one folder with --num-*")
    p.add_argument("--output", required=True, metavar="FILE")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--num-epoch-checkpoints", type=int, help="average the last N checkpointEPOCH.pt")
    g.add_argument("--num-update-checkpoints", type=int, help="average the last N checkpoint_E_U.pt")
    p.add_argument("--checkpoint-upper-bound", type=int, help="ignore checkpoints after this epoch/update")
    args = p.parse_args(argv)

    inputs = args.inputs
    n = args.num_epoch_checkpoints if args.num_epoch_checkpoints is not None else args.num_update_checkpoints
    flag = "--num-epoch-checkpoints" if args.num_epoch_checkpoints is not None else "--num-update-checkpoints"
    if n is not None and n < 1:
        p.error(f"{flag} {n}: must be >= 1 (the number of newest checkpoints to average)")
    if args.checkpoint_upper_bound is not None and args.checkpoint_upper_bound < 0:
        p.error(f"--checkpoint-upper-bound {args.checkpoint_upper_bound}: must be >= 0")
    if n is not None:
        inputs = last_n_checkpoints(inputs, n, args.num_update_checkpoints is not None,
                                    args.checkpoint_upper_bound)
    elif args.checkpoint_upper_bound is not None:
        p.error("--checkpoint-upper-bound needs --num-epoch-checkpoints or --num-update-checkpoints")
    missing = [x for x in inputs if not os.path.isfile(x)]
    if missing:
        p.error(f"not a checkpoint file: {', '.join(missing)} (give files, or a folder with --num-*-checkpoints)")
    print("averaging:", " ".join(inputs))
    try:
        write_average(inputs, args.output)
    except CheckpointError as e:
        raise SystemExit(str(e)) from None
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
