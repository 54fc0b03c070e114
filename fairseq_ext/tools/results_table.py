"""One markdown table from several evaluations (score.json files of `fairseq_ext.tools.score --json`).

    python -m fairseq_ext.tools.results_table baseline=runs/a/score.json one_wide_ffn=runs/b/score.json \\
        [--copy-baseline] [--title TEXT]

Columns: model, parameters, valid perplexity (when score.json has it: score --train-log), BLEU, chrF (sacrebleu), decoding sentences/s and tokens/s (fairseq-generate's
own timer over the whole test set). --copy-baseline adds the source-copied-as-output row.
"""
import argparse
import json


def table(entries, copy_baseline=False):
    results = []
    for name, path in entries:
        with open(path) as f:
            results.append((name, json.load(f)))
    ppl = any(r.get("valid") for _, r in results)  # a column when the runs' train logs were given
    rows = ["| model | parameters |" + (" valid ppl |" if ppl else "") + " BLEU | chrF | sentences/s | tokens/s |",
            "|---|---|" + ("---|" if ppl else "") + "---|---|---|---|"]
    first = results[0][1] if results else None
    for name, r in results:
        params = f"{r['parameters'] / 1e6:.2f}M" if r.get("parameters") else "-"
        s = r.get("speed") or {}
        v = f" {r['valid']['ppl']:.2f} |" if r.get("valid") and "ppl" in r["valid"] else (" - |" if ppl else "")
        rows.append(f"| {name} | {params} |{v} {r['bleu']:.2f} | {r['chrf']:.2f} | "
                    f"{s.get('sentences_per_s', float('nan')):.1f} | {s.get('tokens_per_s', float('nan')):.1f} |")
    if copy_baseline and first and "copy_baseline" in first:
        c = first["copy_baseline"]
        rows.append(f"| copy source (trivial) | - |" + (" - |" if ppl else "") +
                    f" {c['bleu']:.2f} | {c['chrf']:.2f} | - | - |")
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
