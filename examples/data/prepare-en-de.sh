#!/usr/bin/env bash
# Rebuild the full EN-DE corpus (data/en-de) from Debian packages on a fresh machine.
#   examples/data/prepare-en-de.sh OUT_DIR [extract_debian.py flags, e.g. --valid-test-from DIR]
# Needs apt-get (Debian bookworm sources; ~420 MB of .deb downloads into OUT_DIR/work) and PyPI
# (plone.app.locales). Writes OUT_DIR/{train,valid,test}.{en,de}.gz and train.origin.gz, the layout
# binarize.sh reads:  examples/data/binarize.sh OUT_DIR data-bin/en-de-full
# The valid/test sets of the repository's data/en-de are reused (so results stay comparable) and training
# pairs overlapping them are removed; --valid-test-from DIR takes them from DIR instead, and without
# either, new ones are drawn (seeded).
set -euo pipefail
out=${1:?usage: prepare-en-de.sh OUT_DIR [flags]}; shift
here=$(cd "$(dirname "$0")" && pwd)
committed="$here/../../data/en-de"
extra=()
if [ -f "$committed/test.en.gz" ] && [[ " $* " != *" --valid-test-from "* ]]; then
  extra=(--valid-test-from "$committed")
fi
command -v apt-get >/dev/null || { echo "apt-get not found: this recipe needs a Debian-based machine" >&2; exit 1; }
# apt-get download works as any user; the DDTP lists are fetched into OUT_DIR/work/apt-lists.
python "$here/extract_debian.py" --out "$out" "${extra[@]}" "$@"
