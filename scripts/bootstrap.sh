#!/usr/bin/env bash
# Creates .venv (if missing) and installs everything fairseq_ext needs, CPU only.
# Idempotent: a stamp file records a finished install; delete .venv to start over.
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
  pip install -q torch==2.13.0 cffi hydra-core==1.3.2 omegaconf==2.3.0 regex sacrebleu tqdm bitarray \
      scikit-learn packaging sentencepiece subword-nmt matplotlib pytest psutil
  touch "$STAMP"
fi
# benchmark-only: CTranslate2, the reference point of benchmarks/decode_speed.py's NAME+ct2 models (its
# requirements are numpy, pyyaml, setuptools: no torch)
"$VENV/bin/python" -c "import ctranslate2" 2>/dev/null || pip install -q ctranslate2==4.8.5 pyyaml
# our package (editable) and its C++ extension; rebuilt when csrc/ or setup.py changed since the last build
so=$(ls fairseq_ext/_C*.so 2>/dev/null | head -1 || true)
if [ "${FAIRSEQ_EXT_NO_BUILD:-0}" = 1 ] || [ -z "$so" ] || [ -n "$(find csrc setup.py pyproject.toml -newer "$so" 2>/dev/null)" ] \
   || ! (cd / && "$VENV/bin/python" -c "import importlib.util as u, sys; sys.exit(u.find_spec('fairseq_ext') is None)"); then
  pip install -q --no-deps --no-build-isolation -e .
fi
