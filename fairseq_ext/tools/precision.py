"""Which training precision this machine should use, by measurement: the fairseq-train flag to add.

    python -m fairseq_ext.tools.precision          # prints --fp16, --bf16 or nothing; the reason on stderr
    python -m fairseq_ext.tools.precision --json   # {"flag": ..., "precision": ..., "reason": ...}

- a CUDA device: `--fp16` (fairseq's mixed precision with fp32 master weights and loss scaling);
- a CPU with native bf16 instructions (`avx512_bf16` or `amx_bf16` in /proc/cpuinfo's flags) on which a
  probe product (1,024 x 1,024 x 1,024, one thread, median of 5) runs at least MIN_SPEEDUP times faster
  in bf16 than in fp32: `--bf16`, which with this package means bf16 autocast with fp32 weights
  (fairseq_ext/precision.py);
- otherwise fp32 (no flag): a CPU without native bf16 has no faster product than fp32's (`--bf16` there computes
  its bf16 products in fp32, fairseq_ext/precision.py: the same speed at best).
The recipes ask this tool (examples/train.sh); PRECISION=fp32|bf16|fp16 overrides it.
"""
import argparse
import json
import statistics
import sys
import time

MIN_SPEEDUP = 1.3
PROBE = 1024
NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16"}  # /proc/cpuinfo flags of a CPU with native bf16 products


def cpu_flags():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_model():
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def probe_speedup(n=PROBE, repeats=5):
    """fp32 time / bf16 time of an n x n x n product on one thread (medians)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        times = {}
        for dtype in (torch.float32, torch.bfloat16):
            a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
            a @ b
            samples = []
            for _ in range(repeats):
                t = time.perf_counter()
                a @ b
                samples.append(time.perf_counter() - t)
            times[dtype] = statistics.median(samples)
        return times[torch.float32] / times[torch.bfloat16]
    finally:
        torch.set_num_threads(threads)


def choose():
    """{"flag": "--fp16" | "--bf16" | "", "precision": "fp16" | "bf16" | "fp32", "reason": text, ...}"""
    import torch

    if torch.cuda.is_available():
        return {"flag": "--fp16", "precision": "fp16",
                "reason": f"CUDA device {torch.cuda.get_device_name(0)}: fp16 mixed precision"}
    model = cpu_model()
    native = sorted(cpu_flags() & NATIVE_BF16_FLAGS)
    if not native:
        return {"flag": "", "precision": "fp32", "cpu": model,
                "reason": f"fp32: {model} has no native bf16 (neither avx512_bf16 nor amx_bf16 in its flags)"}
    speedup = probe_speedup()
    if speedup < MIN_SPEEDUP:
        return {"flag": "", "precision": "fp32", "cpu": model, "probe_speedup": round(speedup, 2),
                "reason": f"fp32: {model} has {'+'.join(native)} but a bf16 product ran only {speedup:.2f}x "
                          f"fp32's speed (needs {MIN_SPEEDUP}x)"}
    return {"flag": "--bf16", "precision": "bf16", "cpu": model, "probe_speedup": round(speedup, 2),
            "reason": f"bf16 autocast: {model} has {'+'.join(native)} and a bf16 product ran {speedup:.1f}x "
                      f"fp32's speed"}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the whole decision as JSON")
    args = p.parse_args(argv)
    decision = choose()
    if args.json:
        print(json.dumps(decision))
    else:
        print(decision["flag"])
        print(f"precision: {decision['reason']}", file=sys.stderr)


if __name__ == "__main__":
    main()
