"""The study's tables, curves and verdicts, generated from its run files (docs/results/runs/*.json).

    python -m fairseq_ext.tools.study table [--results docs/results] [--check]

Writes, between markers, the Results section of docs/results/README.md and of the repository's README.md,
plus docs/results/summary.json and docs/results/valid_curves.png. Nothing here is typed by hand: rerun
after new runs finish. The statistics and verdict rules are the protocol's (docs/results/README.md).
"""
import glob
import json
import math
import os
import statistics

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BEGIN, END = "<!-- study:results:begin -->", "<!-- study:results:end -->"

# The claim each paper makes that this scale can test, the metric it is judged on, and the margin
# within which "matches" holds (protocol: docs/results/README.md).
CLAIMS = [
    ("one_wide_ffn", "One Wide FFN (Pires et al. 2023)",
     "one FFN shared by the encoder, none in the decoder, widened to the baseline's parameters, matches or "
     "beats the baseline's BLEU", "bleu"),
    ("can", "Compressed Attention Network (Li et al. 2021)",
     "a decoder of CAN sub-layers matches the balanced baseline's BLEU", "bleu"),
    ("sparse_ffn", "Scaling Transformers (Jaszczur et al. 2021)",
     "a top-1-of-64 sparse FFN matches the dense model's log-perplexity at the same size", "valid_loss"),
    ("sparse_ffn_qkv", "Scaling Transformers (Jaszczur et al. 2021)",
     "sparse FFN + sparse QKV match the dense model's log-perplexity at the same size", "valid_loss"),
    ("sas", "Simplified Transformer blocks (He & Hofmann 2024)",
     "SAS / SAS-P blocks match the Pre-LN block's loss per update with fewer parameters", "valid_loss"),
]
# the table's row order: each paper's main configuration, then its ablations and diagnoses
ORDER = ["baseline", "one_wide_ffn", "shared_enc_no_dec", "one_wide_ffn_shared_lr", "can", "can_attention", "can_ffn",
         "sparse_ffn", "sparse_ffn_qkv", "sparse_ffn_qkv_all", "sparse_ffn_128", "sas", "sas_sequential", "sas_nonorm"]
MARGIN = {"bleu": 0.5, "valid_loss": 0.01}  # absolute BLEU; relative validation loss
# Terraformer's generalisation tasks (Jaszczur et al. 2021, Table 4: 256-300 digits, out of distribution):
# the paper's (sequence, token) accuracy in %, and the token-accuracy gap that counts as a difference
SYNTHETIC_PAPER = {("copy", "terraformer"): (93.9, 99.9), ("copy", "transformer"): (0.0, 79.8),
                   ("addition", "terraformer"): (32.4, 86.9), ("addition", "transformer"): (0.0, 36.4)}
SYNTHETIC_MARGIN = 5.0
LOWER_IS_BETTER = {"bleu": False, "chrf": False, "valid_loss": True}
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}


def load_runs(results):
    runs = []
    for path in sorted(glob.glob(os.path.join(results, "runs", "*.json"))):
        with open(path) as f:
            runs.append(json.load(f))
    return runs


def metric(run, name):
    return run["averaged_valid_loss"] if name == "valid_loss" and run.get("averaged_valid_loss") else run[name]


def mean_sd(values):
    if not values:
        return None, None
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def fmt(m, sd, digits=2):
    if m is None:
        return "-"
    return f"{m:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")


def main_lr(runs):
    """The study's learning rate: the one the non-sweep baseline seeds and the methods' seed-1 runs use
    (the sweep's winner); None before the sweep is complete."""
    lrs = {r["lr"] for r in runs if r["config"] != "baseline" and r["seed"] == 1}
    seeds = {r["lr"] for r in runs if r["config"] == "baseline" and r["seed"] > 1}
    candidates = seeds or lrs
    if len(candidates) == 1:
        return next(iter(candidates))
    sweep = [r for r in runs if r["config"] == "baseline" and r["seed"] == 1]
    return min(sweep, key=lambda r: r["valid_loss"])["lr"] if len(sweep) >= 3 else None


def paired(method, base, name):
    """Paired differences method − baseline over the seeds both have, (mean, sd, n, p<0.05)."""
    b = {r["seed"]: metric(r, name) for r in base}
    d = [metric(r, name) - b[r["seed"]] for r in method if r["seed"] in b]
    if name == "valid_loss":  # relative difference of a loss
        d = [x / b[r["seed"]] for x, r in zip(d, [r for r in method if r["seed"] in b])]
    return paired_stats(d)


def paired_stats(d):
    """(mean, sd, n, p<0.05 by a two-sided paired t-test) of paired differences d; None without any."""
    if not d:
        return None
    m = statistics.mean(d)
    if len(d) < 2:
        return m, None, len(d), False
    sd = statistics.stdev(d)
    t = abs(m) / (sd / math.sqrt(len(d))) if sd > 0 else math.inf
    return m, sd, len(d), t > T95[len(d) - 1]


def at_equal_updates(method, base):
    """Paired relative differences method / baseline − 1 (same seed) of the validation loss at the last
    validation both runs reached (each epoch's own checkpoint, not the average): where the stopping rule ended
    each run does not enter. (mean, sd, n, p<0.05, [epoch of each pair]); None without a pair."""
    curve = lambda r: {int(v[0]): v[1] for v in r["valid_curve"]}  # updates -> valid loss
    b = {r["seed"]: curve(r) for r in base}
    d, epochs = [], []
    for r in method:
        mine = curve(r)
        common = set(mine) & set(b.get(r["seed"], {}))
        if common:
            u = max(common)
            d.append(mine[u] / b[r["seed"]][u] - 1)
            epochs.append(sorted(mine).index(u) + 1)
    s = paired_stats(d)
    return None if s is None else (*s, epochs)


def fmt_percent(m, sd):
    """A relative difference (and its sd over seeds, None for one seed) in percent."""
    return f"{100 * m:+.1f}%" + (f" ± {100 * sd:.1f}%" if sd is not None else "")


def fmt_equal(e):
    """A table cell of at_equal_updates: the relative difference, its sd and mark, the epoch(s) it is at."""
    if e is None:
        return "-"
    m, sd, _, significant, epochs = e
    at = f"{min(epochs)}" if min(epochs) == max(epochs) else f"{min(epochs)}-{max(epochs)}"
    return fmt_percent(m, sd) + (" *" if significant else "") + f" (epoch {at})"


def verdict(diff, name):
    if diff is None:
        return "not run yet"
    m, sd, n, significant = diff
    better = -m if LOWER_IS_BETTER[name] else m  # > 0: the method is better
    margin = MARGIN[name]
    if n < 2:
        return "inconclusive at this scale (1 seed)"
    if better >= -margin and not (significant and better < 0):
        return "holds"
    if significant and better < -margin:
        return "does not hold"
    return "inconclusive at this scale"


def load_bench(results, name):
    """A speed benchmark of the study's configurations (benchmarks/run_presets.py, preset `name`: train_study
    or decode_study, every configuration in one process on one machine), beside docs/results in
    docs/benchmarks; None when it is absent."""
    path = os.path.join(os.path.dirname(os.path.abspath(results)), "benchmarks", name + ".json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def bench_name(models, run):
    """The benchmark's name for run's model: its configuration's, else the model measured under the same spec
    (a diagnosis that trains a measured configuration's model again); None where it was not measured."""
    from .study import bench_spec

    if run["config"] in models:
        return run["config"]
    spec = bench_spec(run["flags"].split())
    return next((n for n, m in models.items() if m.get("spec") == spec), None)


def edit(r):
    """A synthetic run's test token accuracy by edit distance, or '-' for a run file written without it."""
    e = r["test"].get("errors")
    return "-" if e is None else f"{e['edit_token_accuracy']:.1f}"


def synthetic_planned():
    """(task, model) of every generalisation run the study's protocol plans (study.synthetic_configs): the four
    of Table 4 and the diagnosis runs beside them (no paper figure, no verdict of their own)."""
    from .study import PROTOCOLS, synthetic_configs

    return [tuple(c.name.split("_", 1)) for c in synthetic_configs(PROTOCOLS["paper"])]


def synthetic_section(runs, summary):
    """Terraformer's generalisation tasks: each run's accuracies beside the paper's, and per task the verdict
    on its claim (the Terraformer generalises to longer numbers, the Transformer does not)."""
    lines = ["### Terraformer's generalisation (copy and addition, Table 4)", "",
             "Trained on inputs of " + runs[0]["train_digits"] + " digits (addition: both operands together, "
             "least significant digit first) until the valid set's (in "
             "distribution) accuracy stopped improving; the checkpoint of the best valid accuracy decodes the "
             f"test set, inputs of {runs[0]['test_digits']} digits (out of distribution); greedy decoding; "
             "sequence / token accuracy in %, the token accuracy position by position (a missing or extra position counts as wrong); edit distance: "
             "the test's token accuracy as 1 − edit distance / reference tokens, where one digit left out or repeated "
             "costs one token, not every later position (`python -m fairseq_ext.tools.synthetic errors`); 1 seed (the "
             "paper reports one figure per model).", "",
             "| task | model | parameters | updates | stopped by | valid (in distribution) | test (out of distribution) "
             "| test, edit distance | paper, test |", "|---|---|---|---|---|---|---|---|---|"]
    by = {(r["task"], r["model"]): r for r in runs}
    for task in ("copy", "addition"):
        for model in [m for t, m in synthetic_planned() if t == task]:
            r = by.get((task, model))
            paper = SYNTHETIC_PAPER.get((task, model))
            paper = "- (diagnosis)" if paper is None else f"{paper[0]:.1f} / {paper[1]:.1f}"
            if r is None:
                lines.append(f"| {task} | {model} | - | - | not run yet | - | - | - | {paper} |")
                continue
            lines.append(f"| {task} | {model} | {r['parameters'] / 1e6:.2f}M | {r['updates']:,} "
                         f"(best {r['chosen_updates']:,}) | {r['stopped_by']} | {r['valid']['sequence_accuracy']:.1f} / "
                         f"{r['valid']['token_accuracy']:.1f} | {r['test']['sequence_accuracy']:.1f} / "
                         f"{r['test']['token_accuracy']:.1f} | " + edit(r) + f" | {paper} |")
    lines += ["", "| task | claim | Terraformer − Transformer, test token accuracy | test sequence accuracy | "
              "verdict |", "|---|---|---|---|---|"]
    summary["synthetic"] = []
    for task in ("copy", "addition"):
        t, b = by.get((task, "terraformer")), by.get((task, "transformer"))
        if t is None or b is None:
            diff, seq, v = None, None, "not run yet"
        else:
            diff = t["test"]["token_accuracy"] - b["test"]["token_accuracy"]
            seq = t["test"]["sequence_accuracy"] - b["test"]["sequence_accuracy"]
            if not (t["converged"] and b["converged"]):
                v = "inconclusive (not converged)"
            elif diff > SYNTHETIC_MARGIN:
                v = "holds (1 seed)"
            else:
                v = "does not hold (1 seed)"
        claim = (f"on {task}, the Terraformer generalises to over 2× longer numbers than it trained on, better than "
                 f"the Transformer (paper, token accuracy at 256-300 digits: {SYNTHETIC_PAPER[(task, 'terraformer')][1]:.1f}"
                 f" vs {SYNTHETIC_PAPER[(task, 'transformer')][1]:.1f})")
        lines.append(f"| {task} | {claim} | " + ("-" if diff is None else f"{diff:+.1f} points") + " | "
                     + ("-" if seq is None else f"{seq:+.1f} points") + f" | {v} |")
        summary["synthetic"].append({"task": task, "difference": diff, "sequence_difference": seq, "verdict": v})
    return lines


DECODE_BATCH = "64"  # the decoding benchmark's batch size the table shows (sentences per batch, beam 5)


def report(runs, train_speed=None, synthetic=None, decode_speed=None):
    """(markdown, summary dict). train_speed: load_bench's train_study, the source of the training-speed
    column (the runs' own logs are measured on whichever machine and code each run trained with).
    synthetic: the runs of Terraformer's generalisation tasks (their own section). decode_speed: load_bench's
    decode_study, the source of the decoding-speed column (else each run's own test decoding)."""
    if not runs:
        if synthetic:  # only the generalisation tasks ran (--configs copy_transformer,...)
            summary = {"runs": 0}
            return "\n".join(synthetic_section(synthetic, summary)), summary
        return "No run has finished yet.", {"runs": 0}
    lr = main_lr(runs)
    lines = []
    sweep = sorted([r for r in runs if r["seed"] == 1], key=lambda r: (r["config"], float(r["lr"])))
    rates = sorted({r["lr"] for r in sweep}, key=float)
    by_config = {}
    for r in sweep:
        by_config.setdefault(r["config"], {})[r["lr"]] = r
    lines += ["### Learning rates (seed 1, validation loss of the averaged checkpoints, bits per token)", "",
              "| configuration | " + " | ".join(f"lr {x}" for x in rates) + " | best |",
              "|---|" + "---|" * (len(rates) + 1)]
    for config, by_lr in by_config.items():
        cells = [f"{metric(by_lr[x], 'valid_loss'):.3f}" if x in by_lr else "-" for x in rates]
        best = min(by_lr.values(), key=lambda r: metric(r, "valid_loss"))["lr"] if len(by_lr) == len(rates) else "-"
        lines.append(f"| {config} | " + " | ".join(cells) + f" | {best} |")
    lines.append("")
    summary = {"runs": len(runs), "lr": lr, "configs": {}, "claims": []}
    if lr is None:
        lines.append("The learning-rate sweep of the baseline is not complete: no comparison yet.")
        return "\n".join(lines), summary
    at_lr = [r for r in runs if r["lr"] == lr]
    groups = {}
    for r in at_lr:
        groups.setdefault(r["config"], []).append(r)
    base = groups.get("baseline", [])
    bench = (train_speed or {}).get("models", {})
    if bench:
        m = train_speed["machine"]
        speed_note = (f"Training tokens/s: {train_speed['settings']['threads']} thread, bf16 autocast, every "
                      f"configuration measured in one run of `python benchmarks/run_presets.py --only train_study` "
                      f"({m['processor']}; `docs/benchmarks/train_study.md`), × the baseline there. ")
    else:
        speed_note = "Training tokens/s: median of each run's log, × the baseline's. "
    dbench = (decode_speed or {}).get("models", {})
    if dbench:
        ds = decode_speed["settings"]
        decode_note = (f"Decoding tokens/s: fairseq's generator, beam {ds['beam']}, batches of {DECODE_BATCH} "
                       f"sentences, {ds['threads']} thread, every configuration measured in one run of "
                       f"`python benchmarks/run_presets.py --only decode_study` ({decode_speed['machine']['processor']}; "
                       "`docs/benchmarks/decode_study.md`), × the baseline there (median of interleaved rounds).")
        decode_head = "decoding tokens/s"
    else:
        decode_note = ("Decoding sentences/s: each run's test-set translation (mean over seeds), × the baseline's "
                       "runs on the same CPU model (- where none ran there).")
        decode_head = "decoding sentences/s"
    lines += [f"### Every configuration at the baseline's learning rate ({lr})", "",
              "Mean ± standard deviation over seeds; Δ: paired difference to the baseline (same seed), "
              "* where a paired t-test over the seeds gives p < 0.05. Valid loss: the averaged checkpoints, "
              "bits per token (label-smoothed). Δ valid at equal updates: each epoch's own checkpoint against the "
              "baseline's of the same seed at the last epoch both runs reached (relative, paired; the epoch in "
              "brackets), so that where the stopping rule ended each run does not enter. " + speed_note + decode_note,
              "", "| configuration | parameters | seeds | epochs | valid loss | Δ valid at equal updates | BLEU | Δ BLEU "
              f"| chrF | training tokens/s | {decode_head} | converged |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def train_tps(config, rs):
        if bench:
            name = bench_name(bench, rs[0])
            return bench[name]["bf16_tokens_per_s"] if name else None
        return statistics.mean([r["train_tokens_per_s"] for r in rs if r.get("train_tokens_per_s")] or [0]) or None

    def decode_ratio(rs):
        """mean sentences/s of rs over the baseline's mean on the same CPU model(s), None without a baseline there"""
        ratios = []
        for r in rs:
            same = [b["decode_sentences_per_s"] for b in base if b.get("cpu") == r.get("cpu")
                    and b.get("decode_sentences_per_s")]
            if r.get("decode_sentences_per_s") and same:
                ratios.append(r["decode_sentences_per_s"] / statistics.mean(same))
        return statistics.mean(ratios) if ratios else None

    base_tps = train_tps("baseline", base)
    order = [c for c in ORDER if c in groups] + sorted(c for c in groups if c not in ORDER)
    for config in order:
        rs = sorted(groups[config], key=lambda r: r["seed"])
        vl, bl, cf = (mean_sd([metric(r, k) for r in rs]) for k in ("valid_loss", "bleu", "chrf"))
        tps = train_tps(config, rs)
        if dbench:
            name = bench_name(dbench, rs[0])
            dps = dbench[name]["results"][DECODE_BATCH]["tokens_per_s"]["median"] if name else None
            ratio = decode_speed["ratios"][DECODE_BATCH].get(name)
            dratio = ratio["median"] if ratio and config != "baseline" else None
        else:
            dps = statistics.mean([r["decode_sentences_per_s"] for r in rs if r.get("decode_sentences_per_s")]
                                  or [0])
            dratio = decode_ratio(rs) if config != "baseline" else None
        d = paired(rs, base, "bleu") if config != "baseline" else None
        dtxt = "-" if d is None else (f"{d[0]:+.2f}" + (f" ± {d[1]:.2f}" if d[1] is not None else "") + (" *" if d[3] else ""))
        conv = sum(r["converged"] for r in rs)
        eq = at_equal_updates(rs, base) if config != "baseline" else None
        lines.append(
            f"| {config} | {rs[0]['parameters'] / 1e6:.2f}M | {len(rs)} | {statistics.mean(r['epochs'] for r in rs):.1f} "
            f"| {fmt(*vl, 3)} | {fmt_equal(eq)} | {fmt(*bl)} | {dtxt} | {fmt(*cf)} | "
            + ("-" if tps is None else f"{tps:,.0f}" + (f" ({tps / base_tps:.2f}×)" if base_tps and config != "baseline" else ""))
            + (" | -" if dps is None else f" | {dps:,.1f}" + (f" ({dratio:.2f}×)" if dratio else ""))
            + f" | {conv}/{len(rs)} |")
        summary["configs"][config] = {"seeds": [r["seed"] for r in rs], "valid_loss": vl, "bleu": bl, "chrf": cf,
                                      "delta_bleu": d, "delta_valid_equal_updates": eq, "train_tokens_per_s": tps,
                                      ("decode_tokens_per_s" if dbench else "decode_sentences_per_s"): dps,
                                      "decode_ratio": dratio}
    lines += ["", "### The papers' claims at this scale", "",
              "| paper | claim | metric | our difference to the baseline | verdict |", "|---|---|---|---|---|"]
    for config, paper, claim, name in CLAIMS:
        d = paired(groups.get(config, []), base, name) if groups.get(config) else None
        if d is None:
            diff = "-"
        elif name == "valid_loss":
            diff = fmt_percent(d[0], d[1]) + f" ({d[2]} seed{'s' * (d[2] != 1)})"
        else:
            diff = f"{d[0]:+.2f}" + (f" ± {d[1]:.2f}" if d[1] is not None else "") + f" BLEU ({d[2]} seed{'s' * (d[2] != 1)})"
        v = verdict(d, name)
        lines.append(f"| {paper} | {claim} | {'BLEU' if name == 'bleu' else 'valid loss'} | {diff} | {v} |")
        summary["claims"].append({"config": config, "paper": paper, "claim": claim, "metric": name,
                                  "difference": d, "verdict": v})
    if synthetic:
        lines += [""] + synthetic_section(synthetic, summary)
    from .study import PROTOCOLS

    want = PROTOCOLS[runs[0].get("protocol", "paper")].seeds
    mains = ["baseline"] + [c for c, role in {r["config"]: r["role"] for r in runs}.items() if role == "main"]
    mains += [c for c in ["one_wide_ffn", "can", "sparse_ffn", "sparse_ffn_qkv", "sas"]
              if runs[0].get("protocol", "paper") == "paper" and c not in mains]
    missing = [f"{c} ({len(groups.get(c, []))}/{want} seeds)" for c in mains if len(groups.get(c, [])) < want]
    expected = len(synthetic_planned())
    if runs[0].get("protocol", "paper") == "paper" and len(synthetic or []) < expected:
        missing.append(f"Terraformer's generalisation tasks ({len(synthetic or [])}/{expected} runs)")
    if missing:
        lines += ["", "Not complete yet: " + ", ".join(missing) + ". `examples/study/run.sh runs/study` resumes them."]
    lines += ["", f"{len(runs)} runs; curves of validation loss per update: `valid_curves.png`. Each run's settings, "
              "curve, scores, sacrebleu signatures, machine and code version: `runs/<run>.json`."]
    lines += ["", compute_line(runs + list(synthetic or []))]
    return "\n".join(lines), summary


def compute_line(runs):
    """The training time the runs took (their train_seconds: one process each, pauses of the process
    included), per CPU model."""
    per_cpu = {}
    for r in runs:
        if r.get("train_seconds"):
            per_cpu.setdefault(r.get("cpu") or "unknown CPU", []).append(r["train_seconds"])
    if not per_cpu:
        return "Training time: not recorded in the run files."
    every = [t for ts in per_cpu.values() for t in ts]
    parts = "; ".join(f"{cpu}: {len(t)} runs, {sum(t) / 3600:.1f} h (median {statistics.median(t) / 3600:.1f} h)"
                      for cpu, t in sorted(per_cpu.items()))
    return (f"Training time of the {len(every)} runs above, the generalisation tasks included (fairseq-train's wall time in "
            f"each run file, one thread per process, usually two processes side by side): {sum(every) / 3600:.1f} "
            f"process-hours; {parts}.")


def curves(runs, lr, path):
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its import and font search log at DEBUG otherwise
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for r in runs:
        if r["lr"] == lr:
            groups.setdefault(r["config"], []).append(r)
    fig, ax = plt.subplots(figsize=(8, 5))
    for config, rs in sorted(groups.items()):
        n = min(len(r["valid_curve"]) for r in rs)
        xs = [statistics.mean(r["valid_curve"][i][0] for r in rs) for i in range(n)]
        ys = [[r["valid_curve"][i][1] for r in rs] for i in range(n)]
        mean = [statistics.mean(y) for y in ys]
        line, = ax.plot(xs, mean, label=f"{config} ({len(rs)} seed{'s' * (len(rs) != 1)})", lw=2 if config == "baseline" else 1)
        if len(rs) > 1:
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys], color=line.get_color(), alpha=0.2)
    ax.set_xlabel("updates")
    ax.set_ylabel("validation loss (bits per token, label-smoothed)")
    ax.set_title(f"Validation loss per epoch, lr {lr}: mean over seeds, band = min–max")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def _replace_between(text, body):
    if BEGIN not in text or END not in text:
        raise ValueError(f"markers {BEGIN} / {END} not found")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{BEGIN}\n{body}\n{END}{tail}"


def write_report(results, check=False):
    """Regenerate the study's docs; returns the files that changed (with check=True: would change)."""
    everything = load_runs(results)
    runs = [r for r in everything if r.get("role") != "synthetic"]
    from .synthetic import current_format

    synthetic = [r for r in everything if r.get("role") == "synthetic" and current_format(r)]
    body, summary = report(runs, load_bench(results, "train_study"), synthetic, load_bench(results, "decode_study"))
    changed = []
    targets = [os.path.join(results, "README.md")]
    readme = os.path.join(REPO, "README.md")
    if os.path.abspath(results) == os.path.join(REPO, "docs", "results") and os.path.exists(readme):
        with open(readme, encoding="utf-8") as f:
            if BEGIN in f.read():
                targets.append(readme)
    for path in targets:
        with open(path, encoding="utf-8") as f:
            old = f.read()
        new = _replace_between(old, body)
        if new != old:
            changed.append(path)
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    spath = os.path.join(results, "summary.json")
    text = json.dumps(summary, indent=1, sort_keys=True) + "\n"
    old = open(spath).read() if os.path.exists(spath) else None
    if old != text:
        changed.append(spath)
        if not check:
            with open(spath, "w") as f:
                f.write(text)
    if not check and summary.get("lr"):
        curves(runs, summary["lr"], os.path.join(results, "valid_curves.png"))
    return changed
