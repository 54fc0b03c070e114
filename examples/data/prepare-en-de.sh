#!/usr/bin/env bash
# Rebuild the full EN-DE corpus (shared/data/en-de) from Debian packages on a fresh machine.
#   examples/data/prepare-en-de.sh OUT_DIR [extract_debian.py flags, e.g. --valid-test-from DIR]
# Needs apt-get (Debian bookworm sources; ~420 MB of .deb downloads into OUT_DIR/work) and PyPI
# (plone.app.locales). Writes OUT_DIR/{train,valid,test}.{en,de}.gz and train.origin.gz, the layout
# binarize.sh reads:  examples/data/binarize.sh OUT_DIR data-bin/en-de-full
# When shared/data/en-de exists next to the repository its valid/test sets are reused (so results stay
# comparable) and training pairs overlapping them are removed; otherwise new ones are drawn (seeded).
set -euo pipefail
out=${1:?usage: prepare-en-de.sh OUT_DIR [flags]}; shift
here=$(cd "$(dirname "$0")" && pwd)
shared="$here/../../../shared/data/en-de"
extra=()
if [ -f "$shared/test.en.gz" ] && [[ " $* " != *" --valid-test-from "* ]]; then
  extra=(--valid-test-from "$shared")
fi
command -v apt-get >/dev/null || { echo "apt-get not found: this recipe needs a Debian-based machine" >&2; exit 1; }
# apt-get download works as any user; the DDTP lists are fetched into OUT_DIR/work/apt-lists.
python "$here/extract_debian.py" --out "$out" "${extra[@]}" "$@"
