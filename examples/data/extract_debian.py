#!/usr/bin/env python3
"""Rebuild the EN-DE corpus data/en-de from Debian packages (and one PyPI package).

    python examples/data/extract_debian.py --out OUT_DIR [--work WORK_DIR] [--valid-test-from DIR]

Sources (the corpus README lists them with their licences), each extracted by one function below:
  ding_sent  trans-de-en: example sentences of the Ding dictionary (`de | de :: en | en` lines)
  ddtp       Debian's translated package descriptions (Translation-en/-de of the apt lists),
             aligned by Description-md5, then paragraph, then sentence
  lo         libreoffice-l10n-de: gettext catalogs (English msgid -> German msgstr)
  wesnoth    wesnoth-1.16-data and the campaign packages: gettext catalogs
  gimphelp   gimp-help-en + gimp-help-de: HTML pages, text blocks aligned by position
  freeciv    freeciv-data: gettext catalogs
  gnomehelp  gnome-user-docs: Mallard pages (help/C vs help/de), blocks aligned by position
  plone      PyPI plone.app.locales: .po files (English from the `Default:` comment or the msgid)
Packages are fetched with `apt-get download` (no root needed for that) and unpacked with dpkg-deb.
Pairs are normalised (whitespace), filtered (length, length ratio, untranslated, markup), deduplicated,
and training pairs whose English side occurs in valid/test are removed. Valid/test: copied from
--valid-test-from when given (to stay comparable with data/en-de), else drawn here: test = 2,000
random Ding sentences, valid = 1,319 random pairs of the other sources (seeded).
"""
import argparse
import collections
import glob
import html
import html.parser
import os
import random
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile

from corpus_io import read_gz, write_gz

DEBS = {
    "ding_sent": ["trans-de-en"],
    "lo": ["libreoffice-l10n-de"],
    "wesnoth": ["wesnoth-1.16-data", "wesnoth-1.16-did", "wesnoth-1.16-dm", "wesnoth-1.16-dw",
                "wesnoth-1.16-ei", "wesnoth-1.16-httt", "wesnoth-1.16-l", "wesnoth-1.16-low",
                "wesnoth-1.16-nr", "wesnoth-1.16-sof", "wesnoth-1.16-sota", "wesnoth-1.16-sotbe",
                "wesnoth-1.16-thot", "wesnoth-1.16-trow", "wesnoth-1.16-tsg", "wesnoth-1.16-ttb",
                "wesnoth-1.16-utbs"],
    "gimphelp": ["gimp-help-en", "gimp-help-de"],
    "freeciv": ["freeciv-data"],
    "gnomehelp": ["gnome-user-docs"],
}
MAX_CHARS = 400
SENTENCE_END = re.compile(r"""[.!?…]["'“”’)»«]*$""")


# ---------------------------------------------------------------- fetching

def fetch_debs(packages, work):
    """apt-get download + dpkg-deb -x; returns {package: unpacked root}."""
    debs = os.path.join(work, "debs")
    os.makedirs(debs, exist_ok=True)
    roots = {}
    missing = [p for p in packages if not glob.glob(os.path.join(debs, f"{p}_*.deb"))]
    if missing:
        subprocess.run(["apt-get", "download", *missing], cwd=debs, check=True)
    for p in packages:
        deb = sorted(glob.glob(os.path.join(debs, f"{p}_*.deb")))[-1]
        root = os.path.join(work, "x", p)
        if not os.path.isdir(root):
            os.makedirs(os.path.dirname(root), exist_ok=True)
            shutil.rmtree(root + ".tmp", ignore_errors=True)
            subprocess.run(["dpkg-deb", "-x", deb, root + ".tmp"], check=True)
            os.replace(root + ".tmp", root)
        roots[p] = root
    return roots


# ---------------------------------------------------------------- cleaning

def clean(text):
    text = html.unescape(text).replace("\u00a0", " ")
    return re.sub(r"\s+", " ", text).strip()


def keep(en, de):
    """Filter shared by all sources: a real, translated, not too long text pair."""
    if not en or not de or en == de:
        return False
    if len(en) > MAX_CHARS or len(de) > MAX_CHARS:
        return False
    if not re.search(r"[A-Za-z]{2}", en) or not re.search(r"[A-Za-zÄÖÜäöüß]{2}", de):
        return False
    if re.search(r"<[a-zA-Z/][^>]*>", en + de):  # leftover markup
        return False
    ratio = len(de) / len(en)
    return 0.33 <= ratio <= 3.0 or (len(en) < 12 and len(de) < 36)


def split_sentences(text):
    return [s for s in re.split(r"(?<=[.!?])\s+(?=[\"'“„(]?[A-ZÄÖÜ0-9])", text) if s]


# ---------------------------------------------------------------- sources

def ding_sentences(root):
    """Example sentences: the `|`-separated alternatives of a Ding line, aligned by position,
    that are sentences on both sides (capital start, final punctuation, at least three words)."""
    path = os.path.join(root, "usr/share/trans/de-en")
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("#") or " :: " not in line:
                continue
            de_side, en_side = line.rstrip("\n").split(" :: ", 1)
            de_parts, en_parts = de_side.split(" | "), en_side.split(" | ")
            if len(de_parts) != len(en_parts):
                continue
            for de, en in zip(de_parts, en_parts):
                de, en = clean(de), clean(en)
                if all(len(s.split()) >= 3 and s[:1].isupper() and SENTENCE_END.search(s)
                       and "{" not in s and "[" not in s for s in (de, en)):
                    yield en, de


def mo_catalog(path):
    """English -> German pairs of a gettext .mo file (context dropped, plural forms: singular)."""
    import gettext

    with open(path, "rb") as f:
        catalog = gettext.GNUTranslations(f)._catalog
    for key, msgstr in catalog.items():
        if isinstance(key, tuple):  # plural: (msgid, n)
            if key[1] != 0:
                continue
            key = key[0]
        if not key:
            continue  # header
        msgid = key.split("\x04", 1)[-1]  # drop msgctxt
        yield msgid, msgstr


def gettext_pairs(roots, pattern):
    for root in roots:
        for path in sorted(glob.glob(os.path.join(root, pattern), recursive=True)):
            for en, de in mo_catalog(path):
                en, de = clean(en.replace("~", "")), clean(de.replace("~", ""))  # ~ = LO accelerators
                yield en, de


def po_entries(path):
    """(comments, msgid, msgstr) of the entries of a .po file (blank-line separated); fuzzy and
    untranslated entries skipped, plural entries give their singular form."""
    with open(path, encoding="utf-8") as f:
        chunks = f.read().split("\n\n")
    for chunk in chunks:
        comments, fields, field = [], {}, None
        for line in chunk.splitlines():
            if line.startswith("#"):
                comments.append(line)
            elif line.startswith(("msgctxt ", "msgid ", "msgid_plural ", "msgstr ", "msgstr[0] ")):
                field, value = line.split(" ", 1)
                fields[field] = _po_string(value)
            elif line.startswith('"') and field is not None:
                fields[field] += _po_string(line)
            else:
                field = None  # msgstr[1..] and anything unknown
        msgid, msgstr = fields.get("msgid", ""), fields.get("msgstr", fields.get("msgstr[0]", ""))
        if msgid and msgstr and not any(c.startswith("#,") and "fuzzy" in c for c in comments):
            yield comments, msgid, msgstr


_PO_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _po_string(quoted):
    s = quoted.strip()
    s = s[1:-1] if len(s) >= 2 and s[0] == s[-1] == '"' else s
    return re.sub(r'\\(.)', lambda m: _PO_ESCAPES.get(m.group(1), m.group(1)), s)


def plone_pairs(work):
    wheels = os.path.join(work, "pypi")
    os.makedirs(wheels, exist_ok=True)
    if not glob.glob(os.path.join(wheels, "plone_app_locales-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", wheels,
                        "plone.app.locales"], check=True)
    whl = sorted(glob.glob(os.path.join(wheels, "plone_app_locales-*.whl")))[-1]
    with zipfile.ZipFile(whl) as z:
        names = [n for n in z.namelist() if re.search(r"/locales/de/LC_MESSAGES/[^/]+\.po$", n)]
        z.extractall(os.path.join(work, "plone"), names)
    for name in sorted(names):
        for comments, msgid, msgstr in po_entries(os.path.join(work, "plone", name)):
            default = [c for c in comments if c.startswith("#. Default:")]
            if default:
                en = default[0].split(":", 1)[1].strip().strip('"')
            elif " " in msgid or not re.search(r"[_]|^[a-z]+$", msgid):
                en = msgid  # the msgid is the English text itself
            else:
                continue  # a message id without an English default
            yield clean(en), clean(msgstr)


class _Blocks(html.parser.HTMLParser):
    """Text of block elements in document order (innermost block wins)."""
    BLOCKS = {"p", "li", "h1", "h2", "h3", "h4", "h5", "dt", "dd", "td", "th", "title", "caption"}
    SKIP = {"script", "style", "pre", "code"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks, self.stack, self.skip = [], [], 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skip += 1
        if tag in self.BLOCKS:
            self.stack.append([])

    def handle_endtag(self, tag):
        if tag in self.SKIP:
            self.skip = max(0, self.skip - 1)
        if tag in self.BLOCKS and self.stack:
            self.blocks.append(clean("".join(self.stack.pop())))

    def handle_data(self, data):
        if self.stack and not self.skip:
            self.stack[-1].append(data)


def html_blocks(path):
    p = _Blocks()
    with open(path, encoding="utf-8", errors="replace") as f:
        p.feed(f.read())
    return p.blocks


def aligned_blocks(en_blocks, de_blocks):
    """Blocks of two renderings of the same page, paired by position when the structure matches;
    a paragraph whose sentence counts agree is paired sentence by sentence."""
    if len(en_blocks) != len(de_blocks):
        return
    for en, de in zip(en_blocks, de_blocks):
        se, sd = split_sentences(en), split_sentences(de)
        if len(se) == len(sd) and len(se) > 1:
            yield from zip(se, sd)
        else:
            yield en, de


def gimp_pairs(roots):
    en_dir = os.path.join(roots["gimp-help-en"], "usr/share/gimp/2.0/help/en")
    de_dir = os.path.join(roots["gimp-help-de"], "usr/share/gimp/2.0/help/de")
    for en_path in sorted(glob.glob(os.path.join(en_dir, "**/*.html"), recursive=True)):
        de_path = os.path.join(de_dir, os.path.relpath(en_path, en_dir))
        if os.path.exists(de_path):
            yield from aligned_blocks(html_blocks(en_path), html_blocks(de_path))


def mallard_blocks(path):
    ns = "{http://projectmallard.org/1.0/}"
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return None
    out = []
    for el in root.iter():
        if el.tag in (ns + "title", ns + "desc", ns + "p"):
            out.append(clean("".join(el.itertext())))
    return out


def gnome_pairs(root):
    base = os.path.join(root, "usr/share/help")
    for en_path in sorted(glob.glob(os.path.join(base, "C", "*", "*.page"))):
        rel = os.path.relpath(en_path, os.path.join(base, "C"))
        de_path = os.path.join(base, "de", rel)
        if os.path.exists(de_path):
            en, de = mallard_blocks(en_path), mallard_blocks(de_path)
            if en is not None and de is not None:
                yield from aligned_blocks(en, de)


def ddtp_pairs(work):
    """Translation-en / Translation-de of bookworm main, fetched into a private apt lists folder."""
    lists = os.path.join(work, "apt-lists")
    os.makedirs(os.path.join(lists, "partial"), exist_ok=True)
    if not glob.glob(os.path.join(lists, "*Translation-de*")):
        subprocess.run(["apt-get", "update", "-o", f"Dir::State::Lists={lists}",
                        "-o", "Acquire::Languages=en,de", "-o", "Acquire::IndexTargets::deb::Packages::DefaultEnabled=false"],
                       check=True)
    descriptions = {"en": {}, "de": {}}
    for lang in ("en", "de"):
        for path in glob.glob(os.path.join(lists, f"*Translation-{lang}*")):
            # apt keeps its lists compressed its own way (lz4 here): let apt-helper decompress
            text = subprocess.run(["/usr/lib/apt/apt-helper", "cat-file", path], check=True,
                                  capture_output=True).stdout.decode("utf-8", "replace")
            for record in text.split("\n\n"):
                md5 = re.search(r"^Description-md5: *(\S+)", record, re.M)
                body = re.search(rf"^Description-{lang}: *(.*(?:\n .*)*)", record, re.M)
                if md5 and body:
                    first, *rest = body.group(1).split("\n")
                    descriptions[lang][md5.group(1)] = [first.strip()] + [l[1:] for l in rest]
    for md5, de_lines in descriptions["de"].items():
        en_lines = descriptions["en"].get(md5)
        if en_lines is None:
            continue
        en_pars, de_pars = _paragraphs(en_lines), _paragraphs(de_lines)
        if len(en_pars) != len(de_pars):
            continue
        for en, de in zip(en_pars, de_pars):
            se, sd = split_sentences(en), split_sentences(de)
            if len(se) == len(sd):
                yield from zip(se, sd)


def _paragraphs(lines):
    """Short description, then the long description's paragraphs (` .` lines separate them)."""
    pars, cur = [clean(lines[0])], []
    for line in lines[1:]:
        if line.strip() == ".":
            pars.append(clean(" ".join(cur)))
            cur = []
        else:
            cur.append(line)
    if cur:
        pars.append(clean(" ".join(cur)))
    return [p for p in pars if p]


# ---------------------------------------------------------------- assembly

def collect(work, sources):
    need = sorted({p for s in sources for p in DEBS.get(s, [])})
    roots = fetch_debs(need, work) if need else {}
    wes = [roots[p] for p in DEBS["wesnoth"] if p in roots]
    extractors = {
        "ding_sent": lambda: ding_sentences(roots["trans-de-en"]),
        "ddtp": lambda: ddtp_pairs(work),
        "lo": lambda: gettext_pairs([roots["libreoffice-l10n-de"]], "**/de/LC_MESSAGES/*.mo"),
        "wesnoth": lambda: gettext_pairs(wes, "**/locale/de/LC_MESSAGES/*.mo"),
        "gimphelp": lambda: gimp_pairs(roots),
        "freeciv": lambda: gettext_pairs([roots["freeciv-data"]], "**/locale/de/LC_MESSAGES/*.mo"),
        "gnomehelp": lambda: gnome_pairs(roots["gnome-user-docs"]),
        "plone": lambda: plone_pairs(work),
    }
    pairs = collections.OrderedDict()  # (en, de) -> origin: first source wins on duplicates
    for source in sources:
        n = 0
        for en, de in extractors[source]():
            if keep(en, de) and (en, de) not in pairs:
                pairs[en, de] = source
                n += 1
        print(f"{source}: {n} pairs", flush=True)
    return pairs


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--work", default=None, help="download/unpack folder (default OUT/work)")
    p.add_argument("--sources", default="ding_sent,ddtp,lo,wesnoth,gimphelp,freeciv,gnomehelp,plone")
    p.add_argument("--valid-test-from", help="copy valid/test.{en,de}.gz from this folder")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    work = args.work or os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    sources = args.sources.split(",")
    unknown = set(sources) - {"ding_sent", "ddtp", "lo", "wesnoth", "gimphelp", "freeciv", "gnomehelp", "plone"}
    if unknown:
        p.error(f"--sources: unknown {sorted(unknown)}")
    pairs = collect(work, sources)
    items = list(pairs.items())
    rng = random.Random(args.seed)
    if args.valid_test_from:
        valid = list(zip(read_gz(os.path.join(args.valid_test_from, "valid.en.gz")),
                         read_gz(os.path.join(args.valid_test_from, "valid.de.gz"))))
        test = list(zip(read_gz(os.path.join(args.valid_test_from, "test.en.gz")),
                        read_gz(os.path.join(args.valid_test_from, "test.de.gz"))))
    else:
        ding = [i for i, (_, o) in enumerate(items) if o == "ding_sent"]
        test_ids = set(rng.sample(ding, min(2000, len(ding))))
        rest = [i for i in range(len(items)) if i not in test_ids and items[i][1] != "ding_sent"]
        valid_ids = set(rng.sample(rest, min(1319, len(rest))))
        test = [items[i][0] for i in sorted(test_ids)]
        valid = [items[i][0] for i in sorted(valid_ids)]
    held_out = {en for en, _ in valid + test}
    train = [(pair, o) for pair, o in items if pair[0] not in held_out]
    rng.shuffle(train)
    os.makedirs(args.out, exist_ok=True)
    write_gz(os.path.join(args.out, "train.en.gz"), [en for (en, _), _ in train])
    write_gz(os.path.join(args.out, "train.de.gz"), [de for (_, de), _ in train])
    write_gz(os.path.join(args.out, "train.origin.gz"), [o for _, o in train])
    for name, split in (("valid", valid), ("test", test)):
        write_gz(os.path.join(args.out, f"{name}.en.gz"), [en for en, _ in split])
        write_gz(os.path.join(args.out, f"{name}.de.gz"), [de for _, de in split])
    counts = collections.Counter(o for _, o in train)
    print(f"train {len(train)} pairs ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))}); "
          f"valid {len(valid)}; test {len(test)}; removed {len(items) - len(train)} held-out overlaps")


if __name__ == "__main__":
    main()
