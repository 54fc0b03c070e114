#!/usr/bin/env bash
# Creates .venv (if missing) and installs everything fairseq_ext needs, CPU only.
# Idempotent: a stamp file records a finished install; delete .venv to start over.
#   BENCH=1  also installs the benchmark-only dependencies (CTranslate2 ...: setup.py's [bench] extra);
#            `make bench` sets it.
# A successful run prints no line starting with "ERROR" (see the --no-warn-conflicts note below).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
STAMP="$VENV/.fairseq_ext_bootstrap_v1"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
VENV=$(cd "$VENV" && pwd)
export PATH="$VENV/bin:$PATH"
# (this machine's pip.conf names local wheel folders that may be absent: drop pip's warnings about them)
pip() {
  "$VENV/bin/python" -m pip --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
}
if [ ! -f "$STAMP" ]; then
  # torch first and pinned: any later resolver run must see it satisfied (never pull a CUDA build).
  pip install -q torch==2.13.0 setuptools wheel cython numpy ninja
  # fairseq 0.12 fork that imports on Python 3.11; --no-deps keeps torchaudio out,
  # --no-build-isolation builds it against the torch above (no second torch in a build env).
  pip install -q --no-deps --no-build-isolation fairseq-fixed==0.12.3.1
  # fairseq's real runtime deps, plus ours. torch is re-stated so pip can never replace it.
  # --no-warn-conflicts: after this install pip re-checks fairseq-fixed (it depends on packages installed
  # here) and would print "ERROR: pip's dependency resolver ... fairseq-fixed requires torchaudio, which is
  # not installed". torchaudio is left out on purpose (fairseq imports it only for its speech tasks); that
  # is the only conflict, and `pip check` still lists it (README, Install).
  pip install -q --no-warn-conflicts torch==2.13.0 cffi hydra-core==1.3.2 omegaconf==2.3.0 regex sacrebleu \
      tqdm bitarray scikit-learn packaging sentencepiece subword-nmt matplotlib pytest psutil
  touch "$STAMP"
fi
# Pinned tools outside the stamped install, checked on every run (an existing .venv gets a new one too).
pinned() {
  "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('$1') != '$2')" 2>/dev/null \
    || pip install -q "$1==$2"
}
pinned ruff 0.17.6          # the linter of `make lint` and .ci/run (the same findings everywhere; no dependencies)
pinned pytest-xdist 3.8.0   # the test runner's parallel workers (`make test` runs the suite on every core, up to 4)
# benchmark-only, on request (BENCH=1; `make bench`): setup.py's [bench] extra with CTranslate2 pinned, the
# reference point of benchmarks/decode_speed.py's NAME+ct2 models (its requirements are numpy, pyyaml,
# setuptools: no torch). Without it those models are skipped with a note, and so are the tests that need it.
if [ "${BENCH:-0}" = 1 ]; then
  "$VENV/bin/python" -c "import ctranslate2, yaml" 2>/dev/null || pip install -q ctranslate2==4.8.5 pyyaml
fi
# Our package (editable) and its C++ extension. The extension is rebuilt only when what it is built from
# changed: the csrc/ sources, setup.py's extensions() (sources, flags) or torch's version (its ABI); their
# fingerprint is kept in the venv. Any other change of setup.py / pyproject.toml (metadata, entry points,
# extras) reinstalls the package without recompiling (the built fairseq_ext/_C*.so stays in place).
so=$(ls fairseq_ext/_C*.so 2>/dev/null | head -1 || true)
KEY="$VENV/.fairseq_ext_C_key"
INSTALLED="$VENV/.fairseq_ext_installed"
sources() { find csrc -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) "$@"; }
key=$( { sources | LC_ALL=C sort | xargs -r cat; sed -n '/^def extensions/,/^ext_modules/p' setup.py
         "$VENV/bin/python" -c "import importlib.metadata as m; print(m.version('torch'))"; } | sha256sum | cut -d' ' -f1)
if [ ! -f "$KEY" ] && [ -n "$so" ] && [ -z "$(sources -newer "$so")" ]; then
  echo "$key" > "$KEY"  # built before the fingerprint was kept, newer than every source: kept as is
fi
importable() { (cd / && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('fairseq_ext') is None)"); }
if [ "${FAIRSEQ_EXT_NO_BUILD:-0}" = 1 ]; then
  pip install -q --no-deps --no-build-isolation -e .
elif [ -z "$so" ] || [ "$(cat "$KEY" 2>/dev/null)" != "$key" ]; then
  pip install -q --no-deps --no-build-isolation -e .
  echo "$key" > "$KEY"; touch "$INSTALLED"
elif [ ! -f "$INSTALLED" ] || [ -n "$(find setup.py pyproject.toml -newer "$INSTALLED")" ] || ! importable; then
  FAIRSEQ_EXT_NO_BUILD=1 pip install -q --no-deps --no-build-isolation -e .
  touch "$INSTALLED"
fi
