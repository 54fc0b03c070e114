"""The shell recipes run end to end (tiny sizes, a few updates): what a user copies must work."""
import os

from conftest import REPO, run


def test_one_wide_ffn_compare_recipe(tiny_data, tmp_path):
    out = tmp_path / "owf"
    p = run(["bash", os.path.join(REPO, "examples/one_wide_ffn/compare.sh"), str(tiny_data.parent / "corpus"),
             str(out), "6", "tiny"], VOCAB="1000", EVAL_FLAGS="--max-len-a 1 --max-len-b 5")
    table = (out / "results.md").read_text()
    for row in ("| baseline |", "| one_wide_ffn |", "| copy source (trivial) |"):
        assert row in table, table
    assert "100 test sentences" in table and "BLEU nrefs:1" in table
    assert "sentences" in p.stdout
