#!/usr/bin/env python3
"""Learn a joint subword model on a parallel corpus and apply it to every split.

    python examples/data/tokenize_corpus.py --corpus data/en-de-sample --out data-bin/en-de-sample \
        [--src en --tgt de] [--tokenizer spm|bpe] [--vocab 8000]

Reads {train,valid,test}.{SRC,TGT}.gz (the language pair of --src/--tgt, default en de), writes
OUT/tok/{split}.{lang} (one tokenized sentence per line) and the model: OUT/spm.model (SentencePiece,
joint unigram model, Python API: the PyPI wheel has no spm_train) or OUT/bpe.codes (subword-nmt joint
BPE with --vocab merges). Detokenize with fairseq-generate's `--post-process sentencepiece` or
`--post-process subword_nmt`.
With --apply MODEL (an spm.model or bpe.codes), applies that model instead of learning one, e.g. to
prepare a test set for a shipped checkpoint: --apply shipped/X/spm.model --splits test.
"""
import argparse
import io
import os
import random
import sys

from corpus_io import read_gz


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--src", default="en", help="source language suffix of the corpus files (default en)")
    p.add_argument("--tgt", default="de", help="target language suffix of the corpus files (default de)")
    p.add_argument("--tokenizer", choices=["spm", "bpe"], default="spm")
    p.add_argument("--vocab", type=int, default=8000,
                   help="SentencePiece vocabulary size, or number of BPE merges (default 8000)")
    p.add_argument("--max-train-sentences", type=int, default=2_000_000,
                   help="sentences (both sides) used to learn the model")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--apply", metavar="MODEL", help="apply this spm.model / bpe.codes instead of learning one")
    p.add_argument("--splits", default="train,valid,test", help="comma-separated splits to tokenize")
    args = p.parse_args()
    split_names = args.splits.split(",")
    if args.apply is None and "train" not in split_names:
        p.error("learning a model needs the train split (or give --apply MODEL)")

    splits = {}
    for split in split_names:
        for lang in (args.src, args.tgt):
            path = os.path.join(args.corpus, f"{split}.{lang}.gz")
            if not os.path.exists(path):
                sys.exit(f"missing {path}: the corpus folder must hold train/valid/test.{{{args.src},{args.tgt}}}.gz")
            splits[split, lang] = read_gz(path)
    tok_dir = os.path.join(args.out, "tok")
    os.makedirs(tok_dir, exist_ok=True)
    if args.apply is not None:
        args.tokenizer = "bpe" if args.apply.endswith(".codes") else "spm"
    else:
        learn = splits["train", args.src] + splits["train", args.tgt]
        random.Random(args.seed).shuffle(learn)
        learn = learn[: args.max_train_sentences]

    if args.tokenizer == "spm":
        import sentencepiece as spm

        model_file = args.apply
        if model_file is None:
            model_file = os.path.join(args.out, "spm.model")
            spm.SentencePieceTrainer.train(
                sentence_iterator=iter(learn), model_prefix=model_file[: -len(".model")],
                vocab_size=args.vocab, character_coverage=1.0, model_type="unigram",
                input_sentence_size=len(learn), shuffle_input_sentence=False,
                num_threads=os.cpu_count() or 1,
                # fairseq adds its own <s> </s> <pad> <unk>: keep SentencePiece's ids out of the pieces
                bos_id=-1, eos_id=-1, pad_id=-1, unk_id=0, minloglevel=2,
            )
        sp = spm.SentencePieceProcessor(model_file=model_file)
        encode = lambda lines: [" ".join(pieces) for pieces in sp.encode(lines, out_type=str)]
    else:
        from subword_nmt.apply_bpe import BPE
        from subword_nmt.learn_bpe import learn_bpe

        codes = args.apply
        if codes is None:
            codes = os.path.join(args.out, "bpe.codes")
            with open(codes, "w", encoding="utf-8") as f:
                learn_bpe(io.StringIO("\n".join(learn) + "\n"), f, args.vocab, min_frequency=2)
        with open(codes, encoding="utf-8") as f:
            bpe = BPE(f)
        encode = lambda lines: [bpe.process_line(line) for line in lines]

    for (split, lang), lines in splits.items():
        with open(os.path.join(tok_dir, f"{split}.{lang}"), "w", encoding="utf-8") as f:
            for line in encode(lines):
                f.write(line.strip() + "\n")
    how = args.apply or f"{args.tokenizer} {args.vocab}"
    print(f"tokenized {', '.join(split_names)} of {args.corpus} with {how} into {tok_dir}")


if __name__ == "__main__":
    main()
