"""Score a fairseq-generate log: BLEU and chrF (sacrebleu, with signatures) and decoding speed.

    fairseq-generate ... --post-process sentencepiece > gen.out
    python -m fairseq_ext.tools.score gen.out [--copy-baseline] [--json out.json]

Reads the detokenized hypotheses (D- lines), references (T-) and sources (S-) in id order, so the
scores are sacrebleu's own on plain text (the same numbers `sacrebleu REF < HYP` prints), and the
speed line fairseq-generate writes ("Translated N sentences (T tokens) in Xs ..."). --copy-baseline
also scores the source sentences as if they were translations: the trivial reference point.
"""
import argparse
import json
import re


def parse_generate_output(text):
    src, ref, hyp = {}, {}, {}
    for line in text.splitlines():
        m = re.match(r"^([STD])-(\d+)\t(.*)$", line)
        if m is None:
            continue
        kind, idx, rest = m.group(1), int(m.group(2)), m.group(3)
        if kind == "D":
            rest = rest.split("\t", 1)[1] if "\t" in rest else ""  # D-id<TAB>score<TAB>text
        {"S": src, "T": ref, "D": hyp}[kind][idx] = rest
    speed = None
    m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s, "
                  r"([\d.]+) tokens/s\)", text)
    if m:
        speed = {"sentences": int(m.group(1).replace(",", "")), "tokens": int(m.group(2).replace(",", "")),
                 "seconds": float(m.group(3)), "sentences_per_s": float(m.group(4)),
                 "tokens_per_s": float(m.group(5))}
    return src, ref, hyp, speed


def score(hyps, refs):
    import sacrebleu

    bleu, chrf = sacrebleu.metrics.BLEU(), sacrebleu.metrics.CHRF()
    b, c = bleu.corpus_score(hyps, [refs]), chrf.corpus_score(hyps, [refs])
    return {"bleu": round(b.score, 2), "chrf": round(c.score, 2), "bleu_detail": str(b),
            "bleu_signature": str(bleu.get_signature()), "chrf_signature": str(chrf.get_signature())}


def score_file(path, copy_baseline=False):
    with open(path, encoding="utf-8") as f:
        src, ref, hyp, speed = parse_generate_output(f.read())
    if not hyp:
        raise SystemExit(f"{path}: no D- lines (is it fairseq-generate output?)")
    missing = sorted(set(ref) - set(hyp))
    if missing:
        raise SystemExit(f"{path}: {len(missing)} references have no hypothesis (ids {missing[:10]}...)")
    ids = sorted(hyp)
    result = {"sentences": len(ids), **score([hyp[i] for i in ids], [ref[i] for i in ids]), "speed": speed}
    if copy_baseline:
        result["copy_baseline"] = score([src[i] for i in ids], [ref[i] for i in ids])
    return result


def last_validation(log_path):
    """loss / nll_loss (base 2) / ppl / num_updates of the last validation of a fairseq-train log, or None."""
    from .train_log import parse_train_log

    valid = parse_train_log(log_path)["valid"]
    return valid[-1] if valid else None


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("generate_output")
    p.add_argument("--copy-baseline", action="store_true", help="also score source-copied-as-translation")
    p.add_argument("--checkpoint", help="also report this checkpoint's parameter count")
    p.add_argument("--train-log", help="also report the last validation line of this fairseq-train log")
    p.add_argument("--json", help="write the result here too")
    args = p.parse_args(argv)
    r = score_file(args.generate_output, args.copy_baseline)
    if args.train_log:
        r["valid"] = last_validation(args.train_log)
    if args.checkpoint:
        from ..compat import load_checkpoint
        from .export_checkpoint import count_parameters

        r["parameters"] = count_parameters(load_checkpoint(args.checkpoint)["model"])
    params = f"  ({r['parameters'] / 1e6:.2f}M parameters)" if "parameters" in r else ""
    print(f"{r['sentences']} sentences: BLEU {r['bleu']:.2f}  chrF {r['chrf']:.2f}{params}")
    print(f"  {r['bleu_detail']}")
    print(f"  BLEU signature: {r['bleu_signature']}")
    print(f"  chrF signature: {r['chrf_signature']}")
    if r["speed"]:
        s = r["speed"]
        print(f"  decoding: {s['sentences_per_s']:.1f} sentences/s, {s['tokens_per_s']:.1f} tokens/s "
              f"({s['sentences']} sentences in {s['seconds']:.1f} s, fairseq-generate's timer)")
    if r.get("valid"):
        v = r["valid"]
        print(f"  last validation: loss {v.get('loss')}  ppl {v.get('ppl')}  at {v.get('num_updates')} updates")
    if "copy_baseline" in r:
        c = r["copy_baseline"]
        print(f"  copy baseline (source as output): BLEU {c['bleu']:.2f}  chrF {c['chrf']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(r, f, indent=1)
    return r


if __name__ == "__main__":
    main()
