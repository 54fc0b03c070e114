#!/usr/bin/env bash
# The reproduction study (protocol: docs/results/README.md), resumable: rerun the same command to go on.
#   examples/study/run.sh OUT [--max-runs N] [--configs a,b]
# Trains every configuration to convergence on data/en-de (one run at a time; THREADS=N (env) gives each run
# N threads, so THREADS=1 started twice trains two runs side by side, each claiming another), evaluates each
# (averaged checkpoints, beam 5, sacrebleu), writes each run's result to docs/results/runs/, then
# regenerates docs/results (tables, curves, verdicts) and README's Results section.
set -euo pipefail
out=$1; shift
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"
if [ -n "${THREADS:-}" ]; then export OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS; fi
python -m fairseq_ext.tools.study run "$out" "$@"
python -m fairseq_ext.tools.study table
