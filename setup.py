"""fairseq_ext: efficient Transformer variants as a fairseq 0.12 plugin.

Into an environment that already has torch and fairseq (README, "Install into your environment"):

    pip install --no-build-isolation .                # + the C++ extension, built against that torch
    FAIRSEQ_EXT_NO_BUILD=1 pip install .              # PyTorch paths only, no compiler needed

The development install (scripts/bootstrap.sh) is `pip install --no-build-isolation --no-deps -e .`.

Requirements: torch >= 2.1 (tested 2.13) is declared, so pip leaves an installed torch alone (add --no-deps
to be sure). fairseq is deliberately not declared: the official fairseq 0.12.x does not import on Python
3.11, the fork `fairseq-fixed==0.12.3.1` does, and either one would pull torchaudio (and with it, perhaps,
another torch); install it yourself (`pip install --no-deps --no-build-isolation fairseq-fixed==0.12.3.1`
plus its runtime dependencies, as scripts/bootstrap.sh does).

The C++ extension fairseq_ext._C is built from csrc/ against the installed torch, which is why the build
needs --no-build-isolation (pip's isolated build environment has no torch; torch is deliberately not a
build requirement, which would download a CUDA torch to build against). Kernels register under
torch.ops.fairseq_ext; every one has a PyTorch reference in fairseq_ext/ops/, so the package works without
the extension (FAIRSEQ_EXT_NO_BUILD=1 skips it). CUDA sources (csrc/cuda/*.cu and their host sides
csrc/cuda/*.cpp) are built only when the installed torch has CUDA; on CPU-only machines
tests/test_kernels.py compile-checks them (nvcc -c, c++ -fsyntax-only).
"""
import glob
import os

from setuptools import find_packages, setup

here = os.path.dirname(os.path.abspath(__file__))
MIN_TORCH = (2, 1)


def _torch_for_build():
    """The installed torch, or a clear stop: the extension is compiled against it."""
    try:
        import torch
    except ImportError:
        raise SystemExit(
            "fairseq_ext: torch is not importable by this build, so the C++ extension cannot be compiled.\n"
            "  pip builds in an isolated environment without your torch unless told otherwise:\n"
            "    pip install --no-build-isolation .            (builds the extension against your torch)\n"
            "    FAIRSEQ_EXT_NO_BUILD=1 pip install .           (no extension: PyTorch paths only)\n"
            "  Without torch installed at all, install torch >= 2.1 first.") from None
    version = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2] if p.isdigit())
    if version < MIN_TORCH:
        raise SystemExit(f"fairseq_ext needs torch >= {'.'.join(map(str, MIN_TORCH))} (tested 2.13); "
                         f"this build sees torch {torch.__version__}")
    return torch


def extensions():
    if os.environ.get("FAIRSEQ_EXT_NO_BUILD") == "1":
        return [], {}
    torch = _torch_for_build()
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
    license="MIT",
    packages=find_packages(include=["fairseq_ext", "fairseq_ext.*"]),
    # tested on 3.11 (with fairseq-fixed 0.12.3.1); the official fairseq 0.12.2 imports only up to 3.10
    python_requires=">=3.10",
    # torch only, as a range: an installed torch >= 2.1 satisfies it and pip changes nothing (a missing or
    # older one would be resolved from PyPI: install torch yourself first). fairseq: see the docstring above.
    install_requires=["torch>=2.1"],
    extras_require={
        # benchmarks/: CTranslate2 is the fast decoding path's reference point (benchmarks/ct2.py); its own
        # requirements are numpy, pyyaml, setuptools (no torch). psutil: memory sampling; matplotlib: plots.
        "bench": ["ctranslate2>=4.8,<5", "pyyaml", "psutil", "matplotlib"],
        # the test suite (tests/ of the repository) and the data recipes it runs
        "test": ["pytest>=7", "pytest-xdist", "sentencepiece", "subword-nmt", "psutil", "matplotlib"],
        # examples/: tokenizers of examples/data/tokenize_corpus.py, plots of the study and analysis tools
        "recipes": ["sentencepiece", "subword-nmt", "matplotlib"],
        "lint": ["ruff>=0.4"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    entry_points={
        "console_scripts": [
            "fairseq-ext-average-checkpoints = fairseq_ext.tools.average_checkpoints:main",
            "fairseq-ext-generate = fairseq_ext.decoding.generate:main",
            # the folder to give fairseq's --user-dir (also: python -m fairseq_ext.path)
            "fairseq-ext-user-dir = fairseq_ext.path:main",
        ]
    },
)
