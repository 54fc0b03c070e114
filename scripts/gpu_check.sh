#!/usr/bin/env bash
# The CUDA checks of csrc/ on a GPU machine, as one script (a GPU lease is short):
#   1. build fairseq_ext._C in place against that machine's CUDA torch (CPU + CUDA kernels);
#   2. the kernel tests on CUDA (tests/test_kernels.py -k cuda: reference comparisons over odd shapes,
#      float16/bfloat16, NaN-poisoned rows / padding / free cache, ties/NaN choices, determinism, opcheck;
#      sparse_ffn_decode and compressed_attention_decode);
#   3. compute-sanitizer memcheck over the CUDA op on odd shapes (where the runtime supports it);
#   4. the op benchmarks on the GPU (sparse_ffn_decode vs the dense FFN, ratios in one run).
# Usage: scripts/gpu_check.sh OUT_DIR   (results: OUT_DIR/*.json, *.md, logs)
# The GPU machine's Python has torch but no fairseq: FAIRSEQ_EXT_OPS_ONLY=1 imports only the kernels.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$out"
PY=${PYTHON:-python3}
export FAIRSEQ_EXT_OPS_ONLY=1 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
status=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

echo "== build (arch $TORCH_CUDA_ARCH_LIST)"
t0=$(date +%s)
if ! $PY setup.py -q build_ext --inplace >"$out/build.log" 2>&1; then
  tail -60 "$out/build.log"; echo "BUILD FAILED"; exit 1
fi
echo "built in $(( $(date +%s) - t0 )) s: $($PY -c 'import fairseq_ext.ops as o; print(o.build_info())')"

echo "== CUDA kernel tests"
# CUDA cases, plus the CPU error cases (a crash on both would point at the build, not the kernel);
# pytest-xdist workers so a crashing test is reported and the rest still run
$PY -m pytest tests/test_kernels.py -k "(cuda and not compile) or clear_errors" -q -n 4 -p no:cacheprovider \
  2>&1 | tee "$out/tests.log" | tail -25
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

echo "== do C++ exceptions reach Python from extensions built on this machine?"
# Probes of the machine's toolchain apart from our code: a pybind function that throws, and a
# TORCH_LIBRARY op that throws, compiled with our flags (-O3 -fopenmp), each in its own process.
for kind in pybind op; do
  KIND=$kind $PY - <<'PROBE' 2>&1 | tail -2
import os, torch, torch.utils.cpp_extension as ext
kind = os.environ["KIND"]
src = "#include <torch/extension.h>\n"
if kind == "pybind":
    src += "void f() { TORCH_CHECK(false, \"probe\"); }"
    m = ext.load_inline("probe_pybind", src, functions=["f"], extra_cflags=["-O3", "-fopenmp"])
    call = m.f
else:
    src += ("at::Tensor f(const at::Tensor& x) { TORCH_CHECK(x.dim() == 5, \"probe\"); return x; }\n"
            "TORCH_LIBRARY(probe_ns, m) { m.def(\"f(Tensor x) -> Tensor\"); }\n"
            "TORCH_LIBRARY_IMPL(probe_ns, CPU, m) { m.impl(\"f\", &f); }\n")
    ext.load_inline("probe_op", src, extra_cflags=["-O3", "-fopenmp"], extra_ldflags=["-fopenmp"],
                    is_python_module=False)
    call = lambda: torch.ops.probe_ns.f(torch.zeros(2))
try:
    call()
except RuntimeError as e:
    print(kind, "probe: exception reached Python:", str(e).splitlines()[0])
PROBE
  echo "($kind probe exit status ${PIPESTATUS[0]})"
done

echo "== compute-sanitizer memcheck"
if command -v compute-sanitizer >/dev/null; then
  timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -c "
import torch, fairseq_ext.ops
from fairseq_ext.ops.sparse_ffn import sparse_ffn_decode_reference as ref
for d, dff, n, t in [(40, 120, 12, 3), (136, 408, 136, 6), (33, 66, 1, 64), (1000, 4000, 40, 5)]:
    g = lambda *s: torch.randn(*s, device='cuda')
    w = [g(max(1, dff // n), d), g(dff, max(1, dff // n)), g(dff), g(dff, d), g(dff, d), g(d)]
    x = g(t, d)
    torch.testing.assert_close(torch.ops.fairseq_ext.sparse_ffn_decode(x, *w, n), ref(x, *w, n), rtol=1e-4, atol=1e-4)
from fairseq_ext.ops.compressed_attention import compressed_attention_decode_reference as can_ref
for b, h, dh, dvh, src, cap, n, d in [(3, 2, 12, 20, 7, 9, 7, 24), (5, 5, 7, 9, 33, 64, 37, 35), (1, 8, 64, 256, 30, 64, 40, 512)]:
    g = lambda *s: torch.randn(*s, device='cuda')
    bias = torch.zeros(b, src, device='cuda'); bias[0, src // 2:] = float('-inf')
    a = [g(b, h, dh), g(b, h, src, dh), g(b, h, src, dvh), bias, g(b, h, cap, dh), g(b, h, cap, dvh), n, g(b, h * dvh), g(d, h * dvh), g(d)]
    torch.testing.assert_close(torch.ops.fairseq_ext.compressed_attention_decode(*a), can_ref(*a), rtol=1e-4, atol=1e-3)
torch.cuda.synchronize(); print('memcheck shapes done')
" 2>&1 | tail -8
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "memcheck: FAILED or unsupported (see log)"; }
fi

echo "== benchmarks"
$PY benchmarks/sparse_ffn_speed.py --device cuda --name sparse_ffn_speed_cuda --out-dir "$out" || status=1
$PY benchmarks/sparse_ffn_speed.py --device cuda --dtype bfloat16 --name sparse_ffn_speed_cuda_bf16 --out-dir "$out" || status=1
$PY benchmarks/sparse_ffn_speed.py --device cuda --d-ff 49152 --blocks 64 --tokens 1,5 \
  --name sparse_ffn_speed_cuda_wide --out-dir "$out" || status=1
# one_wide_sparse_ffn_big's own controller (rank 64), the shape the models run on the GPU
$PY benchmarks/sparse_ffn_speed.py --device cuda --d-ff 49152 --blocks 64 --tokens 1,5 --lowrank 64 \
  --name sparse_ffn_speed_cuda_wide_r64 --out-dir "$out" || status=1
# the device tool returns at most 8 files: keep the JSON (each table is printed above and is
# `benchmarks/sparse_ffn_speed.py`'s table() of its JSON)
rm -f "$out"/*.md
exit $status
