#!/usr/bin/env bash
# Package a trained checkpoint as a shipped model folder (what `make demo` evaluates).
#   examples/ship.sh CHECKPOINT DATA_DIR OUT_DIR "one-line title" TRAIN_LOG
# DATA_DIR is binarize.sh's output (spm.model, bin/dict.*.txt). OUT_DIR gets checkpoint.pt (fp16,
# no optimizer state), spm.model, dict.en.txt, dict.de.txt, train.log (training progress and the
# fairseq-train command), SHA256SUMS, and README.md (title; the rest is written by hand).
set -euo pipefail
ckpt=$1; data=$2; out=$3; title=$4; log=$5
mkdir -p "$out"
python -m fairseq_ext.tools.export_checkpoint "$ckpt" "$out/checkpoint.pt" --fp16 2>/dev/null
cp "$data/spm.model" "$out/spm.model"
cp "$data/bin/dict.en.txt" "$out/dict.en.txt"
cp "$data/bin/dict.de.txt" "$out/dict.de.txt"
# the command, the per-epoch lines and the validation lines: enough to see how it was trained
grep -E "^\+ fairseq-train|fairseq_cli.train \| (model|num\. shared model params)|\| (train|valid) \||done training|end of epoch" "$log" > "$out/train.log" || true
(cd "$out" && sha256sum checkpoint.pt spm.model dict.en.txt dict.de.txt > SHA256SUMS)
[ -f "$out/README.md" ] || printf '# %s\n' "$title" > "$out/README.md"
du -sh "$out"
