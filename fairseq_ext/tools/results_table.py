"""One markdown table from several evaluations (score.json files of `fairseq_ext.tools.score --json`).

    python -m fairseq_ext.tools.results_table baseline=runs/a/score.json one_wide_ffn=runs/b/score.json \\
        [--copy-baseline] [--title TEXT]

Columns: model, parameters, BLEU, chrF (sacrebleu), decoding sentences/s and tokens/s (fairseq-generate's
own timer over the whole test set). --copy-baseline adds the source-copied-as-output row.
"""
import argparse
import json


def table(entries, copy_baseline=False):
    rows = ["| model | parameters | BLEU | chrF | sentences/s | tokens/s |", "|---|---|---|---|---|---|"]
    first = None
    for name, path in entries:
        with open(path) as f:
            r = json.load(f)
        first = first or r
        params = f"{r['parameters'] / 1e6:.2f}M" if r.get("parameters") else "-"
        s = r.get("speed") or {}
        rows.append(f"| {name} | {params} | {r['bleu']:.2f} | {r['chrf']:.2f} | "
                    f"{s.get('sentences_per_s', float('nan')):.1f} | {s.get('tokens_per_s', float('nan')):.1f} |")
    if copy_baseline and first and "copy_baseline" in first:
        c = first["copy_baseline"]
        rows.append(f"| copy source (trivial) | - | {c['bleu']:.2f} | {c['chrf']:.2f} | - | - |")
    if first:
        rows.append("")
        rows.append(f"{first['sentences']} test sentences; BLEU {first['bleu_signature']}; chrF {first['chrf_signature']}")
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("entries", nargs="+", metavar="NAME=SCORE_JSON")
    p.add_argument("--copy-baseline", action="store_true")
    p.add_argument("--title")
    a = p.parse_args(argv)
    entries = []
    for e in a.entries:
        if "=" not in e:
            p.error(f"{e}: expected NAME=path/to/score.json")
        entries.append(tuple(e.split("=", 1)))
    if a.title:
        print(a.title + "\n")
    print(table(entries, a.copy_baseline))


if __name__ == "__main__":
    main()
