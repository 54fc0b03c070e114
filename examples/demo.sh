#!/usr/bin/env bash
# `make demo`: the whole pipeline on the committed data, then the shipped checkpoints.
#  Part 1 (short run, from scratch): SentencePiece on data/en-de-sample -> fairseq-preprocess ->
#         fairseq-train --user-dir fairseq_ext for DEMO_MINUTES (default 3) -> fairseq-generate on the
#         2,000-sentence test set -> BLEU/chrF/speed. A few CPU minutes cannot teach translation: this
#         part shows the pipeline and the falling loss, and its BLEU is expected to be near zero.
#  Part 2 (shipped checkpoints): every model under shipped/ (trained for hours by this repo's recipes;
#         see its README.md) translates the same test set: BLEU/chrF/speed, and the copy baseline.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
minutes=${DEMO_MINUTES:-3}
runs=runs/demo
mkdir -p "$runs"
start=$(date +%s)

echo "== Part 1: short training run from scratch ($minutes min, data/en-de-sample: 25,000 pairs) =="
examples/data/binarize.sh data/en-de-sample data-bin/en-de-sample --vocab 8000
rm -rf "$runs/short"
hours=$(python -c "print($minutes / 60)")
examples/baseline/train.sh tiny data-bin/en-de-sample/bin "$runs/short" --stop-time-hours "$hours" \
  --no-epoch-checkpoints --log-interval 25 > "$runs/short.log" 2>&1 || { tail -40 "$runs/short.log"; exit 1; }
grep -E "train_inner|\| valid on" "$runs/short.log" | sed -E 's/.*(epoch [0-9]+).*( loss=[0-9.]+| loss [0-9.]+).*(num_updates[= ][0-9]+).*/  \1\2 \3/' | awk 'NR==1 || NR%4==0' | tail -8
cp data-bin/en-de-sample/spm.model data-bin/en-de-sample/bin/dict.en.txt data-bin/en-de-sample/bin/dict.de.txt "$runs/short/"
echo "-- short run: translating the test set (beam 5) --"
CKPT="$runs/short/checkpoint_last.pt" examples/evaluate.sh "$runs/short" data/en-de-sample "$runs/short-eval" \
  --max-len-a 1.2 --max-len-b 10 | sed 's/^/  /'

echo
echo "== Part 2: shipped checkpoints (trained by this repo's recipes; see shipped/*/README.md) =="
found=0
for m in shipped/*/; do
  [ -f "$m/checkpoint.pt" ] || continue
  found=1
  name=$(basename "$m")
  echo "-- $name: $(head -1 "$m/README.md" | sed 's/^# //') --"
  examples/evaluate.sh "$m" data/en-de-sample "$runs/$name-eval" | sed 's/^/  /'
done
[ "$found" = 1 ] || echo "  (no shipped checkpoints in this checkout)"
echo
echo "demo done in $(( ($(date +%s) - start) / 60 )) min $(( ($(date +%s) - start) % 60 )) s; logs under $runs/"
