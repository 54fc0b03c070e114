"""The data recipe's parsers, on real lines of each source format (no network needed), and the
committed sample's integrity."""
import gzip
import os
import sys

from conftest import REPO, SAMPLE

sys.path.insert(0, os.path.join(REPO, "examples", "data"))
import extract_debian as ex  # noqa: E402

# A real line of the Ding dictionary (trans-de-en 1.9, GPL-2+): dictionary senses and example sentences.
DING = ("sich (von etw.) ernähren {vr} [biol.] [cook.] | sich angemessen ernähren | Spinnen ernähren sich "
        "von Insekten. :: to nourish yourself on/with sth. (of humans); to feed on sth. (of animals) | "
        "to adequately nourish yourself | Spiders feed on insects.\n")


def test_ding_keeps_only_aligned_example_sentences(tmp_path):
    path = tmp_path / "usr/share/trans"
    path.mkdir(parents=True)
    (path / "de-en").write_text("# comment\n" + DING + "kaputt | A B C. :: broken\n", encoding="utf-8")
    assert list(ex.ding_sentences(str(tmp_path))) == [("Spiders feed on insects.", "Spinnen ernähren sich von Insekten.")]


def test_po_entries_defaults_plurals_fuzzy_and_escapes(tmp_path):
    po = tmp_path / "de.po"
    po.write_text('''msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

#. Default: "Title"
msgid "label_title"
msgstr "Titel"

#, fuzzy
msgid "Old text"
msgstr "Alter Text"

msgid "A \\"quoted\\" "
"word"
msgstr "Ein \\"zitiertes\\" Wort"

msgid "one item"
msgid_plural "${n} items"
msgstr[0] "ein Eintrag"
msgstr[1] "${n} Einträge"
''', encoding="utf-8")
    entries = [(m, s) for _, m, s in ex.po_entries(str(po))]
    assert entries == [("label_title", "Titel"), ('A "quoted" word', 'Ein "zitiertes" Wort'),
                       ("one item", "ein Eintrag")]


def test_blocks_align_by_position_and_split_matching_sentences():
    en = ["Layers", "A layer is an image. You can stack them."]
    de = ["Ebenen", "Eine Ebene ist ein Bild. Sie können sie stapeln."]
    assert list(ex.aligned_blocks(en, de)) == [
        ("Layers", "Ebenen"), ("A layer is an image.", "Eine Ebene ist ein Bild."),
        ("You can stack them.", "Sie können sie stapeln.")]
    assert list(ex.aligned_blocks(en, de[:1])) == []  # structures differ: nothing is paired


def test_html_blocks_innermost_text_in_order(tmp_path):
    page = tmp_path / "p.html"
    page.write_text("<html><head><title>Open &amp; Save</title><style>p{}</style></head><body>"
                    "<h1>Open</h1><p>Choose <b>File</b>\n  Open.</p><pre>code</pre><ul><li>One</li></ul></body>",
                    encoding="utf-8")
    assert ex.html_blocks(str(page)) == ["Open & Save", "Open", "Choose File Open.", "One"]


def test_keep_filter():
    assert ex.keep("Save the file.", "Datei speichern.")
    assert not ex.keep("Save", "Save")  # untranslated
    assert not ex.keep("<b>", "<b>x</b>")
    assert not ex.keep("A very long English sentence about many things.", "Ja.")
    assert not ex.keep("x" * 401, "y" * 401)


def _lines(name):
    with gzip.open(os.path.join(SAMPLE, name), "rt", encoding="utf-8") as f:
        return f.read().splitlines()


def test_committed_sample_is_aligned_and_disjoint_from_test():
    train_en, train_de, origin = _lines("train.en.gz"), _lines("train.de.gz"), _lines("train.origin.gz")
    assert len(train_en) == len(train_de) == len(origin) == 25000
    test_en = _lines("test.en.gz")
    assert len(test_en) == len(_lines("test.de.gz")) == 2000
    assert not set(test_en) & set(train_en)
    valid_en = _lines("valid.en.gz")
    assert len(valid_en) == len(_lines("valid.de.gz")) == 1319
    assert not set(valid_en) & set(train_en)
