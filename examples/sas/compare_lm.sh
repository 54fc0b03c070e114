#!/usr/bin/env bash
# Pre-LN vs SAS vs SAS-P (with and without normalisation) code language models, same number of updates:
# valid loss per update and per training second (PNG), parameters, training tokens/s.
#   examples/sas/compare_lm.sh DATA_BIN OUT_DIR MAX_UPDATE [SIZE]
# DATA_BIN from examples/sas/prepare-code.sh; SIZE small (default) | paper | tiny (examples/sas/train_lm.sh).
# The runs are sequential, so their seconds are comparable when nothing else runs on the machine.
# A block already trained (OUT_DIR/BLOCK.train.log ends with "done training") is not trained again.
set -euo pipefail
data=$1; out=$2; max_update=$3; size=${4:-small}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
runs=()
for block in preln sas sas_p sas_p_nonorm; do
  log="$out/$block.train.log"
  if ! grep -q "done training" "$log" 2>/dev/null; then
    rm -rf "$out/$block"
    "$here/train_lm.sh" "$size" "$block" "$data" "$out/$block" --max-update "$max_update" > "$log" 2>&1 \
      || { tail -30 "$log"; exit 1; }
  fi
  runs+=("$block=$log")
done
python -m fairseq_ext.tools.curves "${runs[@]}" --out "$out/curves" \
  --title "Code LM ($size), $max_update updates of 4,096 tokens, context 128"
