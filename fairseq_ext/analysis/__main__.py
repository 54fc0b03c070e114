"""Representational similarity of fairseq models (One Wide FFN §2.3, §4.4).

  python -m fairseq_ext.analysis compare DATA_BIN --a A.pt --b B.pt [--benchmark-a X.pt --benchmark-b Y.pt]
  python -m fairseq_ext.analysis self DATA_BIN --a A.pt
      [--split valid] [--max-sentences N] [--lns-k K] [--out DIR]

compare: linear CKA and LNS between corresponding modules (`i.sa`, `i.ca`, `i.ffn`, `i.out`) of two
models, plus the full module-by-module CKA matrices (heatmaps, diagonal = corresponding layers).
Modules that one model lacks (a dropped FFN) are compared through the layer outputs `i.out`, as the
paper does for NoDec. With a benchmark pair (e.g. the baseline and the same architecture trained with
another seed) every score is also given normalised by the benchmark pair's score for that module.
self: CKA between every pair of one model's modules (the paper's self-similarity heatmaps).
Writes OUT/similarity.json and OUT/*_{encoder,decoder}.png; prints a table.
"""
import argparse
import logging
import json
import os

from .activations import collect, load_model, module_sort_key
from .similarity import linear_cka, local_neighborhood_similarity

# fairseq puts the root logger at DEBUG: keep matplotlib's import-time chatter out
logging.getLogger("matplotlib").setLevel(logging.WARNING)


def features(checkpoint, args):
    model, task = load_model(checkpoint, args.data)
    return collect(model, task, args.split, max_sentences=args.max_sentences)


def corresponding_scores(fa, fb, k):
    common = sorted(set(fa) & set(fb), key=module_sort_key)
    return {name: {"cka": linear_cka(fa[name], fb[name]),
                   "lns": local_neighborhood_similarity(fa[name], fb[name], k)} for name in common}


def cka_matrix(fa, fb, side):
    rows = sorted((n for n in fa if n.startswith(side)), key=module_sort_key)
    cols = sorted((n for n in fb if n.startswith(side)), key=module_sort_key)
    return rows, cols, [[linear_cka(fa[r], fb[c]) for c in cols] for r in rows]


def heatmap(rows, cols, values, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    label = lambda n: n.split(".", 1)[1]  # "enc.4.ca" -> "4.ca"
    size = max(4, 0.35 * max(len(rows), len(cols)) + 2)
    fig, ax = plt.subplots(figsize=(size, size))
    im = ax.imshow(values, vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(cols)), [label(c) for c in cols], rotation=90, fontsize=7)
    ax.set_yticks(range(len(rows)), [label(r) for r in rows], fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m fairseq_ext.analysis", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["compare", "self"])
    p.add_argument("data", help="fairseq-preprocess folder (dictionaries and the split to analyse)")
    p.add_argument("--a", required=True, help="checkpoint of model A")
    p.add_argument("--b", help="checkpoint of model B (compare)")
    p.add_argument("--benchmark-a", help="benchmark pair, first model (e.g. the baseline)")
    p.add_argument("--benchmark-b", help="benchmark pair, second model (e.g. the baseline, another seed)")
    p.add_argument("--split", default="valid")
    p.add_argument("--max-sentences", type=int)
    p.add_argument("--lns-k", type=int, help="neighbours for LNS (default: 5%% of the sentences)")
    p.add_argument("--out", default="runs/similarity")
    args = p.parse_args(argv)
    if args.mode == "compare" and not args.b:
        p.error("compare needs --b")
    if bool(args.benchmark_a) != bool(args.benchmark_b):
        p.error("give both --benchmark-a and --benchmark-b, or neither")
    os.makedirs(args.out, exist_ok=True)
    fa = features(args.a, args)
    result = {"a": args.a, "split": args.split, "sentences": len(next(iter(fa.values())))}
    if args.mode == "self":
        for side, name in (("enc", "encoder"), ("dec", "decoder")):
            rows, cols, m = cka_matrix(fa, fa, side)
            result[f"self_cka_{name}"] = {"modules": rows, "matrix": m}
            heatmap(rows, cols, m, f"CKA self-similarity, {name}: {os.path.basename(args.a)}",
                    os.path.join(args.out, f"self_cka_{name}.png"))
    else:
        fb = features(args.b, args)
        result["b"] = args.b
        scores = corresponding_scores(fa, fb, args.lns_k)
        if args.benchmark_a:
            bench = corresponding_scores(features(args.benchmark_a, args), features(args.benchmark_b, args), args.lns_k)
            for name, s in scores.items():
                if name in bench:
                    s["cka_normalised"] = s["cka"] / bench[name]["cka"]
                    s["lns_normalised"] = s["lns"] / bench[name]["lns"]
        result["corresponding"] = scores
        for side, name in (("enc", "encoder"), ("dec", "decoder")):
            rows, cols, m = cka_matrix(fa, fb, side)
            result[f"cka_{name}"] = {"rows": rows, "cols": cols, "matrix": m}
            heatmap(rows, cols, m, f"CKA {os.path.basename(args.a)} (rows) vs {os.path.basename(args.b)}",
                    os.path.join(args.out, f"cka_{name}.png"))
        print(f"{'module':<12} {'CKA':>7} {'LNS':>7}" + ("  CKA/bench LNS/bench" if args.benchmark_a else ""))
        for name, s in scores.items():
            extra = (f"  {s['cka_normalised']:9.3f} {s['lns_normalised']:9.3f}" if "cka_normalised" in s else "")
            print(f"{name:<12} {s['cka']:7.3f} {s['lns']:7.3f}{extra}")
    with open(os.path.join(args.out, "similarity.json"), "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}/similarity.json and heatmaps ({result['sentences']} sentences)")
    return result


if __name__ == "__main__":
    main()
