# Sourced by the recipes: the device and precision flags of fairseq-train and fairseq-generate.
#   train_device: --cpu unless torch sees a CUDA device.
#   decode_device: --fp16 on a CUDA device (PRECISION=fp32 keeps fp32), otherwise --cpu.
#   training_precision: a function that sets `precision` for fairseq-train by measurement
#     (python -m fairseq_ext.tools.precision: --fp16 on a GPU, --bf16 autocast on a CPU with native bf16
#     that runs it faster, else fp32); PRECISION=fp32|bf16|fp16 (env) overrides the choice. Only the
#     training recipes call it (the measurement is a probe product: decoding recipes need none).
#   cpu_allocator: a function that, in a CPU run, preloads tcmalloc (libtcmalloc_minimal.so.4, Debian/Ubuntu
#     package libtcmalloc-minimal4) when the machine has it. A CPU training update allocates and frees tensors
#     of tens of MB (logits, their gradient); glibc hands those back to the kernel on every free, so each
#     update pays the page faults again. tcmalloc keeps the memory: same results, faster
#     (docs/benchmarks/train_allocator.md). ALLOCATOR=system (env) keeps glibc's. examples/train.sh calls it.
case "${ALLOCATOR:-auto}" in
  auto|system) ;;
  *) echo "ALLOCATOR=${ALLOCATOR}: use auto or system" >&2; exit 2 ;;
esac
case "${PRECISION:-auto}" in
  auto|fp32|bf16|fp16) ;;
  *) echo "PRECISION=${PRECISION}: use auto, fp32, bf16 or fp16" >&2; exit 2 ;;
esac
if python -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  train_device=()
  if [ "${PRECISION:-auto}" = fp32 ]; then decode_device=(); else decode_device=(--fp16); fi
else
  train_device=(--cpu)
  decode_device=(--cpu)
fi

training_precision() {
  case "${PRECISION:-auto}" in
    auto) read -r -a precision <<< "$(python -m fairseq_ext.tools.precision)" ;;
    fp32) precision=() ;;
    bf16) precision=(--bf16) ;;
    fp16) precision=(--fp16) ;;
  esac
}

cpu_allocator() {
  [ "${ALLOCATOR:-auto}" = auto ] && [ "${train_device[*]}" = --cpu ] || return 0
  local lib
  lib=$({ ldconfig -p 2>/dev/null || true; } | awk '$1 == "libtcmalloc_minimal.so.4" && !f {print $NF; f = 1}')
  [ -n "$lib" ] || return 0
  case ":${LD_PRELOAD:-}:" in *":$lib:"*) return 0 ;; esac
  export LD_PRELOAD="$lib${LD_PRELOAD:+:$LD_PRELOAD}"
  export TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD=${TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD:-1099511627776}
  echo "memory allocator: tcmalloc ($lib; ALLOCATOR=system keeps glibc's)" >&2
}
