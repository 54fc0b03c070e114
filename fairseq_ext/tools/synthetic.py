"""The synthetic generalisation tasks of Terraformer (Jaszczur et al. 2021, §4.3, Table 4): copy a decimal
number, and long addition; train on inputs of at most 128 digits, test on 256-300 digits.

    python -m fairseq_ext.tools.synthetic make --task copy|addition --out DIR [--train 100000]
        [--valid 1000] [--test 1000] [--max-train-digits 128] [--test-digits 256-300] [--seed 1]
    python -m fairseq_ext.tools.synthetic score GENERATE_OUT [--json FILE]
    python -m fairseq_ext.tools.synthetic errors GENERATE_OUT [--json FILE]
    python -m fairseq_ext.tools.synthetic places GENERATE_OUT [--trained 128] [--window 12] [--bins 3] [--json FILE]
    python -m fairseq_ext.tools.synthetic flags terraformer|transformer|terraformer_nopos|terraformer_offset

`flags` prints the model flags of the two models compared (one per line), the ones
examples/terraformer/synthetic.sh and the reproduction study (fairseq_ext/tools/study.py) train.

`make` writes DIR/{train,valid,test}.{src,tgt}: one example per line, one token per digit separated by
spaces, ready for `fairseq-preprocess --joined-dictionary` (a 12-token vocabulary). The length of an
example is the digits of its input: train and valid take it uniform in 1..max-train-digits, test in the
test range (over 2x longer: the out-of-distribution part), as in the paper's "inputs with at most 128
digits ... input lengths from 256 to 300". Copy: a number of that many digits, answered by itself.
Addition: two numbers with that many digits together (the first operand's length uniform in 1..length-1,
at least 2 digits in all), every number written least significant digit first as in the official code
(trax's addition_input_stream: lower-endian operands and sum; it draws lengths otherwise, see
docs/terraformer/README.md): 21 + 43 = 64 is "1 2 + 3 4" -> "4 6".
`score` reads fairseq-generate's output (T- and H- lines) and reports exact-sequence accuracy and
per-token accuracy (position-wise over the reference; a missing or extra position counts as wrong), the
two figures of the paper's Table 4. `errors` tells how the wrong answers are wrong, which position-wise
token accuracy cannot: one token left out or repeated makes every later position wrong, a wrong digit only
its own. It reports the edit-distance token accuracy (1 − Levenshtein distance / reference tokens, each
answer's distance capped at its reference's length), the median correct prefix of the wrong answers (the
position of their first error) and how many answers are exact, of the right length with wrong digits, too
long, or too short. `places` tells where and how the wrong answers lose their place: how many go wrong
before position --trained (inside the trained lengths), how many continue after their first error with a
stretch of --window reference tokens taken from another position of the reference (a jump), whether the
nearest such position is earlier (the answer repeats) or later (it skips ahead) and the median distance of
each, and the exact answers in --bins equal bands of reference length.
"""
import argparse
import json
import os
import random
import statistics
import sys

# Both models at the same dims: 2 + 2 layers, d 256, 4 heads, FFN 1,024, pre-norm, sinusoidal positions.
DIMS = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "256", "--decoder-embed-dim", "256",
        "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4", "--share-all-embeddings"]
# terraformer: terraformer_base's parts (sparse FFN N = 64, sparse QKV S = 8, SRU width 32, reversible,
# concatenated decoder with two attention layers per block); transformer: fairseq's pre-norm Transformer,
# the paper's baseline
# terraformer_nopos: the Terraformer without positional embeddings, order from its recurrence and causal
# attention alone (the study's diagnosis of its copy result: sinusoidal positions past the trained 128 are
# unseen in training); terraformer_offset: the Terraformer whose training positions start at a random offset
# below 300 in 5% of the batches, so that positions past the trained lengths occur in training (trax's
# addition configuration for its Terraformer: pos_max_offset_to_add 300, pos_start_from_zero_prob 0.95)
MAX_TRAIN_DIGITS = 128  # the paper's longest trained length: make's default and places' "inside the trained lengths"
MODELS = {"terraformer": ["--arch", "terraformer_base"],
          "transformer": ["--arch", "transformer", "--encoder-normalize-before", "--decoder-normalize-before"],
          "terraformer_nopos": ["--arch", "terraformer_base", "--no-token-positional-embeddings"],
          "terraformer_offset": ["--arch", "terraformer_base", "--position-offset-max", "300",
                                 "--position-offset-prob", "0.05"]}


def model_flags(model, dims=None):
    """fairseq-train flags of `model` (a key of MODELS) at `dims` (default DIMS)."""
    if model not in MODELS:
        raise ValueError(f"model {model!r}: choose {' or '.join(MODELS)}")
    return MODELS[model] + list(DIMS if dims is None else dims)


# the version of make's examples per task: a change of what make writes for the same flags raises it, so
# that the study makes its data again, moves aside a run trained on the old examples and counts a result of
# theirs as not run (fairseq_ext/tools/study.py); tests/test_synthetic.py pins what each version writes
DATA_FORMAT = {"copy": 1, "addition": 2}  # addition 2: least significant digit first, length over both operands


def current_format(run):
    """Whether a synthetic run file's examples are of the current DATA_FORMAT (a file without the field: 1)."""
    return run.get("data_format", 1) == DATA_FORMAT[run["task"]]


def number(rng: random.Random, digits: int) -> str:
    """A decimal number with exactly `digits` digits (no leading zero unless it is 0)."""
    if digits == 1:
        return str(rng.randrange(10))
    return str(rng.randrange(1, 10)) + "".join(str(rng.randrange(10)) for _ in range(digits - 1))


def example(task: str, rng: random.Random, low: int, high: int):
    """(source, target) strings of one example whose input has a number of digits uniform in [low, high]
    (addition: the two operands together, at least 2); addition writes every number least significant
    digit first."""
    if task == "copy":
        s = number(rng, rng.randint(low, high))
        return " ".join(s), " ".join(s)
    if task == "addition":
        digits = rng.randint(max(low, 2), high)
        first = rng.randint(1, digits - 1)
        a, b = number(rng, first), number(rng, digits - first)
        return " ".join(a[::-1]) + " + " + " ".join(b[::-1]), " ".join(str(int(a) + int(b))[::-1])
    raise ValueError(f"--task {task!r}: choose copy or addition")


def parse_range(text: str):
    low, _, high = text.partition("-")
    low, high = int(low), int(high or low)
    if not 1 <= low <= high:
        raise ValueError(f"digit range {text!r}: expected LOW-HIGH with 1 <= LOW <= HIGH")
    return low, high


def make(task, out, n_train, n_valid, n_test, max_train_digits, test_digits, seed):
    least = 2 if task == "addition" else 1  # addition: a digit per operand at least
    if max_train_digits < least:
        raise ValueError(f"--max-train-digits {max_train_digits}: must be >= {least} for --task {task}")
    test_low, test_high = parse_range(test_digits)
    if test_low < least:
        raise ValueError(f"--test-digits {test_digits}: the inputs of --task {task} have at least {least} digits")
    rng = random.Random(seed)
    os.makedirs(out, exist_ok=True)
    splits = {"train": (n_train, 1, max_train_digits), "valid": (n_valid, 1, max_train_digits),
              "test": (n_test, test_low, test_high)}
    for split, (n, low, high) in splits.items():
        with open(os.path.join(out, f"{split}.src"), "w") as fs, open(os.path.join(out, f"{split}.tgt"), "w") as ft:
            for _ in range(n):
                s, t = example(task, rng, low, high)
                fs.write(s + "\n")
                ft.write(t + "\n")
    return {split: n for split, (n, _, _) in splits.items()}


def read_generate(path):
    """{sample id: (reference tokens, hypothesis tokens)} from fairseq-generate's output."""
    refs, hyps = {}, {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            tag, _, rest = line.rstrip("\n").partition("\t")
            if tag.startswith("T-"):
                refs[int(tag[2:])] = rest.split()
            elif tag.startswith("H-"):
                hyps[int(tag[2:])] = rest.partition("\t")[2].split()  # H-id <score> <tokens>
    missing = sorted(set(refs) - set(hyps))
    if missing:
        raise ValueError(f"{path}: {len(missing)} references without a hypothesis (e.g. sample {missing[0]})")
    return {i: (refs[i], hyps[i]) for i in refs}


def score(pairs):
    """Exact-sequence accuracy and per-token accuracy (Table 4's two figures), in percent."""
    if not pairs:
        raise ValueError("no examples to score")
    exact = sum(ref == hyp for ref, hyp in pairs.values())
    correct = sum(sum(r == h for r, h in zip(ref, hyp)) for ref, hyp in pairs.values())
    positions = sum(max(len(ref), len(hyp)) for ref, hyp in pairs.values())
    return {"examples": len(pairs), "sequence_accuracy": 100.0 * exact / len(pairs),
            "token_accuracy": 100.0 * correct / positions}


def edit_distance(a, b):
    """Levenshtein distance between token lists a and b (insertions, deletions, substitutions; O(len a × len b))."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def errors(pairs):
    """How the answers are wrong: {examples, edit_token_accuracy (%), exact, wrong_digits (right length),
    too_long, too_short (counts), median_correct_prefix (tokens before the first error, over the wrong answers;
    None when none is wrong)}."""
    if not pairs:
        raise ValueError("no examples to analyse")
    kinds = {"exact": 0, "wrong_digits": 0, "too_long": 0, "too_short": 0}
    distance = reference = 0
    prefixes = []
    for ref, hyp in pairs.values():
        distance += min(edit_distance(ref, hyp), len(ref))
        reference += len(ref)
        if ref == hyp:
            kinds["exact"] += 1
            continue
        kinds["wrong_digits" if len(hyp) == len(ref) else "too_long" if len(hyp) > len(ref) else "too_short"] += 1
        prefixes.append(first_error(ref, hyp))
    return {"examples": len(pairs), "edit_token_accuracy": 100.0 * (1 - distance / reference) if reference else 100.0,
            **kinds, "median_correct_prefix": statistics.median(prefixes) if prefixes else None}


def first_error(ref, hyp):
    """Position of the first token where hyp differs from ref (the shorter length when one is a prefix)."""
    return next((k for k, (r, h) in enumerate(zip(ref, hyp)) if r != h), min(len(ref), len(hyp)))


def places(pairs, trained=MAX_TRAIN_DIGITS, window=12, bins=3):
    """Where and how the wrong answers lose their place: {wrong, first_error_within_trained (first error
    before position `trained`), jumps: {answers, earlier, later, median_distance_earlier,
    median_distance_later} (the `window` tokens after the first error are the reference's tokens at another
    position; the nearest one, ties to the earlier, tells the direction and distance), exact_by_length:
    [{lengths, exact, examples}] over `bins` equal bands of reference length}."""
    if not pairs:
        raise ValueError("no examples to analyse")
    if trained < 1 or window < 1 or bins < 1:
        raise ValueError(f"--trained, --window and --bins must be positive (got {trained}, {window}, {bins})")
    wrong = within = 0
    distances = {"earlier": [], "later": []}
    for ref, hyp in pairs.values():
        if ref == hyp:
            continue
        wrong += 1
        k = first_error(ref, hyp)
        within += k < trained
        after = hyp[k:k + window]
        if len(after) < window:
            continue
        found = [i for i in range(len(ref) - window + 1) if i != k and ref[i:i + window] == after]
        if found:
            i = min(found, key=lambda i: (abs(i - k), i))
            distances["earlier" if i < k else "later"].append(abs(i - k))
    lengths = [len(ref) for ref, _ in pairs.values()]
    low, high = min(lengths), max(lengths)
    width = -(-(high - low + 1) // bins)
    bands = []
    for b in range(bins):
        a, z = low + b * width, min(high, low + (b + 1) * width - 1)
        if a > high:
            break
        band = [ref == hyp for ref, hyp in pairs.values() if a <= len(ref) <= z]
        bands.append({"lengths": f"{a}-{z}", "exact": sum(band), "examples": len(band)})
    return {"wrong": wrong, "first_error_within_trained": within,
            "jumps": {"answers": len(distances["earlier"]) + len(distances["later"]),
                      **{d: len(v) for d, v in distances.items()},
                      **{f"median_distance_{d}": statistics.median(v) if v else None for d, v in distances.items()}},
            "exact_by_length": bands}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write the task's train/valid/test files")
    m.add_argument("--task", required=True, choices=["copy", "addition"])
    m.add_argument("--out", required=True)
    m.add_argument("--train", type=int, default=100000)
    m.add_argument("--valid", type=int, default=1000)
    m.add_argument("--test", type=int, default=1000)
    m.add_argument("--max-train-digits", type=int, default=MAX_TRAIN_DIGITS)
    m.add_argument("--test-digits", default="256-300")
    m.add_argument("--seed", type=int, default=1)
    s = sub.add_parser("score", help="sequence and token accuracy of a fairseq-generate output")
    s.add_argument("generate_out")
    s.add_argument("--json")
    e = sub.add_parser("errors", help="how the wrong answers of a fairseq-generate output are wrong")
    e.add_argument("generate_out")
    e.add_argument("--json")
    w = sub.add_parser("places", help="where and how the wrong answers of a fairseq-generate output lose their place")
    w.add_argument("generate_out")
    w.add_argument("--trained", type=int, default=MAX_TRAIN_DIGITS, help="longest trained length (answers going wrong before it)")
    w.add_argument("--window", type=int, default=12, help="tokens after the first error that make a jump")
    w.add_argument("--bins", type=int, default=3, help="bands of reference length for the exact answers")
    w.add_argument("--json")
    f = sub.add_parser("flags", help="the fairseq-train model flags of a compared model, one per line")
    f.add_argument("model", choices=sorted(MODELS))
    a = p.parse_args(argv)
    try:
        if a.cmd == "flags":
            print("\n".join(model_flags(a.model)))
            return model_flags(a.model)
        if a.cmd == "make":
            counts = make(a.task, a.out, a.train, a.valid, a.test, a.max_train_digits, a.test_digits, a.seed)
            print(json.dumps(counts))
            return counts
        analyse = {"score": score, "errors": errors,
                   "places": lambda pairs: places(pairs, a.trained, a.window, a.bins)}[a.cmd]
        result = analyse(read_generate(a.generate_out))
    except ValueError as e:
        sys.exit(f"synthetic: {e}")
    print(json.dumps(result))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
