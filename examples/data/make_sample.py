#!/usr/bin/env python3
"""Draw the committed EN-DE sample from the full corpus (see data/en-de-sample/README.md).

The sample is what `make demo` and the integration tests train on when no network and no full corpus
are at hand. It keeps the corpus' sources, over-weights the general-domain Ding example sentences (the
test set's domain), and copies valid/test whole. Deterministic for a given seed.

    python examples/data/make_sample.py --corpus data/en-de --out data/en-de-sample
"""
import argparse
import os
import random

from corpus_io import read_gz, write_gz


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="folder with train/valid/test.{en,de}.gz and train.origin.gz")
    p.add_argument("--out", required=True)
    p.add_argument("--pairs", type=int, default=25000, help="training pairs in the sample")
    p.add_argument("--ding-share", type=float, default=0.4,
                   help="fraction of the sample taken from ding_sent (general domain, like the test set)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    en = read_gz(os.path.join(args.corpus, "train.en.gz"))
    de = read_gz(os.path.join(args.corpus, "train.de.gz"))
    origin = read_gz(os.path.join(args.corpus, "train.origin.gz"))
    if not (len(en) == len(de) == len(origin)):
        raise SystemExit(f"misaligned corpus: {len(en)} en, {len(de)} de, {len(origin)} origin lines")
    rng = random.Random(args.seed)
    ding = [i for i, o in enumerate(origin) if o == "ding_sent"]
    other = [i for i, o in enumerate(origin) if o != "ding_sent"]
    n_ding = min(len(ding), int(round(args.pairs * args.ding_share)))
    chosen = sorted(rng.sample(ding, n_ding) + rng.sample(other, args.pairs - n_ding))

    os.makedirs(args.out, exist_ok=True)
    write_gz(os.path.join(args.out, "train.en.gz"), [en[i] for i in chosen])
    write_gz(os.path.join(args.out, "train.de.gz"), [de[i] for i in chosen])
    write_gz(os.path.join(args.out, "train.origin.gz"), [origin[i] for i in chosen])
    for split in ("valid", "test"):
        for lang in ("en", "de"):
            write_gz(os.path.join(args.out, f"{split}.{lang}.gz"),
                        read_gz(os.path.join(args.corpus, f"{split}.{lang}.gz")))
    counts = {}
    for i in chosen:
        counts[origin[i]] = counts.get(origin[i], 0) + 1
    print("sample:", len(chosen), "pairs;", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main()
