"""The products of a batch-1 decoding step: F.linear, the few-rows kernel on row-major weights and on the
panel layout (`ops.few_rows_linear.pack_panels`), with float32 and bf16 weights (and bf16 products:
FAIRSEQ_EXT_BF16_PRODUCTS=1, where the CPU has AVX512_BF16), at the rows of a step.

    python benchmarks/few_rows_speed.py [--d-model 1024] [--d-ff 4096] [--vocab 32000] [--layers 6]
        [--rows 1,5] [--threads N] [--repeats 7] [--quick]

One timed call ("a step") runs x (rows, in) through every Linear weight of a Transformer decoder in order,
as a decoding step does: per layer Q/K/V (3d × d), the self-attention output, the cross-attention query and
output (d × d each), fc1 (d_ff × d) and fc2 (d × d_ff); then the output projection (V × d). Random weights,
several hundred MB, so they stream from memory. The same variant is then timed on one small weight read
over and over (it stays in the cores' caches): the rate at which it multiplies when memory is not the limit.
Rounds interleaved; the table gives ms per step, GB/s over the weight bytes, the speed against F.linear on
float32 weights, the in-cache rate in weights per second, and the two lower bounds of a step: the weights
at the in-cache rate (compute) and the weight bytes at the memory bandwidth measured in the same run.
Writes docs/benchmarks/<name>.json and .md.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

IN_CACHE_CALLS = 50  # calls per timing of the in-cache weight
IN_CACHE_ROWS = 384  # its shape: (384, d), 0.75 MB in float32 over 2 threads' L2


def variants(weights, biases):
    """{name: (dtype label, per-weight call list, environment)}: each entry calls one product per weight, with
    those environment variables set."""
    from fairseq_ext.ops.few_rows_linear import PANEL, pack_panels

    frl, packed = torch.ops.fairseq_ext.few_rows_linear.default, torch.ops.fairseq_ext.few_rows_linear_packed.default
    bf16 = [w.to(torch.bfloat16) for w in weights]
    panels_bf16 = [lambda x, p=pack_panels(w), n=w.size(0), b=b: packed(x, p, b, n, PANEL) for w, b in zip(bf16, biases)]
    products = {"FAIRSEQ_EXT_BF16_PRODUCTS": "1"}
    out = {"F.linear": ("float32", [lambda x, w=w, b=b: torch.nn.functional.linear(x, w, b)
                                    for w, b in zip(weights, biases)], {}),
           "kernel": ("float32", [lambda x, w=w, b=b: frl(x, w, b) for w, b in zip(weights, biases)], {}),
           "kernel, panels": ("float32", [lambda x, p=pack_panels(w), n=w.size(0), b=b: packed(x, p, b, n, PANEL)
                                          for w, b in zip(weights, biases)], {}),
           "kernel bf16": ("bf16", [lambda x, w=w, b=b: frl(x, w, b) for w, b in zip(bf16, biases)], {}),
           "kernel bf16, panels": ("bf16", panels_bf16, {}),
           "kernel bf16, panels, bf16 products": ("bf16", panels_bf16, products)}
    return out


def run(d, d_ff, vocab, layers, rows_list, repeats, threads):
    from fairseq_ext import ops

    from fairseq_ext.ops.few_rows_linear import bf16_dot

    if not ops.has_kernel("few_rows_linear_packed", "cpu"):
        raise SystemExit(f"the extension has no few_rows_linear_packed kernel: {ops.build_info()}")
    with common.environment({"FAIRSEQ_EXT_BF16_PRODUCTS": "1"}):
        bf16_products = bf16_dot()  # else that variant runs float32 products (the CPU has no AVX512_BF16)
    torch.manual_seed(1)
    bw = common.measure_bandwidth()
    shapes = [s for _ in range(layers) for s in ((3 * d, d), (d, d), (d, d), (d, d), (d_ff, d), (d, d_ff))]
    shapes.append((vocab, d))
    weights = [torch.randn(*s) * s[1] ** -0.5 for s in shapes]
    biases = [torch.randn(s[0]) for s in shapes]
    n_weights = sum(w.numel() for w in weights)
    step_fns = variants(weights, biases)
    small_w = torch.randn(IN_CACHE_ROWS, d) * d ** -0.5
    small_fns = variants([small_w], [torch.randn(IN_CACHE_ROWS)])
    result = {"kind": "few_rows", "settings": {"d_model": d, "d_ff": d_ff, "vocab": vocab, "layers": layers,
                                               "repeats": repeats, "threads": threads,
                                               "in_cache_weight": [IN_CACHE_ROWS, d], "in_cache_calls": IN_CACHE_CALLS},
              "machine": common.machine_info(threads), "bandwidth_gb_s": bw / 1e9, "weights": n_weights,
              "bf16_products": bf16_products, "rows": []}
    for rows in rows_list:
        xs = {k: torch.randn(rows, k) for k in {s[1] for s in shapes}}

        def step(calls, env):
            def fn():
                with torch.no_grad(), common.environment(env):
                    for call, w in zip(calls, weights):
                        call(xs[w.size(1)])
            return fn

        def in_cache(calls, env, x=torch.randn(rows, d)):
            def fn():
                with torch.no_grad(), common.environment(env):
                    for _ in range(IN_CACHE_CALLS):
                        calls[0](x)
            return fn

        times, _ = common.interleaved({k: step(c, e) for k, (_, c, e) in step_fns.items()}, repeats)
        cache_times, _ = common.interleaved({k: in_cache(c, e) for k, (_, c, e) in small_fns.items()}, repeats)
        for name, (dtype, _, _) in step_fns.items():
            t = common.summary(times[name])["median"]
            nbytes = n_weights * (2 if dtype == "bf16" else 4)
            rate = IN_CACHE_CALLS * small_w.numel() / common.summary(cache_times[name])["median"]  # weights/s
            result["rows"].append({
                "rows": rows, "variant": name, "weight_dtype": dtype, "ms_per_step": 1e3 * t,
                "gb_s": nbytes / t / 1e9, "speed_vs_f_linear": common.summary(common.ratios(times, name, "F.linear")),
                "in_cache_gweights_s": rate / 1e9, "compute_bound_ms": 1e3 * n_weights / rate,
                "memory_bound_ms": 1e3 * nbytes / bw})
    return result


def table(result):
    s = result["settings"]
    head = (f"{s['layers']} decoder layers, d_model {s['d_model']}, d_ff {s['d_ff']}, vocabulary {s['vocab']}: "
            f"{result['weights'] / 1e6:.0f}M weights per step; {s['threads']} threads, median of {s['repeats']} "
            f"interleaved rounds; in-cache rate: a ({s['in_cache_weight'][0]}, {s['in_cache_weight'][1]}) weight "
            f"{s['in_cache_calls']} times; measured bandwidth {result['bandwidth_gb_s']:.1f} GB/s; bf16 products "
            f"(`FAIRSEQ_EXT_BF16_PRODUCTS=1`) {'by AVX512_BF16' if result['bf16_products'] else 'not on this CPU'}\n\n")
    rows = []
    for r in result["rows"]:
        q = r["speed_vs_f_linear"]
        rows.append([str(r["rows"]), r["variant"], r["weight_dtype"], f"{r['ms_per_step']:.1f}", f"{r['gb_s']:.1f}",
                     f"{q['median']:.2f} ({q['min']:.2f}–{q['max']:.2f})", f"{r['in_cache_gweights_s']:.1f}",
                     f"{r['compute_bound_ms']:.1f}", f"{r['memory_bound_ms']:.1f}"])
    header = ["rows", "products", "weights", "ms per step", "GB/s", "speed vs F.linear float32 (min–max)",
              "in-cache G weights/s", "ms at the in-cache rate", "ms at the bandwidth"]
    return head + common.markdown_table(header, rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--d-ff", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--rows", default="1,5", help="rows of x per product (batch x beam)")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="small sizes, 2 rounds: a smoke run")
    p.add_argument("--name", default="few_rows_speed")
    p.add_argument("--out-dir", default=common.DOCS)
    a = p.parse_args(argv)
    if a.quick:
        a.d_model, a.d_ff, a.vocab, a.layers, a.repeats = 40, 72, 100, 2, 2
    threads = common.set_threads(a.threads)
    result = run(a.d_model, a.d_ff, a.vocab, a.layers, [int(r) for r in a.rows.split(",")], a.repeats, threads)
    path = common.publish(a.name, result, table(result), a.out_dir)
    print(f"\nwrote {path} (+ .md)")
    return result


if __name__ == "__main__":
    main()
