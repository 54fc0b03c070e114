"""Terraformer's synthetic tasks (fairseq_ext/tools/synthetic.py): data and scoring."""
import random

import pytest

from fairseq_ext.tools import synthetic


def _lines(path):
    with open(path) as f:
        return [line.rstrip("\n") for line in f]


@pytest.mark.parametrize("task", ["copy", "addition"])
def test_make_writes_correct_examples_in_the_length_ranges(task, tmp_path):
    counts = synthetic.main(["make", "--task", task, "--out", str(tmp_path), "--train", "300", "--valid", "20",
                             "--test", "30", "--max-train-digits", "12", "--test-digits", "25-30"])
    assert counts == {"train": 300, "valid": 20, "test": 30}
    order = (lambda d: d) if task == "copy" else (lambda d: d[::-1])  # addition: least significant digit first
    for split, (low, high) in {"train": (1, 12), "valid": (1, 12), "test": (25, 30)}.items():
        src, tgt = _lines(tmp_path / f"{split}.src"), _lines(tmp_path / f"{split}.tgt")
        assert len(src) == len(tgt) == counts[split]
        for s, t in zip(src, tgt):
            operands = [order(o) for o in "".join(s.split()).split("+")]  # most significant digit first
            assert len(operands) == (1 if task == "copy" else 2)
            assert all(len(o) >= 1 and (len(o) == 1 or o[0] != "0") for o in operands)
            assert max(low, len(operands)) <= sum(len(o) for o in operands) <= high  # the input's digits
            expect = operands[0] if task == "copy" else str(sum(int(o) for o in operands))
            assert "".join(t.split()) == order(expect) and t == " ".join(order(expect))
    train = [[len(o) for o in "".join(s.split()).split("+")] for s in _lines(tmp_path / "train.src")]
    totals = [sum(x) for x in train]
    assert min(totals) <= 3 and max(totals) >= 11  # the whole range is used
    if task == "addition":  # either operand may be the long one
        assert max(a for a, _ in train) >= 9 and max(b for _, b in train) >= 9


def test_addition_is_written_least_significant_digit_first(tmp_path):
    synthetic.main(["make", "--task", "addition", "--out", str(tmp_path), "--train", "200", "--valid", "1",
                    "--test", "1", "--max-train-digits", "6", "--test-digits", "8"])
    carried = 0
    for s, t in zip(_lines(tmp_path / "train.src"), _lines(tmp_path / "train.tgt")):
        a, b = (o.split() for o in s.split(" + "))
        digits = [int(d) for d in t.split()]
        carry = 0
        for i, d in enumerate(digits):  # the schoolbook sum from the units up, one output token per column
            column = (int(a[i]) if i < len(a) else 0) + (int(b[i]) if i < len(b) else 0) + carry
            assert d == column % 10
            carry = column // 10
            carried += carry
        assert carry == 0 and len(digits) in (max(len(a), len(b)), max(len(a), len(b)) + 1)
    assert carried > 0


@pytest.mark.parametrize("flags,message", [(["--max-train-digits", "1"], "--max-train-digits 1: must be >= 2"),
                                           (["--test-digits", "1-5"], "--test-digits 1-5: the inputs of --task "
                                                                      "addition have at least 2 digits")])
def test_addition_needs_a_digit_per_operand(flags, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        synthetic.main(["make", "--task", "addition", "--out", str(tmp_path), "--train", "5", *flags])


def test_make_is_seeded(tmp_path):
    for d in ("a", "b"):
        synthetic.main(["make", "--task", "addition", "--out", str(tmp_path / d), "--train", "5", "--valid", "1",
                        "--test", "1", "--max-train-digits", "8", "--test-digits", "9-10"])
    assert _lines(tmp_path / "a" / "train.src") == _lines(tmp_path / "b" / "train.src")


def test_score_counts_sequences_and_positions(tmp_path):
    out = tmp_path / "generate.out"
    out.write_text("S-0\t1 2 3\nT-0\t1 2 3\nH-0\t-0.1\t1 2 3\n"
                   "S-1\t4 5\nT-1\t4 5\nH-1\t-0.2\t4 6 7\n"
                   "S-2\t9\nT-2\t9 9\nH-2\t-0.3\t9\n")
    r = synthetic.main(["score", str(out), "--json", str(tmp_path / "s.json")])
    assert r["examples"] == 3
    assert r["sequence_accuracy"] == pytest.approx(100 / 3)
    assert r["token_accuracy"] == pytest.approx(100 * (3 + 1 + 1) / (3 + 3 + 2))


def test_edit_distance_against_known_cases():
    ed = synthetic.edit_distance
    assert ed([], []) == 0 and ed(list("abc"), []) == 3 and ed([], list("ab")) == 2
    assert ed(list("kitten"), list("sitting")) == 3 and ed(list("flaw"), list("lawn")) == 2
    rng = random.Random(0)
    for _ in range(50):  # symmetric, within the length bounds, zero only for equal lists
        a = [rng.choice("01") for _ in range(rng.randint(0, 9))]
        b = [rng.choice("01") for _ in range(rng.randint(0, 9))]
        d = ed(a, b)
        assert d == ed(b, a) and abs(len(a) - len(b)) <= d <= max(len(a), len(b)) and (d == 0) == (a == b)


def test_errors_separate_a_lost_place_from_wrong_digits(tmp_path):
    ref = "1 2 3 4 5 6 7 8 9 0"
    out = tmp_path / "generate.out"
    out.write_text(f"T-0\t{ref}\nH-0\t-0.1\t{ref}\n"
                   f"T-1\t{ref}\nH-1\t-0.1\t1 2 3 3 4 5 6 7 8 9 0\n"  # one digit repeated: the rest shifts
                   f"T-2\t{ref}\nH-2\t-0.1\t1 2 3 4 5 6 7 8 0 0\n"  # one wrong digit
                   f"T-3\t{ref}\nH-3\t-0.1\t1 2\n")  # stopped early
    position = synthetic.main(["score", str(out)])
    r = synthetic.main(["errors", str(out), "--json", str(tmp_path / "e.json")])
    assert position["token_accuracy"] == pytest.approx(100 * (10 + 3 + 9 + 2) / (10 + 11 + 10 + 10))
    assert r["edit_token_accuracy"] == pytest.approx(100 * (1 - (0 + 1 + 1 + 8) / 40))
    assert (r["exact"], r["too_long"], r["wrong_digits"], r["too_short"]) == (1, 1, 1, 1)
    assert r["median_correct_prefix"] == 3  # prefixes 3, 8, 2
    with open(tmp_path / "e.json") as f:
        assert __import__("json").load(f) == r


def test_places_find_where_and_which_way_an_answer_loses_its_place(tmp_path):
    ref = "1 2 3 4 5 6 7 8 9 0 1 1 2 2 3 3"  # 16 tokens, no 3-token stretch repeats
    skip = "1 2 3 4 8 9 0 1 1 2 2 3 3"  # from position 4 on it continues at position 7: 3 ahead
    back = "1 2 3 4 5 6 7 8 2 3 4 5 6 7 8 9 0 1 1 2 2 3 3"  # at 8 it goes back to position 1: 7 behind
    digit = "1 2 3 4 5 6 7 8 9 0 1 1 2 2 3 7"  # last digit wrong: no window after it
    out = tmp_path / "generate.out"
    out.write_text("".join(f"T-{i}\t{r}\nH-{i}\t-0.1\t{h}\n" for i, (r, h) in
                           enumerate([(ref, ref), (ref, skip), (ref, back), (ref, digit), ("5 5", "5 5")])))
    r = synthetic.main(["places", str(out), "--trained", "6", "--window", "3", "--bins", "2",
                        "--json", str(tmp_path / "p.json")])
    assert r["wrong"] == 3 and r["first_error_within_trained"] == 1  # first errors at 4, 8, 15
    assert r["jumps"] == {"answers": 2, "earlier": 1, "later": 1, "median_distance_earlier": 7,
                          "median_distance_later": 3}
    # reference lengths 2..16 in two bands of 8 (the last capped at the longest): the 2-token answer alone in the first
    assert r["exact_by_length"] == [{"lengths": "2-9", "exact": 1, "examples": 1},
                                    {"lengths": "10-16", "exact": 1, "examples": 4}]
    with open(tmp_path / "p.json") as f:
        assert __import__("json").load(f) == r
    with pytest.raises(SystemExit, match="--window"):
        synthetic.main(["places", str(out), "--window", "0"])


def test_clear_errors(tmp_path):
    with pytest.raises(SystemExit, match="digit range '30-20'"):
        synthetic.main(["make", "--task", "copy", "--out", str(tmp_path), "--test-digits", "30-20"])
    out = tmp_path / "g.out"
    out.write_text("T-0\t1\n")
    with pytest.raises(SystemExit, match="references without a hypothesis"):
        synthetic.main(["score", str(out)])


def test_numbers_have_exactly_the_digits_asked():
    rng = random.Random(0)
    assert all(len(synthetic.number(rng, n)) == n for n in range(1, 40))


# what make writes (50/5/5 examples, at most 20 digits in training, 30-40 in the test, seed 1) in each task's
# DATA_FORMAT version: a change to make's examples must raise the task's version (and add its line here)
MADE = {("copy", 1): "7d73320f8d433bc85f53eb6ce5bf0ae86ad0dd5678481259424acb1389b306d0",
        ("addition", 2): "a80cf067f5f43210092004555b071de861624247dc2c2bdf5075bce643d9d9e1"}


@pytest.mark.parametrize("task", ["copy", "addition"])
def test_data_format_versions_what_make_writes(task, tmp_path):
    import hashlib

    synthetic.main(["make", "--task", task, "--out", str(tmp_path), "--train", "50", "--valid", "5", "--test", "5",
                    "--max-train-digits", "20", "--test-digits", "30-40", "--seed", "1"])
    digest = hashlib.sha256()
    for split in ("train", "valid", "test"):
        for side in ("src", "tgt"):
            digest.update((tmp_path / f"{split}.{side}").read_bytes())
    key = (task, synthetic.DATA_FORMAT[task])
    assert key in MADE, f"no pin for {key}: add the new version's digest to MADE"
    assert digest.hexdigest() == MADE[key], (f"make writes other {task} examples than DATA_FORMAT "
                                             f"{key[1]} did: raise DATA_FORMAT['{task}'] and pin the new digest")
