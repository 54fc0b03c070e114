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
export PATH="$PWD/$VENV/bin:$PATH"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
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
# our package and its C++ extension, always rebuilt (cheap when unchanged)
pip install -q --no-deps --no-build-isolation -e .
