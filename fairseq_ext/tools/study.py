"""The reproduction study: every method against the baseline, trained to convergence, several seeds.

    python -m fairseq_ext.tools.study run OUT [--protocol paper|tiny] [--corpus DIR] [--max-runs N]
        [--configs NAME,...]
    python -m fairseq_ext.tools.study table [--results docs/results] [--check]
    python -m fairseq_ext.tools.study ship [--study runs/study] [--results docs/results] [--out shipped]

`run` carries out the protocol of docs/results/README.md in OUT, resumable at any point: a finished run
is skipped, an interrupted one resumes from its checkpoint_last.pt (exact: fairseq_ext/checkpointing.py),
so the study can be carried across sittings and machines. Several `run` processes may share OUT (e.g. one
per core with OMP_NUM_THREADS=1): each claims a different run (an flock on a file in its folder). Each run
trains one epoch per fairseq-train call (examples/train.sh) until its convergence rule holds, then averages
its last epoch checkpoints (in the `run` process), measures the averaged model's valid loss (fairseq-validate)
and translates the test set (examples/evaluate.sh, beam 5, sacrebleu). Its result, one JSON file, goes to
OUT/results/NAME.json and, for the paper protocol, to docs/results/runs/NAME.json (what `table` reads and
what is committed). Terraformer's generalisation
tasks (copy and addition, each with the Terraformer and the Transformer: configurations copy_terraformer ...
addition_transformer) train in chunks of updates until their in-distribution accuracy stops improving
(`do_synthetic`); `--configs copy_transformer,...` runs only those, without the translation corpus.

`table` writes the tables, curves and verdicts of docs/results from the run files; `--check` fails when
the committed docs differ from what it would write. `ship` exports the median-BLEU seed of the baseline and
of each main configuration to shipped/ (fairseq_ext/tools/study_ship.py), for `make demo`.
"""
import argparse
import fcntl
import glob
import json
import math
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace

from ..precision import BF16_LINE, FP32_PRODUCTS_LINE, fp32_products
from .precision import choose, cpu_model

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
POLL_SECONDS = 10  # a process with nothing to claim looks again after this long
RESULTS = os.path.join(REPO, "docs", "results")


@dataclass
class Synthetic:
    """Terraformer's generalisation tasks (Jaszczur et al. 2021, §4.3, Table 4): copy and long addition, trained
    on inputs of 1..max_train_digits digits (addition: both operands together) until in-distribution accuracy
    stops improving, tested on test_digits (over 2x longer: out of distribution); fairseq_ext/tools/synthetic.py."""
    train: int  # examples
    valid: int
    test: int
    max_train_digits: int
    test_digits: str
    interval: int  # updates between two greedy decodings of the valid set
    patience: int  # decodings without improvement that stop a run (after min_updates)
    min_updates: int
    max_updates: int  # the cap: not converged
    improve: float  # accuracy points (sequence or token) that count as an improvement
    lr: str
    warmup: int
    max_tokens: int
    dims: list = None  # the models' dims (None: fairseq_ext/tools/synthetic.py's DIMS)


@dataclass
class Protocol:
    name: str
    corpus: str  # {train,valid,test}.{en,de}.gz
    vocab: int  # joint SentencePiece entries
    dims: list  # model flags every configuration shares
    ffn: int  # the baseline's FFN width
    lrs: list  # the learning-rate sweep (peak of inverse_sqrt), as strings
    warmup: int
    max_tokens: int
    seeds: int  # seeds of the baseline and of each main configuration
    min_epochs: int
    max_epochs: int
    patience: int  # validations without improvement that stop a run
    tail: float  # converged: the last `tail` of the updates improved the best valid loss by < improve
    improve: float
    average: int  # epoch checkpoints averaged for evaluation
    dropout: float = 0.1
    min_window: int = 0  # the plateau rule's window spans at least this many epochs (0: only `tail`)
    eval_flags: list = field(default_factory=list)
    synthetic: Synthetic = None


PROTOCOLS = {
    "paper": Protocol(
        name="paper", corpus=os.path.join(REPO, "data", "en-de"), vocab=8000,
        dims=["--encoder-layers", "4", "--decoder-layers", "2", "--encoder-embed-dim", "128",
              "--decoder-embed-dim", "128", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4",
              "--encoder-normalize-before", "--decoder-normalize-before", "--share-all-embeddings"],
        ffn=512, lrs=["1e-3", "2e-3", "4e-3"], warmup=1000, max_tokens=4096, seeds=3, min_epochs=4,
        max_epochs=20, patience=3, tail=0.2, improve=0.01, average=5,
        synthetic=Synthetic(train=50000, valid=1000, test=300, max_train_digits=128, test_digits="256-300",
                            interval=500, patience=4, min_updates=4000, max_updates=12000, improve=0.5,
                            lr="1e-3", warmup=500, max_tokens=4096)),
    "tiny": Protocol(  # the end-to-end test of this tool: tiny dims, a corpus given by --corpus
        name="tiny", corpus="", vocab=1000,
        dims=["--encoder-layers", "2", "--decoder-layers", "1", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
              "--encoder-normalize-before", "--decoder-normalize-before", "--share-all-embeddings"],
        ffn=64, lrs=["3e-3", "6e-3"], warmup=20, max_tokens=2000, seeds=2, min_epochs=2,
        max_epochs=2, patience=3, tail=0.5, improve=0.01, average=2,
        eval_flags=["--max-len-a", "1", "--max-len-b", "5"],
        synthetic=Synthetic(train=400, valid=16, test=8, max_train_digits=6, test_digits="10-12", interval=4,
                            patience=1, min_updates=8, max_updates=12, improve=0.5, lr="3e-3", warmup=4,
                            max_tokens=1000,
                            dims=["--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
                                  "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
                                  "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
                                  "--decoder-attention-heads", "2", "--share-all-embeddings"])),
}


@dataclass
class Config:
    name: str
    paper: str  # baseline | one_wide_ffn | can | scaling_sparse | sas
    role: str  # baseline | main | ablation | diagnosis (a test of a contradiction's likeliest cause)
    what: str
    flags: list  # model flags beyond the protocol's dims (FFN widths included)
    seed: int = 1  # the seed of a one-seed run (paired with the baseline's run of that seed)
    max_epochs: int = None  # the epoch cap, where it is not the protocol's (a diagnosis of a capped result)
    min_window: int = None  # the plateau rule's shortest window in epochs, where it is not the protocol's


def run_protocol(p, c):
    """Protocol p as configuration c trains under it: its own epoch cap and plateau window where it has them."""
    own = {k: v for k, v in (("max_epochs", c.max_epochs), ("min_window", c.min_window)) if v}
    return replace(p, **own) if own else p


def bench_spec(flags):
    """A run's model flags (protocol dims + a configuration's flags, `--arch` among them) as the benchmarks'
    model spec ARCH@FLAGS (benchmarks/run_presets.py measures each study configuration under this spec; the
    study's table finds a configuration's speed by it, so two configurations of one model share one figure)."""
    flags = list(flags)
    i = flags.index("--arch")
    return f"{flags[i + 1]}@{' '.join(flags[:i] + flags[i + 2:])}"


def configs(p):
    """The study's configurations at protocol p's dims (docs/results/README.md: why each one)."""
    ffn = lambda w: ["--encoder-ffn-embed-dim", str(w), "--decoder-ffn-embed-dim", str(w)]
    f = p.ffn
    enc_layers = int(p.dims[p.dims.index("--encoder-layers") + 1])
    layers = enc_layers + int(p.dims[p.dims.index("--decoder-layers") + 1])
    owf = ["--arch", "one_wide_ffn", *ffn(f), "--encoder-ffn-sharing", "shared", "--decoder-ffn-sharing", "none"]
    can = ["--arch", "can_decoder", *ffn(f), "--can-value-dim", str(f)]
    owf_wide, can_ffn = owf + ["--encoder-shared-ffn-dim", str(layers * f)], can + ["--can-compress", "ffn"]
    qkv_ffn = {512: 704, 64: 128}.get(f, f)  # d_ff that brings sparse FFN + QKV to the baseline's parameters
    # the scaling_sparse archs start from Transformer Big's defaults (attention dropout 0.1): pinned to the
    # baseline's 0 (tests/test_study.py checks every configuration's regularisation against the baseline's)
    big_defaults = ["--attention-dropout", "0.0"]
    return [
        Config("baseline", "baseline", "baseline", "Transformer, pre-norm", ["--arch", "transformer", *ffn(f)]),
        Config("one_wide_ffn", "one_wide_ffn", "main",
               f"SharedEncNoDec widened to d_ff' = {layers} x {f}", owf_wide),
        Config("shared_enc_no_dec", "one_wide_ffn", "ablation", f"SharedEncNoDec at d_ff' = {f}",
               owf + ["--encoder-shared-ffn-dim", str(f)]),
        # the One Wide FFN diagnosis (docs/one_wide_ffn/README.md): the shared FFN acts in every encoder layer,
        # so each Adam step moves its output about (encoder layers) times as far as a layer's own FFN; its own
        # rate at 1 / (encoder layers) of the schedule's tests whether the widened model is simply trained too hot
        Config("one_wide_ffn_shared_lr", "one_wide_ffn", "diagnosis",
               f"One Wide FFN, the shared FFN's learning rate x 1/{enc_layers}",
               owf + ["--encoder-shared-ffn-dim", str(layers * f), "--shared-ffn-lr-scale", f"{1 / enc_layers:g}",
                      "--optimizer", "adam_no_decay_gains"]),
        Config("can", "can", "main", f"CAN decoder (self + cross attention + FFN in one sub-layer), d_v {f}",
               can),
        # the CAN diagnosis (docs/can/README.md): every baseline seed stopped by the convergence rule (15-18
        # epochs), CAN's seeds 2 and 3 by the 20-epoch cap, still improving; those seeds again with twice the
        # cap (their first 20 epochs repeat the capped runs) test whether the gap is the budget's or the model's
        *[Config("can_uncapped" + ("" if seed == 2 else f"_s{seed}"), "can", "diagnosis",
                 f"CAN seed {seed}, epoch cap {2 * p.max_epochs}", can, seed=seed, max_epochs=2 * p.max_epochs)
          for seed in range(2, p.seeds + 1)],
        # the plateau rule's diagnosis (docs/results/README.md, Convergence): a run the rule stops after 10 epochs
        # is judged on a 2-epoch window, where a 20-epoch run gets 4; One Wide FFN's seed 1 and the CAN FFN-only
        # ablation stopped so while still improving. The same model and seed again, the window at least
        # tail x cap epochs and twice the cap: its first epochs repeat the judged run (same CPU model, precision and
        # thread count), the rest say where it ends
        *[Config(f"{c}_window", paper, "diagnosis",
                 f"{c} seed 1, plateau window >= {window} epochs, epoch cap {2 * p.max_epochs}", flags,
                 max_epochs=2 * p.max_epochs, min_window=window)
          for c, paper, flags in (("one_wide_ffn", "one_wide_ffn", owf_wide), ("can_ffn", "can", can_ffn))
          for window in [math.ceil(p.tail * p.max_epochs)] if window > 2],  # > the 2 epochs those runs were judged on
        Config("can_attention", "can", "ablation", "CAN, attention compressed only",
               can + ["--can-compress", "attention"]),
        Config("can_ffn", "can", "ablation", "CAN, FFN compressed only", can_ffn),
        Config("sparse_ffn", "scaling_sparse", "main", "top-1-of-64 sparse FFN",
               ["--arch", "scaling_sparse_ff", *ffn(f), "--sparse-ffn-block-size", str(min(64, f)), *big_defaults]),
        # the sparse FFN diagnosis (docs/scaling_sparse/README.md): at d_ff 512, N = 64 leaves 8 active units per
        # token where the paper's T5-large ablation (d_ff 4,096, N = 64) has 64; N = 8 gives the paper's 64 with
        # the controller's bottleneck pinned to the main configuration's 8 (the only change is the block size)
        Config("sparse_ffn_8", "scaling_sparse", "diagnosis",
               f"top-1-of-8 sparse FFN ({f // 8} of {f} units per token), controller bottleneck {max(1, f // 64)}",
               ["--arch", "scaling_sparse_ff", *ffn(f), "--sparse-ffn-block-size", str(min(8, f)),
                "--sparse-ffn-lowrank", str(max(1, f // 64)), *big_defaults]),
        Config("sparse_ffn_qkv", "scaling_sparse", "main",
               "sparse FFN (N = 64) + sparse QKV (S = 4) in the decoder self-attention (trax's placement)",
               ["--arch", "scaling_sparse", *ffn(f), "--sparse-ffn-block-size", str(min(64, f)),
                "--sparse-qkv-modules", "4", "--sparse-qkv-scope", "decoder-self", *big_defaults]),
        Config("sparse_ffn_qkv_all", "scaling_sparse", "ablation",
               f"sparse FFN (N = 64, d_ff {qkv_ffn}) + sparse QKV (S = 4) in every attention",
               ["--arch", "scaling_sparse", *ffn(qkv_ffn), "--sparse-ffn-block-size", str(min(64, qkv_ffn)),
                "--sparse-qkv-modules", "4", "--sparse-qkv-scope", "all", *big_defaults]),
        Config("sparse_ffn_128", "scaling_sparse", "ablation", "top-1-of-128 sparse FFN",
               ["--arch", "scaling_sparse_ff", *ffn(f), "--sparse-ffn-block-size", str(min(128, f)), *big_defaults]),
        Config("sas", "sas", "main", "SAS-P encoder, SAS decoder", ["--arch", "sas_block", *ffn(f)]),
        # the SAS diagnosis (docs/sas/README.md): the paper's blocks have no cross-attention, so the SAS decoder
        # with its pre-norm cross-attention sub-block is ours; SAS-P encoder blocks under the baseline's own
        # Pre-LN decoder tell whether the gap to the baseline comes from the paper's block or from that decoder
        Config("sas_encoder", "sas", "diagnosis", "SAS-P encoder, the baseline's Pre-LN decoder",
               ["--arch", "sas_block", *ffn(f), "--sas-decoder-block", "preln"]),
        Config("sas_sequential", "sas", "ablation", "SAS encoder and decoder",
               ["--arch", "sas_block", *ffn(f), "--sas-encoder-block", "sas"]),
        Config("sas_nonorm", "sas", "ablation", "SAS-P encoder, SAS decoder, no norm",
               ["--arch", "sas_block", *ffn(f), "--sas-no-norm"]),
    ]


def synthetic_configs(p):
    """Terraformer's generalisation runs (role 'synthetic'): each task with each of the two models, after copy
    the first diagnosis of its result (the Terraformer without positional embeddings), after addition the
    second (the Terraformer with random position offsets in training: docs/terraformer/README.md)."""
    from .synthetic import model_flags

    if p.synthetic is None:
        return []
    table4 = {task: [Config(f"{task}_{model}", "terraformer", "synthetic", f"{task}, {model} (Table 4)",
                            model_flags(model, p.synthetic.dims)) for model in ("terraformer", "transformer")]
              for task in ("copy", "addition")}
    return table4["copy"] + [Config("copy_terraformer_nopos", "terraformer", "synthetic",
                                    "copy, terraformer without positional embeddings (diagnosis)",
                                    model_flags("terraformer_nopos", p.synthetic.dims))] + table4["addition"] + [
        Config("copy_terraformer_offset", "terraformer", "synthetic",
               "copy, terraformer with random position offsets in training (diagnosis)",
               model_flags("terraformer_offset", p.synthetic.dims))]


def synthetic_convergence(evals, s):
    """Why a synthetic run whose valid decodings are `evals` ([{updates, sequence_accuracy, token_accuracy}])
    stops now, or None: 'perfect' (every valid sequence right), 'plateau' (at least s.min_updates, and the
    last s.patience decodings improved neither accuracy by s.improve points over the best before them) or
    'max_updates' (the cap: not converged)."""
    if not evals:
        return None
    if evals[-1]["sequence_accuracy"] >= 100.0:
        return "perfect"
    if evals[-1]["updates"] >= s.min_updates and len(evals) > s.patience:
        before, last = evals[:-s.patience], evals[-s.patience:]
        if all(max(e[k] for e in last) < max(e[k] for e in before) + s.improve
               for k in ("sequence_accuracy", "token_accuracy")):
            return "plateau"
    if evals[-1]["updates"] >= s.max_updates:
        return "max_updates"
    return None


NATIVE = {"fp16": "a CUDA device"}


def agreed_precision(finished, decision, stored=None):
    """The precision decision the study's next runs train with. `finished`: {precision: [run names]} of the
    study's finished runs; `decision`: this machine's choice (fairseq_ext.tools.precision.choose()); `stored`:
    the decision of the study's study.json, if any. A study with neither takes this machine's choice; else its
    runs' precision holds: fp32 and bf16 run on any CPU (without native bf16, a bf16 run's products are
    computed in fp32 from the bf16 values: fairseq_ext/precision.py), fp16 only on a CUDA device. Raises
    SystemExit, naming the fix, where the study's precisions disagree or this machine cannot run the study's."""
    have = {p: list(names) for p, names in finished.items()}
    if stored is not None:
        have.setdefault(stored["precision"], []).insert(0, "study.json")
    if len(have) > 1:
        parts = "; ".join(f"{p}: {', '.join(names[:3])}{' ...' if len(names) > 3 else ''}"
                          for p, names in sorted(have.items()))
        raise SystemExit(f"study: its runs disagree on the precision ({parts}); a study trains every run in one "
                         f"precision: move the odd runs' result files (and study.json) aside")
    if not have:
        return decision
    (precision, names), = have.items()
    runs = [n for n in names if n != "study.json"]
    if precision == decision["precision"]:
        return stored or decision
    if precision == "fp32":
        return {"flag": "", "precision": "fp32", "cpu": decision.get("cpu"),
                "reason": f"fp32, the study's ({decision['precision']} on this machine otherwise)"}
    if precision == "bf16" and decision["precision"] != "fp16":  # this CPU chose fp32: no native bf16, or slow
        how = ("; its bf16 products are computed in fp32 from the bf16 values, the native products' value up to the "
               "order of the sums") if fp32_products() else ""
        return {"flag": "--bf16", "precision": "bf16", "cpu": decision.get("cpu"),
                "reason": f"bf16 autocast, the study's ({decision['reason']}{how})"}
    what = f"its {len(runs)} finished run{'s' if len(runs) > 1 else ''}" if runs else "its study.json"
    raise SystemExit(f"study: {what} trained in {precision}, but this machine would train in "
                     f"{decision['precision']} ({decision['reason']}); a study trains every run in one precision. "
                     f"Continue it on {NATIVE.get(precision, 'a machine that runs ' + precision)}, or start "
                     f"another study: another OUT folder and --publish folder")


def bf16_products(train_log):
    """How a bf16 run's products were computed, from its fairseq-train calls' precision lines (a run carried
    across machines may differ between calls): "native", "fp32" (a CPU without native bf16:
    fairseq_ext/precision.py), or "fp32 in K of N training calls"; this machine's where the log has no line."""
    calls = fp32 = 0
    if os.path.exists(train_log):
        with open(train_log, encoding="utf-8", errors="replace") as f:
            for line in f:
                if BF16_LINE in line:
                    calls += 1
                    fp32 += FP32_PRODUCTS_LINE in line
    if not calls:
        return "fp32" if fp32_products() else "native"
    return "native" if not fp32 else "fp32" if fp32 == calls else f"fp32 in {fp32} of {calls} training calls"


def run_name(config, lr, seed):
    return f"{config}-lr{lr}-s{seed}"


# ---------------------------------------------------------------- convergence

def dedup_valid(valid):
    """End-of-epoch validations by update count (a validation repeated after an interruption counts once)."""
    by_updates = {}
    for v in valid:
        by_updates[int(v["num_updates"])] = v
    return [by_updates[u] for u in sorted(by_updates)]


def convergence(losses, updates, p):
    """Why a run with end-of-epoch valid `losses` at `updates` stops now, or None to train on:
    'patience' (no improvement in the last p.patience validations), 'plateau' (at least p.min_epochs, and
    the last p.tail of the updates, and at least the last p.min_window epochs, improved the best valid loss
    by less than p.improve of it), or
    'max_epochs' (the cap: not converged)."""
    n = len(losses)
    if n == 0:
        return None
    best = min(losses)
    if p.patience and n > p.patience and min(losses[-p.patience:]) >= min(losses[:-p.patience]):
        return "patience"
    if n >= p.min_epochs:
        early = [l for i, (l, u) in enumerate(zip(losses, updates))
                 if u <= (1 - p.tail) * updates[-1] and i < n - p.min_window]
        if early and min(early) - best < p.improve * best:
            return "plateau"
    if n >= p.max_epochs:
        return "max_epochs"
    return None


# ---------------------------------------------------------------- running

def log(msg):
    print(f"[study {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(cmd, logfile=None, env=None, cwd=REPO):
    env = {**os.environ, **(env or {})}
    if logfile:
        with open(logfile, "a", encoding="utf-8") as f:
            f.write(f"\n$ {' '.join(cmd)}\n")
            f.flush()
            rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        if rc != 0:
            with open(logfile, encoding="utf-8", errors="replace") as f:
                tail = f.read()[-3000:]
            raise RuntimeError(f"command failed ({rc}): {' '.join(cmd)}\n{tail}")
        return ""
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if out.returncode != 0:
        raise RuntimeError(f"command failed ({out.returncode}): {' '.join(cmd)}\n{out.stdout[-2000:]}{out.stderr[-3000:]}")
    return out.stdout + out.stderr


def dump_result(result):
    """A run's result as JSON, one key per line (diffs of committed result files stay readable)."""
    return "{\n " + ",\n ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in result.items()) + "\n}\n"


def add_seconds(clock, seconds):
    """Add `seconds` to the running total in the file `clock` (a run's training time over its sittings)."""
    spent = float(open(clock).read()) if os.path.exists(clock) else 0.0
    with open(clock, "w") as f:
        f.write(f"{spent + seconds:.1f}")


def git_rev():
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=REPO).stdout.strip() or None
    except OSError:
        return None


class Study:
    def __init__(self, out, protocol, corpus=None, publish=None, only=None, precedent=None):
        self.out = os.path.abspath(out)
        self.p = protocol
        if corpus:
            self.p.corpus = os.path.abspath(corpus)
        self.publish = publish  # folder for the run files beside OUT/results (docs/results/runs)
        self.precedent = precedent  # a folder of run files whose precision this study keeps (ship --retrain)
        self.results = os.path.join(self.out, "results")
        os.makedirs(self.results, exist_ok=True)
        self._locks = {}  # run name -> open file descriptor holding its flock
        everything = configs(self.p) + synthetic_configs(self.p)
        # the baseline comes with every translation configuration (their learning rate is the baseline's)
        translation = only is None or any(c.name in only for c in everything if c.role != "synthetic")
        self.configs = {c.name: c for c in everything
                        if only is None or c.name in only or (c.role == "baseline" and translation)}

    # -- the study's fixed choices, made once and kept in OUT/study.json
    def setup(self):
        """Runs under an exclusive lock on OUT/setup.lock: processes started together agree on one
        study.json (the precision is measured once) and binarize the corpus once."""
        with open(os.path.join(self.out, "setup.lock"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            self._setup()

    def _setup(self):
        path = os.path.join(self.out, "study.json")
        stored = None
        if os.path.exists(path):
            with open(path) as f:
                self.meta = json.load(f)
            stored = self.meta["precision"]
        # every run of a study trains in one precision (the table compares them): the one of its study.json and
        # finished runs, checked against this machine at each start (the study may have been carried here)
        precision = agreed_precision(self.finished_precisions(), choose(), stored)
        if stored is None:
            self.meta = {"protocol": asdict(self.p), "precision": precision, "started": time.strftime("%Y-%m-%d %H:%M")}
            with open(path + ".tmp", "w") as f:
                json.dump(self.meta, f, indent=1)
            os.replace(path + ".tmp", path)
        log(f"precision of every run: {self.meta['precision']['reason']}")
        self.data = os.path.join(self.out, "data")
        if "baseline" in self.configs:  # translation configurations (not only the synthetic tasks)
            sh(["bash", os.path.join(REPO, "examples/data/binarize.sh"), self.p.corpus, self.data, "--vocab",
                str(self.p.vocab)])

    def finished_precisions(self):
        """{precision: [run names]} of the finished runs (OUT/results, the published run files, precedent)."""
        found = {}
        for folder in [self.results] + [f for f in (self.publish, self.precedent) if f]:
            for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
                with open(path) as f:
                    r = json.load(f)
                if isinstance(r, dict) and "name" in r and "precision" in r:
                    names = found.setdefault(r["precision"], [])
                    if r["name"] not in names:
                        names.append(r["name"])
        return found

    # -- the plan: which runs, in which order (the sweep decides the learning rate of the rest)
    def result(self, name):
        """Run `name`'s result: OUT/results, else the published run files (docs/results/runs for the paper
        protocol), so a study carried onto a fresh clone or another machine skips the runs already committed."""
        from .synthetic import current_format

        for folder in [self.results] + ([self.publish] if self.publish else []):
            path = os.path.join(folder, name + ".json")
            if os.path.exists(path):
                with open(path) as f:
                    r = json.load(f)
                if r.get("role") != "synthetic" or current_format(r):  # else trained on older examples
                    return r
        return None

    def best_lr(self, config):
        """The learning rate of `config`'s lowest converged valid loss over the sweep's rates (seed 1), or
        None while any of those runs is missing."""
        scores = []
        for lr in self.p.lrs:
            r = self.result(run_name(config, lr, 1))
            if r is None:
                return None
            scores.append((r["valid_loss"], lr))
        return min(scores)[1]

    def plan(self):
        """Run specs (config, lr, seed, why) in order; stops at the first stage that needs results not
        there yet."""
        p, runs = self.p, []
        synthetic = [(c.name, p.synthetic.lr, 1, "generalisation task") for c in self.configs.values()
                     if c.role == "synthetic"]
        if "baseline" not in self.configs:
            return synthetic
        runs += [("baseline", lr, 1, "learning-rate sweep") for lr in p.lrs]
        lr = self.best_lr("baseline")
        mains = [c for c in self.configs.values() if c.role == "main"]
        ablations = [c for c in self.configs.values() if c.role == "ablation"]
        key = [c for c in ("one_wide_ffn", "shared_enc_no_dec") if c in self.configs]  # diagnosed first
        if lr is None:  # while the sweep trains: the runs every outcome of it needs (each main configuration
            # at each rate of the sweep, seed 1: at the baseline's rate, or at another as its own best)
            first = [c for c in key if self.configs[c].role == "main"]
            runs += [(c, other, 1, "seed 1 at a rate of the sweep") for c in first + [m.name for m in mains
                                                                                   if m.name not in first]
                     for other in p.lrs]
            return runs
        runs += [(c, lr, 1, "seed 1") for c in key]
        runs += [(c.name, lr, c.seed, "diagnosis") for c in self.configs.values() if c.role == "diagnosis"]
        runs += [(c.name, lr, 1, "seed 1") for c in mains if c.name not in key]
        # the seeds before everything else: every verdict on a paper's claim needs them; then the ablations
        # (they locate what a verdict's gap comes from), then Terraformer's generalisation tasks (a run may
        # take up to s.max_updates updates: many hours where an ablation takes one or two)
        for seed in range(2, p.seeds + 1):
            runs += [(c, lr, seed, f"seed {seed}") for c in ["baseline"] + [m.name for m in mains]]
        runs += [(c.name, lr, c.seed, "ablation") for c in ablations if c.name not in key]
        runs += synthetic
        runs += [(c.name, other, 1, "its own learning rate") for c in mains for other in p.lrs if other != lr]
        return runs

    # -- one run
    def train_command(self, config, lr, seed, save, epochs):
        c = self.configs[config]
        prec = self.meta["precision"]["flag"]
        return (["bash", os.path.join(REPO, "examples/train.sh"), os.path.join(self.data, "bin"), save]
                + self.p.dims + c.flags
                + ["--lr", lr, "--warmup-updates", str(self.p.warmup), "--seed", str(seed),
                   "--max-tokens", str(self.p.max_tokens), "--dropout", str(self.p.dropout),
                   "--keep-last-epochs", str(self.p.average), "--max-epoch", str(epochs)]
                + ([prec] if prec else []))

    def do_run(self, config, lr, seed):
        if self.configs[config].role == "synthetic":
            return self.do_synthetic(config, lr, seed)
        from .train_log import parse_train_log

        name = run_name(config, lr, seed)
        save = os.path.join(self.out, "runs", name)
        os.makedirs(save, exist_ok=True)
        train_log = os.path.join(save, "train.log")
        env = {"LOG_INTERVAL": "100", "PRECISION": "fp32"}  # the study passes its precision flag itself
        clock = os.path.join(save, "train_seconds")  # training time of the finished fairseq-train calls
        while True:
            valid = dedup_valid(parse_train_log(train_log)["valid"]) if os.path.exists(train_log) else []
            losses, updates = [v["loss"] for v in valid], [int(v["num_updates"]) for v in valid]
            stop = convergence(losses, updates, run_protocol(self.p, self.configs[config]))
            if stop:
                break
            log(f"{name}: epoch {len(valid) + 1}" + (f" (valid loss so far {losses[-1]:.3f})" if losses else ""))
            t = time.time()
            sh(self.train_command(config, lr, seed, save, len(valid) + 1), logfile=train_log, env=env)
            add_seconds(clock, time.time() - t)
        log(f"{name}: stopped after {len(valid)} epochs ({stop}); averaging, validating, translating")
        return self.evaluate(name, config, lr, seed, save, valid, stop)

    # -- Terraformer's generalisation tasks
    def synthetic_make_flags(self, task):
        """`synthetic make`'s flags for `task` (without --out)."""
        s = self.p.synthetic
        return ["--task", task, "--train", str(s.train), "--valid", str(s.valid), "--test", str(s.test),
                "--max-train-digits", str(s.max_train_digits), "--test-digits", s.test_digits]

    def synthetic_signature(self, task):
        """What decides the examples of `task`: synthetic.py's data format and make's flags."""
        from .synthetic import DATA_FORMAT

        return json.dumps({"format": DATA_FORMAT[task], "make": self.synthetic_make_flags(task)})

    def synthetic_data(self, task):
        """OUT/synthetic/TASK: the task's examples and their binarized form, made once (under a lock); made
        again when their signature (bin/done) is not the current one."""
        folder, signature = os.path.join(self.out, "synthetic", task), self.synthetic_signature(task)
        os.makedirs(folder, exist_ok=True)
        done = os.path.join(folder, "bin", "done")
        with open(os.path.join(folder, "make.lock"), "a") as guard:
            fcntl.flock(guard, fcntl.LOCK_EX)
            current = open(done).read() if os.path.exists(done) else None
            if current != signature:
                if current is not None:
                    log(f"{folder}: made by another data format or other flags; making it again")
                shutil.rmtree(os.path.join(folder, "raw"), ignore_errors=True)
                sh([sys.executable, "-m", "fairseq_ext.tools.synthetic", "make", *self.synthetic_make_flags(task),
                    "--out", os.path.join(folder, "raw")])
                shutil.rmtree(os.path.join(folder, "bin"), ignore_errors=True)
                raw = os.path.join(folder, "raw")
                sh(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref",
                    os.path.join(raw, "train"), "--validpref", os.path.join(raw, "valid"), "--testpref",
                    os.path.join(raw, "test"), "--joined-dictionary", "--destdir", os.path.join(folder, "bin"),
                    "--workers", "1"])
                with open(done, "w") as f:
                    f.write(signature)
        return os.path.join(folder, "bin")

    @staticmethod
    def saved_updates(train_log):
        """Updates of the last checkpoint fairseq-train saved (its "Saved checkpoint ... @ N updates" line,
        written once checkpoint_last.pt is in place), 0 before any."""
        if not os.path.exists(train_log):
            return 0
        with open(train_log, encoding="utf-8", errors="replace") as f:
            found = re.findall(r"Saved checkpoint \S+ \(epoch \d+ @ (\d+) updates", f.read())
        return int(found[-1]) if found else 0

    def synthetic_decode(self, data_bin, ckpt, split, out, analyse=False):
        """Greedy decoding of `split` with checkpoint `ckpt`: {examples, sequence_accuracy, token_accuracy}, and
        with `analyse` how the wrong answers are wrong ("errors": synthetic.errors)."""
        import torch

        from .synthetic import errors, read_generate, score

        device = [] if torch.cuda.is_available() else ["--cpu"]
        # the answer is at most one digit longer than the longest operand: max length = source length + 2
        text = sh(["fairseq-generate", data_bin, "--user-dir", os.path.join(REPO, "fairseq_ext"), *device,
                   "--source-lang", "src", "--target-lang", "tgt", "--gen-subset", split, "--path", ckpt,
                   "--beam", "1", "--max-len-a", "1", "--max-len-b", "2", "--batch-size", "50"])
        with open(out + ".tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(out + ".tmp", out)
        pairs = read_generate(out)
        return {**score(pairs), **({"errors": errors(pairs)} if analyse else {})}

    def synthetic_chunk(self, c, lr, seed, data_bin, save, train_log, target):
        """fairseq-train up to `target` updates (from checkpoint_last.pt when there is one)."""
        s, prec = self.p.synthetic, self.meta["precision"]["flag"]
        sh(["bash", os.path.join(REPO, "examples/train.sh"), data_bin, save] + c.flags
           + ["--source-lang", "src", "--target-lang", "tgt", "--label-smoothing", "0", "--lr", lr,
              "--warmup-updates", str(s.warmup), "--seed", str(seed), "--max-tokens", str(s.max_tokens),
              "--dropout", str(self.p.dropout), "--no-epoch-checkpoints", "--max-update", str(target)]
           + ([prec] if prec else []), logfile=train_log, env={"LOG_INTERVAL": "100", "PRECISION": "fp32"})

    def do_synthetic(self, config, lr, seed):
        """Train in chunks of s.interval updates; after each, decode the valid set greedily (in distribution)
        and keep the checkpoint of the best valid accuracy (checkpoint_at{updates}.pt); stop by
        synthetic_convergence; decode the test set (out of distribution) with the kept checkpoint. Every
        step is resumable: a chunk resumes from checkpoint_last.pt, a chunk already trained is not trained
        again (fairseq-train started at --max-update would take one more update), a decoding recorded in
        evals.json is not repeated, and a kept checkpoint is removed only once evals.json names a better one."""
        from ..checkpointing import atomic_copy
        from .synthetic import DATA_FORMAT
        from .train_log import parse_train_log

        s, c = self.p.synthetic, self.configs[config]
        task = config.split("_", 1)[0]
        name = run_name(config, lr, seed)
        save = os.path.join(self.out, "runs", name)
        os.makedirs(save, exist_ok=True)
        data_bin = self.synthetic_data(task)
        signature, mark = self.synthetic_signature(task), os.path.join(save, "data_signature")
        started = [f for f in os.listdir(save) if f in ("checkpoint_last.pt", "evals.json", "train.log")
                   or f.startswith("checkpoint_at")]
        if started and (not os.path.exists(mark) or open(mark).read() != signature):
            # trained on other examples (an older synthetic.py DATA_FORMAT, other flags): kept aside, not resumed
            aside = os.path.join(self.out, "retired", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")
            os.makedirs(aside)
            for f in os.listdir(save):
                if f != "lock":  # the lock file stays: this process holds it (claim)
                    os.replace(os.path.join(save, f), os.path.join(aside, f))
            log(f"{name}: {save} was trained on other {task} examples than the current ones; its files moved to "
                f"{aside}, training afresh")
            started = []
        if not started:
            with open(mark, "w") as f:
                f.write(signature)
        train_log, clock = os.path.join(save, "train.log"), os.path.join(save, "train_seconds")
        evals_path = os.path.join(save, "evals.json")
        evals = []
        if os.path.exists(evals_path):
            with open(evals_path) as f:
                evals = json.load(f)
        key = lambda e: (e["sequence_accuracy"], e["token_accuracy"])
        while not (stop := synthetic_convergence(evals, s)):
            target = (len(evals) + 1) * s.interval
            log(f"{name}: updates {target - s.interval}-{target}"
                + (f" (valid sequence accuracy so far {evals[-1]['sequence_accuracy']:.1f}%)" if evals else ""))
            t = time.time()
            if self.saved_updates(train_log) < target:  # else trained before an interruption, not decoded
                self.synthetic_chunk(c, lr, seed, data_bin, save, train_log, target)
            add_seconds(clock, time.time() - t)
            last = os.path.join(save, "checkpoint_last.pt")
            r = self.synthetic_decode(data_bin, last, "valid", os.path.join(save, "generate-valid.txt"))
            valid = {int(v["num_updates"]): v for v in parse_train_log(train_log)["valid"]}
            e = {"updates": target, "valid_loss": valid[target]["loss"] if target in valid else None,
                 "sequence_accuracy": r["sequence_accuracy"], "token_accuracy": r["token_accuracy"],
                 "examples": r["examples"]}
            better = not evals or key(e) > max(key(x) for x in evals)  # the best valid accuracy so far
            if better:
                kept = os.path.join(save, f"checkpoint_at{target}.pt")
                atomic_copy(last, kept)
            evals.append(e)
            with open(evals_path + ".tmp", "w") as f:
                json.dump(evals, f, indent=1)
            os.replace(evals_path + ".tmp", evals_path)
            if better:  # evals.json names the new best: the one it replaces can go
                for old in glob.glob(os.path.join(save, "checkpoint_at*.pt")):
                    if old != kept:
                        os.remove(old)
        best = max(evals, key=key)
        chosen = os.path.join(save, f"checkpoint_at{best['updates']}.pt")
        log(f"{name}: stopped after {evals[-1]['updates']} updates ({stop}); the checkpoint of the best valid "
            f"accuracy ({best['updates']} updates) decodes the test set")
        test = self.synthetic_decode(data_bin, chosen, "test", os.path.join(save, "generate-test.txt"), analyse=True)
        for old in glob.glob(os.path.join(save, "checkpoint_at*.pt")) + [os.path.join(save, "checkpoint_best.pt")]:
            if old != chosen and os.path.exists(old):  # checkpoint_last.pt and the kept one stay
                os.remove(old)
        log_ = parse_train_log(train_log)
        result = {
            "name": name, "config": config, "paper": c.paper, "role": c.role, "what": c.what, "task": task,
            "model": config.split("_", 1)[1], "lr": lr, "warmup": s.warmup, "seed": seed,
            "flags": " ".join(c.flags), "protocol": self.p.name, "parameters": log_["params"],
            "train_digits": f"1-{s.max_train_digits}", "test_digits": s.test_digits,
            "data_format": DATA_FORMAT[task],
            "updates": evals[-1]["updates"], "chosen_updates": best["updates"], "stopped_by": stop,
            "converged": stop in ("perfect", "plateau"), "evals": evals,
            "valid": {"examples": best["examples"], "sequence_accuracy": best["sequence_accuracy"],
                      "token_accuracy": best["token_accuracy"]},
            "test": test, **self.run_facts(save, log_),
        }
        self.publish_result(name, result)
        log(f"{name}: valid {best['sequence_accuracy']:.1f}% / {best['token_accuracy']:.1f}%, test "
            f"{test['sequence_accuracy']:.1f}% / {test['token_accuracy']:.1f}% (sequences / tokens)")
        return result

    def run_facts(self, save, log_):
        """The last fields of a run's result: training speed and time, machine, code version, date."""
        wps = [t["wps"] for t in log_["train"] if "wps" in t]
        clock = os.path.join(save, "train_seconds")
        return {
            "train_tokens_per_s": statistics.median(wps) if wps else None,
            "train_seconds": round(float(open(clock).read())) if os.path.exists(clock) else None,
            "precision": self.meta["precision"]["precision"], "cpu": cpu_model(),  # this machine's
            **({"bf16_products": bf16_products(os.path.join(save, "train.log"))}
               if self.meta["precision"]["precision"] == "bf16" else {}),
            "threads": int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count(),
            "git": git_rev(), "finished": time.strftime("%Y-%m-%d %H:%M"),
        }

    def publish_result(self, name, result):
        for path in [os.path.join(self.results, name + ".json")] + (
                [os.path.join(self.publish, name + ".json")] if self.publish else []):
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(dump_result(result))
            os.replace(tmp, path)

    def evaluate(self, name, config, lr, seed, save, valid, stop):
        from .average_checkpoints import last_n_checkpoints, write_average
        from .train_log import parse_train_log

        epochs = sorted((int(m.group(1)), f) for f in os.listdir(save)
                        if (m := re.fullmatch(r"checkpoint(\d+)\.pt", f)))
        n = min(self.p.average, len(epochs))
        avg = os.path.join(save, "averaged.pt")
        write_average(last_n_checkpoints([save], n, update_based=False), avg)  # in this process: no fairseq start-up
        data_bin = os.path.join(self.data, "bin")
        out = sh(["fairseq-validate", data_bin, "--user-dir", os.path.join(REPO, "fairseq_ext"), "--path", avg,
                  "--task", "translation", "--source-lang", "en", "--target-lang", "de", "--valid-subset", "valid",
                  "--max-tokens", str(self.p.max_tokens), "--cpu"])
        m = re.search(r"valid on 'valid' subset \| loss ([0-9.]+) \| nll_loss ([0-9.]+)", out)
        for f in ("spm.model",):
            shutil.copy(os.path.join(self.data, f), save)
        for lang in ("en", "de"):
            shutil.copy(os.path.join(data_bin, f"dict.{lang}.txt"), save)
        ev = os.path.join(save, "eval")
        sh(["bash", os.path.join(REPO, "examples/evaluate.sh"), save, self.p.corpus, ev] + self.p.eval_flags,
           env={"CKPT": avg, "TEST_BIN": data_bin})  # the test split binarized with the study's spm and dictionary
        with open(os.path.join(ev, "score.json")) as f:
            score = json.load(f)
        log_ = parse_train_log(os.path.join(save, "train.log"))
        c = self.configs[config]
        result = {
            "name": name, "config": config, "paper": c.paper, "role": c.role, "what": c.what, "lr": lr,
            "warmup": self.p.warmup, "seed": seed, "flags": " ".join(self.p.dims + c.flags), "protocol": self.p.name,
            "parameters": log_["params"], "epochs": len(valid), "updates": int(valid[-1]["num_updates"]),
            "stopped_by": stop, "converged": stop in ("patience", "plateau"),
            "valid_curve": [[int(v["num_updates"]), v["loss"], v.get("nll_loss")] for v in valid],
            "valid_loss": min(v["loss"] for v in valid),
            "averaged_checkpoints": n,
            "averaged_valid_loss": float(m.group(1)) if m else None,
            "averaged_valid_nll": float(m.group(2)) if m else None,
            "bleu": score["bleu"], "chrf": score["chrf"], "bleu_signature": score.get("bleu_signature"),
            "chrf_signature": score.get("chrf_signature"),
            "decode_sentences_per_s": (score.get("speed") or {}).get("sentences_per_s"),
            **self.run_facts(save, log_),
        }
        self.publish_result(name, result)
        for f in [f for _, f in epochs] + ["checkpoint_best.pt"]:  # averaged.pt and checkpoint_last.pt stay
            if os.path.exists(os.path.join(save, f)):
                os.remove(os.path.join(save, f))
        log(f"{name}: BLEU {result['bleu']}, chrF {result['chrf']}, valid loss {result['valid_loss']:.3f} "
            f"({result['epochs']} epochs, {stop})")
        return result

    def retrain(self, config, lr, seed):
        """Train a finished run again in OUT/runs (resumable as any run) when its model is not there (a run
        finished on another machine): its result goes to OUT/results only; returns it."""
        name = run_name(config, lr, seed)
        stale = os.path.join(self.results, name + ".json")
        if os.path.exists(stale) and not os.path.exists(os.path.join(self.out, "runs", name, "averaged.pt")):
            os.remove(stale)  # a result here without its model: trained again
        if not self.claim(name):
            raise SystemExit(f"{name}: another process is training it, or its model is in {self.out}/runs already")
        try:
            log(f"run {name} (trained again for shipping)")
            return self.do_run(config, lr, seed)
        finally:
            self.release(name)

    def claim(self, name):
        """Take run `name` for this process (several `run` processes can share OUT, each training other
        runs): an exclusive advisory lock (flock) on the run folder's lock file, held open until `release`.
        The kernel drops the lock when its process ends however it ends, so a killed sitting leaves nothing
        stale to clean up, and two processes can never both take a run (no remove-and-recreate race).
        A run that another process finished since this one listed its plan is not taken."""
        folder = os.path.join(self.out, "runs", name)
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, "lock"), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False  # another live process trains it
        if self.result(name) is not None:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())  # for a person looking at the folder
        self._locks[name] = fd
        return True

    def todo(self):
        """The planned runs without a result, in the plan's order except that a run interrupted earlier (its
        checkpoint_last.pt is there) comes before every new one: what a sitting started is finished first."""
        todo = [r for r in self.plan() if self.result(run_name(*r[:3])) is None]
        def new(r):
            return not os.path.exists(os.path.join(self.out, "runs", run_name(*r[:3]), "checkpoint_last.pt"))

        return sorted(todo, key=new)  # a stable sort: the plan's order otherwise

    def release(self, name):
        fd = self._locks.pop(name, None)
        if fd is not None:
            os.close(fd)  # the file stays: removing it would let two processes lock two different files

    def run(self, max_runs=None):
        self.setup()
        done = 0
        while True:
            todo = self.todo()
            if not todo:
                log(f"nothing left to run in this stage of the protocol; results in {self.results}")
                return
            if max_runs is not None and done >= max_runs:
                log(f"stopping after {done} runs (--max-runs); {len(todo)} planned runs remain")
                return
            mine = next((r for r in todo if self.claim(run_name(*r[:3]))), None)
            if mine is None:  # every planned run is being trained by another process: wait for one
                time.sleep(POLL_SECONDS)
                continue
            config, lr, seed, why = mine
            name = run_name(config, lr, seed)
            log(f"run {name} ({why}); {len(todo) - 1} more planned")
            try:
                self.do_run(config, lr, seed)
            finally:
                self.release(name)
            done += 1


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="carry out the protocol in OUT (resumable)")
    r.add_argument("out")
    r.add_argument("--protocol", choices=sorted(PROTOCOLS), default="paper")
    r.add_argument("--corpus", help="corpus folder (default: the protocol's; required for tiny)")
    r.add_argument("--max-runs", type=int, help="stop after this many new runs")
    r.add_argument("--configs", help="comma-separated configurations to run (default: all; the baseline comes with "
                                     "any translation configuration, not with the synthetic tasks alone)")
    r.add_argument("--publish", help="also write each run's result file here (default for the paper "
                                     "protocol: docs/results/runs)")
    t = sub.add_parser("table", help="write docs/results from the run files")
    t.add_argument("--results", default=RESULTS)
    t.add_argument("--check", action="store_true", help="fail when the written docs would change")
    s = sub.add_parser("ship", help="export each complete configuration's median-BLEU seed to shipped/")
    s.add_argument("--study", default=os.path.join(REPO, "runs", "study"), help="the study's OUT folder")
    s.add_argument("--results", default=RESULTS)
    s.add_argument("--out", default=os.path.join(REPO, "shipped"))
    s.add_argument("--protocol", choices=sorted(PROTOCOLS), default="paper")
    s.add_argument("--retrain", action="store_true",
                   help="train a chosen run again when its model is not in the study folder (a run finished on "
                        "another machine), then compare its result with the committed one")
    s.add_argument("--corpus", help="with --retrain: the corpus folder (default: the protocol's)")
    args = p.parse_args(argv)
    if args.cmd == "run":
        protocol = PROTOCOLS[args.protocol]
        publish = args.publish or (os.path.join(RESULTS, "runs") if args.protocol == "paper" else None)
        only = set(args.configs.split(",")) if args.configs else None
        known = [c.name for c in configs(protocol) + synthetic_configs(protocol)]
        unknown = (only or set()) - set(known)
        if unknown:
            p.error(f"--configs: unknown {', '.join(sorted(unknown))} (known: {', '.join(known)})")
        translation = only is None or bool(only & {c.name for c in configs(protocol)})
        if translation and not (args.corpus or protocol.corpus):
            p.error(f"--protocol {args.protocol} needs --corpus (the translation configurations train on it)")
        Study(args.out, protocol, args.corpus, publish, only).run(args.max_runs)
    elif args.cmd == "ship":
        from .study_ship import ship

        protocol, retrain = PROTOCOLS[args.protocol], None
        if args.retrain:
            if not (args.corpus or protocol.corpus):
                p.error(f"--retrain with --protocol {args.protocol} needs --corpus (the run trains on it)")
            # publishes nowhere (the committed file stays); trains in the committed runs' precision
            study = Study(args.study, protocol, args.corpus, precedent=os.path.join(args.results, "runs"))
            study.setup()

            def retrain(run):
                return study.retrain(run["config"], run["lr"], run["seed"])
        ship(args.study, args.results, args.out, protocol.seeds, retrain)
    else:
        from .study_report import write_report

        changed = write_report(args.results, check=args.check)
        if args.check and changed:
            raise SystemExit(f"docs differ from the run files: {', '.join(changed)} (run: python -m "
                             f"fairseq_ext.tools.study table)")


if __name__ == "__main__":
    main()
