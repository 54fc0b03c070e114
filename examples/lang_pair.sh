# Sourced by the recipes that take a language pair (examples/data/binarize.sh, examples/evaluate.sh).
# take_lang_pair SCRIPT ARGS...: --src XX / --tgt YY (or --src=XX / --tgt=YY) out of ARGS into $src / $tgt
# (the caller sets their defaults first), the other arguments, in order, into the array `rest`.
take_lang_pair() {
  local script=$1; shift
  rest=()
  while [ $# -gt 0 ]; do
    case "$1" in
      --src|--tgt) [ $# -ge 2 ] || { echo "$script: $1 needs a value" >&2; exit 2; }
                   if [ "$1" = --src ]; then src=$2; else tgt=$2; fi; shift 2 ;;
      --src=*) src=${1#*=}; shift ;;
      --tgt=*) tgt=${1#*=}; shift ;;
      *) rest+=("$1"); shift ;;
    esac
  done
}
