"""Docs cannot drift from their data: every generated block and benchmark table equals what the tool makes."""
import os

import pytest

from fairseq_ext.tools import docs


def test_every_generated_block_matches_its_data():
    changed = docs.run(write=False)
    assert not changed, f"run `python -m fairseq_ext.tools.docs --write`; stale: {changed}"


def test_the_readme_and_family_pages_have_generated_blocks():
    with open(os.path.join(docs.REPO, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    assert "<!-- docs:headline -->" in readme and "<!-- study:results:begin -->" in readme
    for family in ("one_wide_ffn", "can", "scaling_sparse", "terraformer", "sas"):
        with open(os.path.join(docs.REPO, "docs", family, "README.md"), encoding="utf-8") as f:
            assert "<!-- docs:flags " in f.read(), f"docs/{family}/README.md lists no generated flags table"


def test_a_stale_block_is_found_and_rewritten():
    text = "x\n<!-- docs:bench decode_can -->\nold table\n<!-- docs:end -->\ny\n"
    new = docs.render(text)
    assert "old table" not in new and "| can_decoder |" in new and new.startswith("x\n") and new.endswith("y\n")
    assert docs.render(new) == new


def test_unknown_block_kind_is_an_error():
    with pytest.raises(ValueError, match="unknown block kind"):
        docs.render("<!-- docs:nope a -->\n\n<!-- docs:end -->\n", "X.md")


def test_flags_table_lists_every_family_flag_with_the_arch_value():
    t = docs.block_flags(["can_decoder", "can_decoder_big"])
    assert "| `--can-value-dim D` | 2048 | 4096 |" in t
    assert "--decoder-ffn-sharing" not in t  # refused by CAN at build time, so not offered
    assert "--encoder-layers" not in t  # fairseq's own flags are fairseq's docs
