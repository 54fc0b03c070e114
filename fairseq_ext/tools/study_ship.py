"""Ship the study's models: the median-BLEU seed of the baseline and of each main configuration.

    python -m fairseq_ext.tools.study ship [--study runs/study] [--results docs/results] [--out shipped]

For every configuration of role baseline or main that has all the protocol's seeds at the study's learning
rate, the seed whose test BLEU is the median (the lower of the two middle ones for an even count; ties by
seed) goes to OUT/study-CONFIG/: its averaged checkpoint as fp16 weights without optimizer state
(tools/export_checkpoint.py), the SentencePiece model and dictionaries it was trained with, its train/valid
log lines, its result file (score.json) and SHA256SUMS, which examples/evaluate.sh checks, so `make demo`
translates with it. A configuration whose seeds are not all finished is skipped (said so), and one whose folder
holds its chosen run already (score.json, checksums) is kept as it is. A chosen run
whose model is not in STUDY/runs (it finished on another machine or in a sitting whose STUDY was not kept) is
an error naming the run, or with `--retrain` is trained again with the same settings and seed; its result is
compared with the committed one (epochs, updates, valid curve, averaged valid loss, BLEU, chrF: identical on
the same CPU model, precision and thread count, as training and resuming are deterministic) and the model
ships with its own result file, the comparison written in its README.
"""
import json
import os
import shutil
import statistics

from .export_checkpoint import export, sha256_file
from .study_report import REPO, load_runs, main_lr


def median_seed(runs):
    """The run of median test BLEU (lower middle for an even count; ties broken by seed)."""
    ordered = sorted(runs, key=lambda r: (r["bleu"], r["seed"]))
    return ordered[(len(ordered) - 1) // 2]


def _log_lines(path):
    """The fairseq-train commands and the per-epoch train / valid summary lines of a run's log, with paths
    inside the repository written relative to it."""
    keep = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("$ ") or " | train | " in line or " | valid | " in line:
                keep.append(line.replace(REPO + os.sep, ""))  # paths relative to the repository
    return "".join(keep)


def _shown(path):
    """`path` as the shipped README names it: relative to the repository when inside it (no machine's own
    absolute path in a committed file)."""
    rel = os.path.relpath(os.path.abspath(path), REPO)
    return path if rel.startswith(os.pardir) else rel


# what a run trained again from the same settings and seed must reproduce (the rest is time and machine)
REPRODUCED = ("epochs", "updates", "valid_curve", "averaged_valid_loss", "bleu", "chrf")


def compare(committed, again):
    """{field: (committed, again)} for each REPRODUCED field that differs."""
    return {k: (committed.get(k), again.get(k)) for k in REPRODUCED if committed.get(k) != again.get(k)}


def _already_shipped(dst, run):
    """Whether folder `dst` holds `run` already: its score.json names the run and its files match SHA256SUMS.
    Such a folder is kept (a model trained again for it, and its README's account of that, are not thrown
    away; a fresh machine does not train it a second time)."""
    try:
        with open(os.path.join(dst, "score.json")) as f:
            score = json.load(f)
        with open(os.path.join(dst, "SHA256SUMS")) as f:
            sums = [line.split() for line in f if line.strip()]
        return score.get("name") == run["name"] and bool(sums) and all(
            sha256_file(os.path.join(dst, name)) == digest for digest, name in sums)
    except (OSError, ValueError):
        return False


def _retrained_note(run, again, differs):
    """The shipped README's paragraph on a model trained again: where, and how it compares."""
    def where(r):
        return f"{r.get('cpu')} ({r.get('precision')}, {r.get('threads')} thread(s))"

    if not differs:
        verdict = "Its epochs, updates, valid curve, averaged valid loss, BLEU and chrF are identical to the committed run's."
    else:
        same = all(run.get(k) == again.get(k) for k in ("cpu", "precision", "threads"))
        verdict = ("It differs from the committed run in " + "; ".join(
            f"{k} ({a} there, {b} here)" if k != "valid_curve" else "its valid curve" for k, (a, b) in differs.items())
            + (" although both trained on the same CPU model, precision and threads" if same else
               ": another CPU model, precision or thread count rounds differently") + ".")
    return (f"This model was trained again from the same settings and seed (`python -m fairseq_ext.tools.study ship "
            f"--retrain`) on {where(again)}; the committed run trained on {where(run)}. {verdict} score.json is "
            "this model's own result.\n\n")


def ship(study, results, out, seeds, retrain=None):
    """Writes OUT/study-CONFIG for each complete configuration; returns {config: run name} shipped.
    retrain(run) -> result: trains a chosen run whose model is missing again (None: that is an error)."""
    runs = [r for r in load_runs(results) if r.get("role") in ("baseline", "main")]
    lr = main_lr(runs)
    groups = {}
    for r in runs:
        if r["lr"] == lr:
            groups.setdefault(r["config"], []).append(r)
    shipped = {}
    for config, rs in sorted(groups.items()):
        if len(rs) < seeds:
            print(f"{config}: {len(rs)}/{seeds} seeds finished, not shipped yet")
            continue
        run = median_seed(rs)
        dst = os.path.join(out, f"study-{config}")
        if _already_shipped(dst, run):
            print(f"{config}: {run['name']} is shipped in {dst} already (kept as it is)")
            shipped[config] = run["name"]
            continue
        src = os.path.join(study, "runs", run["name"])
        model = os.path.join(src, "averaged.pt")
        again, note = None, ""  # the run trained again here, and the README's paragraph on it
        if not os.path.exists(model):
            if retrain is None:
                raise SystemExit(f"{run['name']}: {model} is missing (the run finished on another machine or in "
                                 f"a sitting whose {study} was not kept); --retrain trains it again here")
            again = retrain(run)
            differs = compare(run, again)
            note = _retrained_note(run, again, differs)
            print(f"{run['name']}: trained again; " + ("identical to the committed run" if not differs else
                                                        f"differs from the committed run in {', '.join(differs)}"))
        tmp = dst + ".tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        digests = {"checkpoint.pt": export(model, os.path.join(tmp, "checkpoint.pt"), fp16=True)[2]}
        for name in ("spm.model", "dict.en.txt", "dict.de.txt"):
            shutil.copy(os.path.join(src, name), tmp)
            digests[name] = sha256_file(os.path.join(tmp, name))
        with open(os.path.join(tmp, "train.log"), "w", encoding="utf-8") as f:
            f.write(_log_lines(os.path.join(src, "train.log")))
        with open(os.path.join(tmp, "score.json"), "w") as f:
            json.dump(again or run, f, indent=1)
        with open(os.path.join(tmp, "SHA256SUMS"), "w") as f:  # (export() returns the checkpoint's digest)
            f.writelines(f"{digest}  {name}\n" for name, digest in digests.items())
        bleus = ", ".join(f"seed {r['seed']} {r['bleu']:.2f}" for r in sorted(rs, key=lambda r: r["seed"]))
        with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:
            f.write(
                f"# {config} ({run['what']}), EN->DE, the reproduction study's median seed\n\n"
                f"Run `{run['name']}` of the reproduction study (docs/results/README.md): {run['parameters'] / 1e6:.2f}M "
                f"parameters, lr {run['lr']}, {run['epochs']} epochs ({run['updates']:,} updates, stopped by "
                f"{run['stopped_by']}), the average of its last {run['averaged_checkpoints']} epoch checkpoints. "
                f"Test BLEU of its seeds: {bleus} (mean {statistics.mean(r['bleu'] for r in rs):.2f}); this is "
                f"the median one: BLEU {run['bleu']:.2f}, chrF {run['chrf']:.2f}.\n\n"
                + note +
                "| file | what |\n|---|---|\n"
                "| checkpoint.pt | fp16 weights (loaded into fp32), no optimizer state (`python -m "
                "fairseq_ext.tools.export_checkpoint --fp16` of the run's averaged.pt) |\n"
                "| spm.model, dict.en.txt, dict.de.txt | the study's joint SentencePiece model and dictionary |\n"
                "| train.log | the fairseq-train commands and per-epoch train/valid lines |\n"
                "| score.json | the run's result file (settings, curve, scores, sacrebleu signatures) |\n"
                "| SHA256SUMS | checked by examples/evaluate.sh before use |\n\n"
                f"Model flags: `{run['flags']}`. Translate and score: `examples/evaluate.sh {_shown(dst)} data/en-de "
                "OUT` (`--user-dir fairseq_ext`).\n")
        shutil.rmtree(dst, ignore_errors=True)
        os.replace(tmp, dst)
        shipped[config] = run["name"]
        print(f"{config}: shipped {run['name']} (BLEU {run['bleu']:.2f}; seeds: {bleus}) to {dst}")
    return shipped
