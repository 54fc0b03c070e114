"""The top-1-of-N sparse FFN decoding op against the dense FFN of the same width (csrc issue).

    python benchmarks/sparse_ffn_speed.py [--d-model 1024] [--d-ff 4096] [--blocks 16,64,128]
        [--tokens 1,5] [--lowrank R] [--threads N] [--repeats 20] [--device cpu|cuda] [--dtype float32]
        [--quick]

For each N and token count, interleaved in one process: the dense FFN (ReLU(x·W1ᵀ + b1)·W2ᵀ + b2, two
torch GEMMs), the PyTorch gather reference (fairseq_ext/ops/sparse_ffn.py, copies the chosen rows) and
the compiled op (csrc/cpu/sparse_ffn.cpp or csrc/cuda/sparse_ffn.cu, reads them in place). Each timed
call is a loop of 50 calls (a decoding step is short; on a GPU the loop is timed with CUDA events, so
launch overhead counts as it does in decoding). Reports µs per call, speed vs dense, and the op's
achieved GB/s over the bytes it must read (chosen rows of W1 and W2, the controller C1, C2, c) against
the memory bandwidth measured in the same run. Writes docs/benchmarks/<name>.json and .md.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

INNER = 50


def run(d, d_ff, blocks, tokens_list, repeats, threads, device="cpu", dtype=torch.float32, lowrank=0):
    from fairseq_ext import ops
    from fairseq_ext.ops.sparse_ffn import sparse_ffn_decode_reference

    if not ops.extension_loaded():
        raise SystemExit(f"the compiled extension is not loaded: {ops.build_info()}")
    if not ops.has_kernel("sparse_ffn_decode", device):
        raise SystemExit(f"the extension has no {device} kernel: {ops.build_info()}")
    torch.manual_seed(1)
    bw = common.measure_bandwidth(2048 if device == "cuda" else 256, device=device)
    result = {"kind": "sparse_ffn", "settings": {"d_model": d, "d_ff": d_ff, "repeats": repeats,
                                                 "inner_calls": INNER, "threads": threads, "device": device,
                                                 "lowrank": lowrank or "d_ff/N",
                                                 "dtype": str(dtype).replace("torch.", "")},
              "machine": common.machine_info(threads, device), "bandwidth_gb_s": bw / 1e9, "rows": []}
    r = lambda *s, scale=1.0: (torch.randn(*s) * scale).to(device=device, dtype=dtype)
    w1, w2 = r(d_ff, d, scale=d ** -0.5), r(d_ff, d, scale=d ** -0.5)
    b1, b2 = r(d_ff), r(d)
    w2t = w2.t().contiguous()  # the dense FFN's own layout (nn.Linear: out x in)
    size = w1.element_size()
    for n in blocks:
        rank = lowrank or d_ff // n
        c1, c2, cb = r(rank, d), r(d_ff, rank), r(d_ff)
        for tokens in tokens_list:
            x = r(tokens, d)

            def loop(f):
                def fn():
                    def calls():
                        with torch.no_grad():
                            for _ in range(INNER):
                                f()
                    return common.device_timed(calls, device) / INNER
                return fn

            dense = lambda: torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(x, w1, b1)), w2t, b2)
            kernel = lambda: torch.ops.fairseq_ext.sparse_ffn_decode(x, c1, c2, cb, w1, w2, b2, n)
            fns = {
                "dense": loop(dense),
                "gather (PyTorch)": loop(lambda: sparse_ffn_decode_reference(x, c1, c2, cb, w1, w2, b2, n)),
                "kernel": loop(kernel),
            }
            if device == "cuda":  # the same calls replayed from a CUDA graph: GPU time without launch overhead
                fns["dense (graph)"], fns["kernel (graph)"] = graphed(dense), graphed(kernel)
            times, _ = common.interleaved(fns, repeats)
            rows_read = min(tokens * (d_ff // n), d_ff)
            op_bytes = size * (2 * rows_read * d + c1.numel() + c2.numel() + cb.numel())
            row = {"block_size": n, "tokens": tokens,
                   "us": {k: 1e6 * common.summary(v)["median"] for k, v in times.items()},
                   "speed_vs_dense": {k: common.summary(common.ratios(times, k, "dense")) for k in fns if k != "dense"},
                   "kernel_gb_s": op_bytes / common.summary(times["kernel"])["median"] / 1e9}
            if device == "cuda":
                row["graph_speed_vs_dense"] = common.summary(common.ratios(times, "kernel (graph)", "dense (graph)"))
                row["kernel_graph_gb_s"] = op_bytes / common.summary(times["kernel (graph)"])["median"] / 1e9
            result["rows"].append(row)
    return result


def graphed(f):
    """A timer of INNER calls of f captured once in a CUDA graph and replayed."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        for _ in range(3):
            f()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        for _ in range(INNER):
            f()
    return lambda: common.device_timed(graph.replay, "cuda") / INNER


def table(result):
    s = result["settings"]
    where = (f"{result['machine'].get('gpu', s.get('device', 'cpu'))}, {s.get('dtype', 'float32')}"
             if s.get("device", "cpu") != "cpu" else f"{s['threads']} threads")
    head = (f"d_model {s['d_model']}, d_ff {s['d_ff']}, {where}, median of {s['repeats']} interleaved "
            f"rounds of {s['inner_calls']} calls; measured bandwidth {result['bandwidth_gb_s']:.1f} GB/s\n\n")
    rows, graphs = [], "graph_speed_vs_dense" in result["rows"][0]
    for r in result["rows"]:
        g, k = r["speed_vs_dense"]["gather (PyTorch)"], r["speed_vs_dense"]["kernel"]
        rows.append([str(r["block_size"]), str(r["tokens"]), f"{r['us']['dense']:.0f}", f"{r['us']['gather (PyTorch)']:.0f}",
                     f"{r['us']['kernel']:.0f}", f"{g['median']:.2f}",
                     f"{k['median']:.2f} ({k['min']:.2f}–{k['max']:.2f})", f"{r['kernel_gb_s']:.1f}"])
        if graphs:
            gr = r["graph_speed_vs_dense"]
            rows[-1] += [f"{r['us']['dense (graph)']:.1f}", f"{r['us']['kernel (graph)']:.1f}",
                         f"{gr['median']:.2f} ({gr['min']:.2f}–{gr['max']:.2f})", f"{r['kernel_graph_gb_s']:.0f}"]
    header = ["N", "tokens", "dense µs", "gather µs", "kernel µs", "gather vs dense", "kernel vs dense (min–max)",
              "kernel GB/s"]
    if graphs:
        header += ["dense µs (graph)", "kernel µs (graph)", "kernel vs dense (graph)", "kernel GB/s (graph)"]
        head += ("(graph): the same calls replayed from a CUDA graph, i.e. GPU time without the launch and "
                 "dispatch overhead that dominates eager calls at this size.\n\n")
    return head + common.markdown_table(header, rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--d-ff", type=int, default=4096)
    p.add_argument("--blocks", default="16,64,128")
    p.add_argument("--tokens", default="1,5")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--device", default="cpu", help="cpu or cuda (needs a build against a CUDA torch)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"])
    p.add_argument("--lowrank", type=int, default=0,
                   help="controller rank d_lowrank (0: d_ff/N, the module's default; one_wide_sparse_ffn_big uses 64)")
    p.add_argument("--quick", action="store_true", help="small sizes, 2 rounds: a smoke run")
    p.add_argument("--name", default="sparse_ffn_speed")
    p.add_argument("--out-dir", default=common.DOCS)
    a = p.parse_args(argv)
    if a.quick:
        a.d_model, a.d_ff, a.blocks, a.tokens, a.repeats = 64, 256, "16", "1,5", 2
    threads = common.set_threads(a.threads)
    result = run(a.d_model, a.d_ff, [int(b) for b in a.blocks.split(",")], [int(t) for t in a.tokens.split(",")],
                 a.repeats, threads, a.device, getattr(torch, a.dtype), a.lowrank)
    path = common.publish(a.name, result, table(result), a.out_dir)
    print(f"\nwrote {path} (+ .md)")
    return result


if __name__ == "__main__":
    main()
