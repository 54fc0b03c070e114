"""fairseq_ext: efficient Transformer variants as a fairseq 0.12 plugin.

Install into an environment that already has torch and fairseq (see scripts/bootstrap.sh):

    pip install --no-build-isolation -e .

The C++ extension fairseq_ext._C is built from csrc/ against the installed torch. Kernels register
under torch.ops.fairseq_ext; every one has a PyTorch reference in fairseq_ext/ops/, so the package
works without the extension (FAIRSEQ_EXT_NO_BUILD=1 skips it). CUDA sources (csrc/cuda/*.cu and their
host sides csrc/cuda/*.cpp) are built only when the installed torch has CUDA; on CPU-only machines
tests/test_kernels.py compile-checks them (nvcc -c, c++ -fsyntax-only).
"""
import glob
import os

from setuptools import find_packages, setup

here = os.path.dirname(os.path.abspath(__file__))


def extensions():
    if os.environ.get("FAIRSEQ_EXT_NO_BUILD") == "1":
        return [], {}
    import torch
    from torch.utils.cpp_extension import BuildExtension, CppExtension, CUDAExtension

    rel = lambda paths: sorted(os.path.relpath(p, here) for p in paths)
    sources = rel(glob.glob(os.path.join(here, "csrc", "*.cpp")) + glob.glob(os.path.join(here, "csrc", "cpu", "*.cpp")))
    # csrc/cuda: kernels (*.cu, nvcc) and their host sides (*.cpp: checks, allocation, registration)
    cuda_sources = rel(glob.glob(os.path.join(here, "csrc", "cuda", "*.cu")) + glob.glob(os.path.join(here, "csrc", "cuda", "*.cpp")))
    # -O3 only: no -march=native, so a wheel built here runs on any x86-64 / aarch64 machine.
    # Vectorised kernels choose their ISA at run time (see csrc/README.md).
    # -fno-math-errno -fno-trapping-math as torch's own build: lets GCC vectorise floor/min/max in the
    # elementwise kernels (csrc/cpu/vec.h); neither flag reorders floating-point arithmetic.
    cxx = ["-O3", "-std=c++17", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
    define = [("FAIRSEQ_EXT_WITH_CUDA", "1")] if (torch.version.cuda and cuda_sources) else []
    kwargs = dict(
        name="fairseq_ext._C",
        include_dirs=[os.path.join(here, "csrc")],
        define_macros=define,
        extra_link_args=["-fopenmp"],
    )
    if define:
        ext = CUDAExtension(sources=sources + cuda_sources,
                            extra_compile_args={"cxx": cxx, "nvcc": ["-O3", "--use_fast_math"]}, **kwargs)
    else:
        ext = CppExtension(sources=sources, extra_compile_args=cxx, **kwargs)
    return [ext], {"build_ext": BuildExtension.with_options(use_ninja=True)}


ext_modules, cmdclass = extensions()

setup(
    name="fairseq_ext",
    version="0.1.0",
    description="Efficient Transformer variants (One Wide FFN, CAN, Scaling Transformer, SAS) for fairseq 0.12",
    packages=find_packages(include=["fairseq_ext", "fairseq_ext.*"]),
    python_requires=">=3.10",
    # torch and fairseq are installed by scripts/bootstrap.sh (torch pinned to the CPU wheel,
    # fairseq fork with --no-deps); listing them here would let pip resolve a CUDA torch.
    install_requires=[],
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    entry_points={
        "console_scripts": [
            "fairseq-ext-average-checkpoints = fairseq_ext.tools.average_checkpoints:main",
            "fairseq-ext-generate = fairseq_ext.decoding.generate:main",
        ]
    },
)
