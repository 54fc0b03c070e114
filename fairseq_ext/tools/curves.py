"""Validation-loss curves of several fairseq-train runs, per update and per second of training.

    python -m fairseq_ext.tools.curves NAME=train.log ... --out OUT_PREFIX [--title TEXT]

Reads fairseq's simple log format: each "valid on 'valid' subset" line gives (num_updates, loss), the
training seconds at that point are the summed `train_wall` of the train_inner lines up to those updates
(validation time excluded), tokens/s is the median `wps` of the train_inner lines, parameters come from
"num. shared model params". Writes OUT_PREFIX.png (two panels), OUT_PREFIX.json and OUT_PREFIX.md
(one row per run: parameters, final valid loss, training tokens/s and its ratio to the first run).
Loss is fairseq's: base 2 (bits per token).
"""
import argparse
import json
import statistics

from .train_log import parse_train_log


def parse_log(path, max_updates=None):
    log = parse_train_log(path)
    points = []
    for v in log["valid"]:
        if max_updates is not None and v["num_updates"] > max_updates:
            break
        seconds = sum(t.get("train_wall", 0.0) for t in log["train"] if t["num_updates"] <= v["num_updates"])
        points.append({"updates": int(v["num_updates"]), "seconds": seconds, "loss": v["loss"]})
    wps = [t["wps"] for t in log["train"] if "wps" in t]
    return {"params": log["params"], "points": points, "tokens_per_s": statistics.median(wps) if wps else None}


def table(runs):
    rows = ["| model | parameters | final valid loss (bits) | at updates | training tokens/s | speed vs first |",
            "|---|---|---|---|---|---|"]
    first = None
    for name, r in runs.items():
        last = r["points"][-1] if r["points"] else None
        tps = r["tokens_per_s"]
        first = first if first is not None else tps
        rows.append(f"| {name} | {r['params'] / 1e6:.2f}M | {last['loss']:.3f} | {last['updates']} | "
                    f"{tps:.0f} | {tps / first:.2f} |" if last and tps and r["params"] else f"| {name} | - | - | - | - | - |")
    return "\n".join(rows)


def differences(runs):
    """Valid loss of every run relative to the first one's at the validations they share (updates)."""
    names = list(runs)
    if len(names) < 2:
        return ""
    first = {p["updates"]: p["loss"] for p in runs[names[0]]["points"]}
    rows = ["", "", f"| updates | {names[0]} | " + " | ".join(f"{n} (vs {names[0]})" for n in names[1:]) + " |",
            "|---|---|" + "---|" * (len(names) - 1)]
    for u in sorted(first):
        others = [{p["updates"]: p["loss"] for p in runs[n]["points"]}.get(u) for n in names[1:]]
        rows.append(f"| {u} | {first[u]:.3f} | " + " | ".join(
            "-" if o is None else f"{o:.3f} ({100 * (o - first[u]) / first[u]:+.2f}%)" for o in others) + " |")
    return "\n".join(rows)


def plot(runs, path, title=None):
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq sets the root logger to DEBUG
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, r in runs.items():
        pts = r["points"]
        axes[0].plot([p["updates"] for p in pts], [p["loss"] for p in pts], marker=".", label=name)
        axes[1].plot([p["seconds"] for p in pts], [p["loss"] for p in pts], marker=".", label=name)
    axes[0].set_xlabel("updates")
    axes[1].set_xlabel("training seconds")
    for ax in axes:
        ax.set_ylabel("valid loss (bits / token)")
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="NAME=LOG")
    p.add_argument("--out", required=True, help="output prefix (.png, .json, .md)")
    p.add_argument("--title")
    p.add_argument("--max-updates", type=int, help="only the validations up to this many updates")
    a = p.parse_args(argv)
    runs = {}
    for spec in a.runs:
        if "=" not in spec:
            p.error(f"{spec}: expected NAME=path/to/train.log")
        name, path = spec.split("=", 1)
        runs[name] = parse_log(path, a.max_updates)
        if not runs[name]["points"]:
            p.error(f"{path}: no validation lines (train longer than --validate-interval-updates)")
    md = (a.title + "\n\n" if a.title else "") + table(runs) + differences(runs)
    with open(a.out + ".md", "w") as f:
        f.write(md + "\n")
    with open(a.out + ".json", "w") as f:
        json.dump(runs, f, indent=1)
    plot(runs, a.out + ".png", a.title)
    print(md)
    return runs


if __name__ == "__main__":
    main()
