# Sourced by the recipes that decode: sets the array `decode_device` for fairseq-generate.
# A CUDA device: fp16 decoding there (PRECISION=fp32 in the environment keeps fp32); otherwise --cpu.
if python -c 'import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  if [ "${PRECISION:-auto}" = fp32 ]; then decode_device=(); else decode_device=(--fp16); fi
else
  decode_device=(--cpu)
fi
