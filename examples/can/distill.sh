#!/usr/bin/env bash
# Sequence-level knowledge distillation (Kim & Rush 2016; CAN paper Table 4): the teacher translates the
# training source, the student trains on the teacher's output.
#   examples/can/distill.sh TEACHER_CKPT DATA_DIR OUT_DIR STUDENT_SIZE [extra fairseq-train flags...]
# DATA_DIR: binarize.sh's output the teacher was trained on (tok/, bin/). Decoding as in the paper
# (beam 4, length penalty 0.6; GEN_FLAGS adds fairseq-generate flags). Writes OUT_DIR/tok/train.de
# (teacher output, same subword pieces), OUT_DIR/bin (same dictionaries, valid/test unchanged) and trains
# STUDENT_SIZE (examples/can/train.sh sizes) into OUT_DIR/student. The language pair: SRC/TGT (env, default en de).
# On a CUDA device the teacher decodes in fp16.
set -euo pipefail
teacher=$1; data=$2; out=$3; size=$4; shift 4
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$here/../device.sh"
src=${SRC:-en}; tgt=${TGT:-de}
mkdir -p "$out/tok"
# shellcheck disable=SC2086
fairseq-generate "$data/bin" --user-dir "$repo/fairseq_ext" "${decode_device[@]}" --path "$teacher" --gen-subset train \
  --source-lang "$src" --target-lang "$tgt" --beam 4 --lenpen 0.6 --max-tokens 8000 ${GEN_FLAGS:-} \
  > "$out/teacher.train.gen" 2> "$out/teacher.train.log" || { tail -20 "$out/teacher.train.log"; exit 1; }
# H-<id> lines hold the teacher's subword pieces; put them back in corpus order
python - "$out/teacher.train.gen" "$data/tok/train.$src" "$out/tok" "$src" "$tgt" <<'PY'
import re, shutil, sys
gen, src, out, sl, tl = sys.argv[1:]
hyp = {}
for line in open(gen, encoding="utf-8"):
    m = re.match(r"H-(\d+)\t[^\t]*\t(.*)$", line.rstrip("\n"))
    if m:
        hyp[int(m.group(1))] = m.group(2)
n = sum(1 for _ in open(src, encoding="utf-8"))
if len(hyp) != n:
    sys.exit(f"teacher translated {len(hyp)} of {n} training sentences")
shutil.copy(src, f"{out}/train.{sl}")
with open(f"{out}/train.{tl}", "w", encoding="utf-8") as f:
    f.writelines(hyp[i] + "\n" for i in range(n))
print(f"distilled {n} training pairs")
PY
rm -rf "$out/bin"
fairseq-preprocess --source-lang "$src" --target-lang "$tgt" --trainpref "$out/tok/train" \
  --validpref "$data/tok/valid" --testpref "$data/tok/test" --destdir "$out/bin" \
  --srcdict "$data/bin/dict.$src.txt" --tgtdict "$data/bin/dict.$tgt.txt" --workers "$(nproc)" \
  > "$out/preprocess.log" 2>&1 || { cat "$out/preprocess.log"; exit 1; }
"$here/train.sh" "$size" "$out/bin" "$out/student" "$@"
