"""Rebuild the code language-modelling corpus (data/code/python_stdlib.txt.gz) from this
machine's own CPython standard library: every `.py` file under the stdlib folder, sorted by path,
without the test suites (folders test/, tests/, idle_test/) and without site-packages, each preceded by
a `# <file> RELATIVE/PATH.py` line and followed by an empty line. PSF licence.

    python examples/data/extract_stdlib.py OUT.txt.gz [--stdlib DIR]

The corpus in data/code was made from CPython 3.11.7 (734 files); another Python version gives
another, equally valid corpus (the script prints the version and the file count).
"""
import argparse
import gzip
import os
import sys
import sysconfig

SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}


def stdlib_files(root):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                yield os.path.relpath(os.path.join(dirpath, name), root)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--stdlib", default=sysconfig.get_paths()["stdlib"])
    a = p.parse_args(argv)
    files = sorted(stdlib_files(a.stdlib))
    with gzip.open(a.out, "wt", encoding="utf-8") as out:
        for rel in files:
            with open(os.path.join(a.stdlib, rel), encoding="utf-8", errors="replace") as f:
                text = f.read()
            out.write(f"# <file> {rel}\n{text}")
            if text and not text.endswith("\n"):
                out.write("\n")
            out.write("\n")
    print(f"{a.out}: {len(files)} files of Python {sys.version.split()[0]} ({a.stdlib})")


if __name__ == "__main__":
    main()
