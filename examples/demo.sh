#!/usr/bin/env bash
# `make demo`: the whole pipeline on the committed data, then the shipped checkpoints.
#  Part 1 (short runs, from scratch): SentencePiece on data/en-de-sample -> fairseq-preprocess ->
#         fairseq-train --user-dir fairseq_ext of a tiny Transformer and a tiny One Wide FFN model with the
#         same budget (DEMO_UPDATES updates each, default 120) -> fairseq-generate on the 2,000-sentence
#         test set -> one table of BLEU/chrF/parameters/speed. A few CPU minutes cannot teach translation:
#         this part shows the pipeline and the falling loss, and its BLEU is expected to be near zero.
#  Part 2 (shipped checkpoints): every model under shipped/ (trained for hours by this repo's recipes;
#         see its README.md) translates the same test set: BLEU/chrF/speed, and the copy baseline.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
updates=${DEMO_UPDATES:-120}
runs=runs/demo
mkdir -p "$runs"
start=$(date +%s)

echo "== Part 1: short runs from scratch, $updates updates each (data/en-de-sample: 25,000 pairs) =="
rm -rf "$runs/short"
LOG_INTERVAL=10 EVAL_FLAGS="--max-len-a 1.2 --max-len-b 10" examples/one_wide_ffn/compare.sh data/en-de-sample "$runs/short" \
  "$updates" tiny > "$runs/short.log" 2>&1 || { tail -40 "$runs/short.log"; exit 1; }
for m in baseline one_wide_ffn; do
  echo "-- $m: training loss (label-smoothed, base 2) --"
  grep -E "train_inner" "$runs/short/$m.train.log" | sed -E 's/.*(epoch [0-9]+).* loss=([0-9.]+).*num_updates=([0-9]+).*/  \1  update \3  loss \2/' | awk 'NR==1 || NR%2==0'
done
echo
cat "$runs/short/results.md"

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
