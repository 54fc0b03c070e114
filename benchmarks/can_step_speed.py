"""One decoding step of a CAN decoder sub-layer (CompressedAttention, Eq. 11 + 13), three ways (op:
csrc/README.md).

    python benchmarks/can_step_speed.py [--d-model 512] [--heads 8] [--value-dim 2048] [--src-len 30]
        [--steps 40] [--beam 5] [--threads N] [--repeats 20] [--quick]

Each timed call decodes `--steps` tokens one by one through one sub-layer with an incremental state (as
beam search does, reordering the beam each step), interleaved in one process:
  general   the module's general path: caches grown by concatenation, scores concatenated, softmax,
            split, two matmuls, ReLU, fc2 (what every step did before the decoding op existed);
  reference the decoding path with a preallocated cache and ops.compressed_attention_decode's PyTorch
            reference (FAIRSEQ_EXT_NO_KERNELS=1);
  kernel    the same with the compiled op (csrc/cpu/compressed_attention.cpp).
Reports µs per token step and speed vs the general path. Writes docs/benchmarks/<name>.json and .md.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def run(d, heads, dv, src_len, steps, beam, repeats, threads):
    from fairseq_ext import ops
    from fairseq_ext.modules.compressed_attention import CompressedAttention

    if not ops.has_kernel("compressed_attention_decode", "cpu"):
        raise SystemExit(f"the extension has no compressed_attention_decode kernel: {ops.build_info()}")
    torch.manual_seed(1)
    m = CompressedAttention(d, heads, dv).eval()
    enc = torch.randn(src_len, beam, d)
    pad = torch.zeros(beam, src_len, dtype=torch.bool)
    xs = torch.randn(steps, 1, beam, d)
    order = torch.arange(beam).flip(0)  # a beam reorder every step (rows swap), as beam search does

    def decode(general, kernels):
        def fn():
            os.environ["FAIRSEQ_EXT_NO_KERNELS"] = "0" if kernels else "1"
            if general:  # the general path: the decoding path declines every step
                m._decode_step_applies = lambda *a: False
            else:
                m.__dict__.pop("_decode_step_applies", None)
            state = {}
            t = time.perf_counter()
            with torch.no_grad():
                for x in xs:
                    m(x, enc, pad, incremental_state=state)
                    m.reorder_incremental_state(state, order)
            return (time.perf_counter() - t) / steps
        return fn

    fns = {"general": decode(True, False), "reference": decode(False, False), "kernel": decode(False, True)}
    with common.environment({"FAIRSEQ_EXT_NO_KERNELS": "1"}):  # each round sets its own; the caller's comes back
        times, _ = common.interleaved(fns, repeats)
    return {"kind": "can_step", "settings": {"d_model": d, "heads": heads, "value_dim": dv, "src_len": src_len,
                                             "steps": steps, "beam": beam, "repeats": repeats, "threads": threads},
            "machine": common.machine_info(threads),
            "us_per_step": {k: 1e6 * common.summary(v)["median"] for k, v in times.items()},
            "speed_vs_general": {k: common.summary(common.ratios(times, k, "general")) for k in ("reference", "kernel")}}


def table(r):
    s = r["settings"]
    head = (f"CAN sub-layer decoding step: d_model {s['d_model']}, {s['heads']} heads, d_v {s['value_dim']}, "
            f"source {s['src_len']}, {s['steps']} steps, beam {s['beam']}, {s['threads']} threads, median of "
            f"{s['repeats']} interleaved rounds\n\n")
    rows = [["general (concatenated caches)", f"{r['us_per_step']['general']:.0f}", "1 (baseline)"]]
    for k, label in (("reference", "decoding path, PyTorch reference"), ("kernel", "decoding path, csrc kernel")):
        g = r["speed_vs_general"][k]
        rows.append([label, f"{r['us_per_step'][k]:.0f}", f"{g['median']:.2f} ({g['min']:.2f}–{g['max']:.2f})"])
    return head + common.markdown_table(["path", "µs per step", "speed vs general (min–max)"], rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--value-dim", type=int, default=2048)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--quick", action="store_true", help="small sizes, 2 rounds: a smoke run")
    p.add_argument("--name", default="can_step_speed")
    p.add_argument("--out-dir", default=common.DOCS)
    a = p.parse_args(argv)
    if a.quick:
        a.d_model, a.heads, a.value_dim, a.src_len, a.steps, a.repeats = 32, 2, 64, 7, 5, 2
    threads = common.set_threads(a.threads)
    result = run(a.d_model, a.heads, a.value_dim, a.src_len, a.steps, a.beam, a.repeats, threads)
    path = common.publish(a.name, result, table(result), a.out_dir)
    print(f"\nwrote {path} (+ .md)")
    return result


if __name__ == "__main__":
    main()
