"""Shared parts of the benchmark harness: building models by arch name, interleaved timing, peak
memory sampling, memory-bandwidth measurement, result tables/JSON/plots.

Conventions (docs/architecture.md, Benchmarks): candidates and baseline are measured in the same process,
interleaved (A B A B ...) after a warm-up, and reported as medians and per-pair ratios; never asserted in tests.
"""
import json
import os
import platform
import statistics
import sys
import threading
import time

import torch
from fairseq_ext.tools.params import count_parameters  # noqa: F401  (used as common.count_parameters)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs", "benchmarks")


class environment:
    """Those environment variables set inside the block, the caller's values back after it (the kernels read
    them at each call)."""

    def __init__(self, env):
        self.env, self.old = env, {}

    def __enter__(self):
        self.old = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)

    def __exit__(self, *exc):
        for k, v in self.old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def set_threads(n):
    """Pin intra-op threads (default: all cores) so runs are comparable."""
    n = n or os.cpu_count() or 1
    torch.set_num_threads(n)
    os.environ["OMP_NUM_THREADS"] = str(n)
    return n


def small_dims():
    """SMALL_DIMS and SMALL_FFN of examples/small_dims.sh (the recipes' one definition of the small model:
    4+2 layers, d 256, 4 heads, pre-norm), as flag strings."""
    import subprocess

    path = os.path.join(REPO, "examples", "small_dims.sh")
    out = subprocess.run(["bash", "-c", 'source "$0"; echo "${SMALL_DIMS[*]}"; echo "${SMALL_FFN[*]}"', path],
                         check=True, capture_output=True, text=True).stdout.splitlines()
    return out[0], out[1]


def registered_archs():
    import fairseq_ext  # noqa: F401  (registers this package's archs)
    from fairseq.models import ARCH_MODEL_REGISTRY

    return ARCH_MODEL_REGISTRY


def split_spec(spec):
    """A model spec: an arch name, optionally with model flags after '@' ("terraformer_base@--no-reversible",
    "transformer@--encoder-layers 3 --decoder-layers 3"): (arch, [flags])."""
    arch, _, flags = spec.partition("@")
    return arch, flags.split()


def split_label(spec):
    """(table name, model) of a spec: 'NAME=MODEL' names a checkpoint path or an arch spec ('dense=
    transformer@--encoder-layers 4'); any other spec is its own name."""
    head, sep, rest = spec.partition("=")
    if sep and head and "@" not in head and " " not in head:
        return head, rest
    return spec, spec


def build_model(arch, vocab, seed=1, flags=()):
    """Random-weight model of a registered arch or a spec (split_spec), seeded, eval mode, on CPU, dropout
    off; returns (model, task-like object with the dictionaries)."""
    from fairseq_ext.tools.params import VocabTask, build_model as build

    arch, spec_flags = split_spec(arch)
    flags = [*spec_flags, *flags]
    if arch not in registered_archs():
        raise KeyError(arch)
    torch.manual_seed(seed)
    task = VocabTask(vocab)
    model = build(arch, vocab, ["--dropout", "0", *flags], device="cpu", task=task)
    return model.eval(), task


def load_checkpoint_model(path, data=None):
    """(model, task) from a fairseq checkpoint, loaded with weights_only=True. The dictionaries come
    from `data`, else from the checkpoint's own folder when it holds dict.*.txt (shipped models),
    else from the data folder recorded in the checkpoint."""
    from fairseq import checkpoint_utils

    import fairseq_ext  # noqa: F401

    folder = os.path.dirname(os.path.abspath(path))
    if data is None and any(f.startswith("dict.") and f.endswith(".txt") for f in os.listdir(folder)):
        data = folder
    overrides = {"data": data} if data else {}
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([path], arg_overrides=overrides)
    return models[0].eval(), task


class PeakRSS:
    """Samples the process' resident set size in a background thread; `peak` is the maximum seen."""

    def __init__(self, interval=0.002):
        import psutil

        self.proc, self.interval = psutil.Process(), interval
        self.peak = self.start = 0

    def __enter__(self):
        self.start = self.peak = self.proc.memory_info().rss
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)


def measure_bandwidth(mb=256, repeats=7, device="cpu"):
    """Memory read bandwidth (bytes/s): the faster of two reads of one large fp32 matrix, each the median of
    `repeats` — a matrix-vector product (the access pattern of a batch-1 decoding step reading its weights)
    and a sum of all its elements (a pure streaming read: some BLAS matrix-vector products stay below the
    memory's rate, MKL's on AMD CPUs among them, which would put a faster kernel above 100% of the bound).
    On a GPU pass a matrix several times the L2 (mb=2048)."""
    n = int((mb * 2**20 / 4) ** 0.5)
    a = torch.randn(n, n, device=device)
    x = torch.randn(n, device=device)
    best = 0.0
    for read in (lambda: torch.mv(a, x), lambda: a.sum()):
        read()
        times = [device_timed(read, device) for _ in range(repeats)]
        best = max(best, a.numel() * 4 / statistics.median(times))
    return best


def device_timed(fn, device="cpu"):
    """Seconds fn() takes on `device`: wall clock on CPU, CUDA events (after a synchronize) on a GPU."""
    if torch.device(device).type != "cuda":
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def interleaved(fns, repeats, warmup=1):
    """Run {name: fn} in A B A B ... order (after `warmup` rounds of each), returning {name: [seconds]}
    per round and the run order. Each fn() returns its own measured seconds (or None: timed here)."""
    order, times = [], {k: [] for k in fns}
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    for r in range(repeats):
        names = list(fns) if r % 2 == 0 else list(fns)[::-1]  # alternate which goes first
        for name in names:
            t = time.perf_counter()
            measured = fns[name]()
            times[name].append(measured if measured is not None else time.perf_counter() - t)
            order.append(name)
    return times, order


def ratios(times, candidate, baseline):
    """Per-round speed ratio candidate/baseline (baseline time / candidate time): >1 = faster."""
    return [b / c for b, c in zip(times[baseline], times[candidate])]


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def machine_info(threads, device="cpu"):
    from fairseq_ext import ops

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "threads": threads,
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": _cpu_model(),
            "extension": ops.build_info()}
    if torch.device(device).type == "cuda":
        info.update(gpu=torch.cuda.get_device_name(device), cuda=torch.version.cuda)
    return info


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_results(name, result, out_dir=None):
    out_dir = out_dir or DOCS
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return path


def publish(name, result, md, out_dir=None):
    """Print a benchmark's markdown table and write <name>.json and <name>.md; returns the .json path."""
    print(md)
    path = write_results(name, result, out_dir)
    with open(path[:-5] + ".md", "w") as f:
        f.write(md + "\n")
    return path


def markdown_table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
