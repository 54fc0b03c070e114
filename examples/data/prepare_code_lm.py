"""Split the Python code corpus by file, learn a SentencePiece model on the training files and tokenize
the three splits for `fairseq-preprocess --only-source` (examples/sas/prepare-code.sh does both).

    python examples/data/prepare_code_lm.py CORPUS.txt.gz OUT_DIR [--vocab 8000] [--max-files N]

Splits: every 50th file (in path order) is validation, the next one test, the rest training (~2% each),
so no file is split across sets. SentencePiece unigram with the identity normalisation and kept
whitespace (indentation is part of Python). Writes OUT_DIR/spm.model and OUT_DIR/tok/{train,valid,test}.
"""
import argparse
import gzip
import os

import sentencepiece as spm


def read_files(path):
    """[(name, [lines])] from the `# <file> NAME` corpus format (examples/data/extract_stdlib.py)."""
    files, name, lines = [], None, []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.startswith("# <file> "):
                if name is not None:
                    files.append((name, lines))
                name, lines = line[len("# <file> "):].strip(), []
            elif name is not None:
                lines.append(line.rstrip("\n"))
    if name is not None:
        files.append((name, lines))
    return files


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("corpus")
    p.add_argument("out")
    p.add_argument("--vocab", type=int, default=8000)
    p.add_argument("--max-files", type=int, default=0, help="use only the first N files (smoke runs)")
    a = p.parse_args(argv)
    files = read_files(a.corpus)
    if a.max_files:
        files = files[: a.max_files]
    splits = {"train": [], "valid": [], "test": []}
    for i, (_, lines) in enumerate(files):
        split = "valid" if i % 50 == 0 else "test" if i % 50 == 1 else "train"
        splits[split].extend(l for l in lines if l.strip())  # blank lines carry nothing to predict
    os.makedirs(os.path.join(a.out, "tok"), exist_ok=True)
    raw = os.path.join(a.out, "train.raw.txt")
    with open(raw, "w", encoding="utf-8") as f:
        f.write("\n".join(splits["train"]) + "\n")
    prefix = os.path.join(a.out, "spm")
    spm.SentencePieceTrainer.train(
        input=raw, model_prefix=prefix, vocab_size=a.vocab, model_type="unigram", character_coverage=1.0,
        normalization_rule_name="identity", remove_extra_whitespaces=False, allow_whitespace_only_pieces=True,
        split_by_whitespace=False, input_sentence_size=300000, shuffle_input_sentence=True,
        byte_fallback=True, minloglevel=2, num_threads=os.cpu_count() or 1)
    os.remove(raw)
    sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
    for split, lines in splits.items():
        with open(os.path.join(a.out, "tok", split), "w", encoding="utf-8") as f:
            for piece_line in sp.encode(lines, out_type=str):
                f.write(" ".join(piece_line) + "\n")
        print(f"{split}: {len(lines)} lines")


if __name__ == "__main__":
    main()
