"""Decoding speed of registered archs (or checkpoints) with fairseq's own SequenceGenerator.

    python benchmarks/decode_speed.py --baseline transformer --candidates transformer_wmt_en_de_big \\
        [--batch-sizes 1 | sweep] [--beam 5] [--vocab 32000] [--threads N] [--repeats 5] [--quick]
    python benchmarks/decode_speed.py --baseline transformer_wmt_en_de_big \\
        --candidates transformer_wmt_en_de_big+fast transformer_wmt_en_de_big+int8 transformer_wmt_en_de_big+bf16
        (fairseq_ext's fast decoding path on the same model; on a copy with an int8 decoder; on a copy whose
        weights are rounded to bf16 and read as bf16: fairseq-ext-generate --bf16)
    python benchmarks/decode_speed.py --baseline transformer_wmt_en_de_big \
        --candidates transformer_wmt_en_de_big+ct2 transformer_wmt_en_de_big+ct2int8
        (the same model converted to CTranslate2, fp32 / int8: benchmarks/ct2.py; optional, skipped with a
        note when ctranslate2 is not installed)

Every model decodes the same random sources (fixed length) with a forced target length
(min_len = max_len), so all do the same number of steps; random weights (seeded) unless a model is
given as NAME=PATH.pt. Candidate and baseline run interleaved (A B A B ..., warm-up first); the table
gives median tokens/s, ms per step, the per-round ratio candidate/baseline (median, min-max), peak RSS,
parameters, and % of roofline: the bytes one step must read (decoder weights, the encoder's weights
amortised over the steps, the self- and cross-attention key/value caches) divided by the memory
bandwidth measured in the same run (common.measure_bandwidth: the faster of a matrix-vector product and a sum
over a 256 MB fp32 matrix), over the measured step time.
Writes docs/benchmarks/<name>.json and .png (tokens/s vs batch size), prints a markdown table.
"""
import argparse
import logging
import os
import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import ct2  # noqa: E402
from fairseq_ext.tools.params import decode_weight_split  # noqa: E402

SWEEP = [1, 2, 4, 8, 16, 32, 64]

# fairseq puts the root logger at DEBUG: keep matplotlib's import-time chatter out
logging.getLogger("matplotlib").setLevel(logging.WARNING)


def make_sample(bsz, src_len, vocab, eos, seed):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (bsz, src_len), generator=g)
    src[:, -1] = eos
    return {"id": torch.arange(bsz),
            "net_input": {"src_tokens": src, "src_lengths": torch.full((bsz,), src_len, dtype=torch.long)}}


# name suffixes: fairseq_ext's fast decoding path, in fp32 / with int8 decoder / with bf16 weights
FAST, INT8, BF16 = "+fast", "+int8", "+bf16"


def make_generator(model, task, beam, tgt_len, name=""):
    from fairseq.sequence_generator import SequenceGenerator

    from fairseq_ext.decoding.fast_generator import FastSequenceGenerator

    # forced length: eos is blocked before min_len and forced at max_len -> tgt_len tokens + eos
    kw = dict(beam_size=beam, max_len_a=0, max_len_b=tgt_len, min_len=tgt_len)
    if name.endswith(INT8):
        return FastSequenceGenerator([model], task.target_dictionary, int8=True, **kw)
    if name.endswith(BF16):
        return FastSequenceGenerator([model], task.target_dictionary, bf16=True, **kw)
    cls = FastSequenceGenerator if name.endswith(FAST) else SequenceGenerator
    return cls([model], task.target_dictionary, **kw)


def ct2_suffix(name):
    """The CTranslate2 suffix ("+ct2", "+ct2int8") a model name ends with, or None."""
    return next((s for s in ct2.SUFFIXES if name.endswith(s)), None)


def make_ct2_fn(worker, name, sample, task, beam, tgt_len, peaks):
    """A CTranslate2 decoding of `sample` (in its ct2.Worker process) doing fairseq's forced-length work:
    tgt_len + 1 steps (fairseq forces EOS at the last; CTranslate2 cannot, so it makes tgt_len + 1
    ordinary tokens). Records the worker's peak RSS growth in peaks[name]."""
    src = ct2.source_tokens(sample, task.source_dictionary)
    kw = dict(beam_size=beam, min_decoding_length=tgt_len + 1, max_decoding_length=tgt_len + 1)
    lengths = {len(h) for h in worker.translate(src, **kw)}
    if lengths != {tgt_len + 1}:
        raise RuntimeError(f"{name}: expected {tgt_len + 1} output tokens, got {lengths}")

    def fn():
        worker.translate(src, **kw)
        peaks[name] = max(peaks.get(name, 0), worker.peak_rss_delta)
    return fn


def bytes_per_step(model, bsz, beam, src_len, tgt_len):
    """Bytes a decoding step must read (fp32): the model's own estimate when it defines
    `decode_bytes_per_step`, else a standard encoder-decoder Transformer's, where a decoder module that
    reads only part of its weights per step says how much (`decode_weight_reads(tokens)`), and the
    weights that read the encoder output (tools.params.ONCE_PER_SENTENCE) are spread over the steps with the
    encoder's."""
    if hasattr(model, "decode_bytes_per_step"):
        return model.decode_bytes_per_step(bsz, beam, src_len, tgt_len)
    dec_params, enc_only = decode_weight_split(model)  # the cross-attention K/V projections: once per sentence
    for module in model.decoder.modules():  # modules that read only part of their weights (sparse FFN)
        if hasattr(module, "decode_weight_reads"):
            dec_params.update(module.decode_weight_reads(bsz * beam))
    dec = sum(dec_params.values())
    layers = len(getattr(model.decoder, "layers", []))
    d = model.decoder.embed_dim if hasattr(model.decoder, "embed_dim") else 0
    rows = bsz * beam
    avg_t = (tgt_len + 2) / 2  # tokens in the self-attention cache, averaged over the steps
    kv = 2 * layers * rows * d * (avg_t + src_len)  # self + cross attention keys and values
    return 4 * (dec + kv + enc_only / (tgt_len + 1))


class _UncountedOpsRefused(TorchDispatchMode):
    """Refuses ops whose arithmetic torch.utils.flop_counter does not count (this package's kernels,
    oneDNN's packed products), so a FLOP count cannot silently leave a product out."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in ("fairseq_ext", "mkldnn"):
            raise RuntimeError(f"{func} ran while counting FLOPs: the counter does not see its arithmetic")
        return func(*args, **(kwargs or {}))


def _cpu_attention_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs):
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query_shape, key_shape, value_shape)


# scaled_dot_product_attention's CPU kernel (the encoder's attention), which the counter has no formula for
_CPU_ATTENTION_FLOPS = {torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops}


def flops_per_step(model, task, bsz, beam, src_len, tgt_len):
    """Floating-point operations of one decoding step of `bsz` sentences, the encoder's spread over the steps:
    torch.utils.flop_counter's count (products, attention, convolutions) of one sentence decoded on the fast
    path in fp32 with its PyTorch references (FAIRSEQ_EXT_NO_KERNELS=1; products on F.linear, not on packed
    copies the counter cannot see; a top-1-of-N sparse FFN on its gather path: the chosen units' products),
    times bsz (every sentence does the same work at a forced length). The
    fast path's arithmetic is the model's without fairseq's repeats (fairseq computes the cross-attention's
    keys and values once per beam row, the fast path once per sentence), whatever kernel then runs it."""
    from torch.utils.flop_counter import FlopCounterMode

    from fairseq_ext.modules.sparse_feedforward import SparseFFNInput

    sample = make_sample(1, src_len, len(task.target_dictionary), task.target_dictionary.eos(), 1)
    gen = make_generator(model, task, beam, tgt_len, FAST)
    # a top-1-of-N FFN's arithmetic is its chosen units' (the gather path), whichever path runs it
    sparse = [m for m in model.modules() if isinstance(m, SparseFFNInput)]
    modes = [m.mode for m in sparse]
    for part, attr in ((gen.model, "encoder_packed"), (getattr(gen.model, "stepper", None), "packed")):
        if hasattr(part, attr):
            setattr(part, attr, False)
    try:
        for m in sparse:
            m.mode = "gather"
        with torch.inference_mode(), common.environment({"FAIRSEQ_EXT_NO_KERNELS": "1"}), \
                FlopCounterMode(display=False, custom_mapping=_CPU_ATTENTION_FLOPS) as counter, _UncountedOpsRefused():
            gen.generate([model], sample)
    finally:
        for m, mode in zip(sparse, modes):
            m.mode = mode
    return bsz * counter.get_total_flops() / (tgt_len + 1)


def int8_saving(model):
    """Bytes an int8 decoder does not read: 3 of the 4 bytes of every decoder nn.Linear weight (what
    `--int8` quantizes; the output projection included). Call before the model is quantized."""
    return 3 * sum(m.weight.numel() for m in model.decoder.modules() if isinstance(m, torch.nn.Linear))


def bf16_saving(gen):
    """Bytes a --bf16 step does not read: 2 of the 4 bytes of every weight its products read as bf16 (the
    copies the fast path's kernel made while decoding; the fused Q/K/V as the one copy it reads)."""
    model = gen.model
    stepper = getattr(model, "stepper", None)
    if stepper is not None:
        return 2 * sum(c[2].numel() for store in (stepper._bf16, stepper._bf16_rows) for c in store.values())
    weight = getattr(model, "output_weight", None)  # the generic mode: its output projection
    return 2 * weight.numel() if weight is not None else 0


def encoder_ms(model, sample, repeats=5, bf16=False):
    """Median milliseconds of the encoder over the sample's sources (run once per sentence in decoding;
    bf16: under bf16 autocast, as --bf16 runs it where the CPU's bf16 products are fast)."""
    import contextlib
    import time

    net = sample["net_input"]
    times = []
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.inference_mode(), autocast:
        model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])  # warm-up
        for _ in range(repeats):
            t = time.perf_counter()
            model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            times.append(1000 * (time.perf_counter() - t))
    return sorted(times)[len(times) // 2]


def with_peak_rss(decode, name, peaks):
    """decode() wrapped to record its peak RSS increase in peaks[name]."""
    def fn():
        with common.PeakRSS() as mem:
            decode()
        peaks[name] = max(peaks.get(name, 0), mem.peak - mem.start)
    return fn


def run(models, baseline, batch_sizes, beam, src_len, tgt_len, repeats, warmup, threads, seed=1):
    """models: {name: (model, task)}; returns the result dict (see module docstring)."""
    bandwidth = common.measure_bandwidth()
    names = [baseline] + [n for n in models if n != baseline]
    result = {"kind": "decode", "baseline": baseline,
              "settings": {"beam": beam, "src_len": src_len, "tgt_len": tgt_len, "repeats": repeats,
                           "vocab": len(models[baseline][1].target_dictionary),
                           "warmup": warmup, "batch_sizes": batch_sizes, "threads": threads},
              "machine": common.machine_info(threads), "bandwidth_gb_s": bandwidth / 1e9,
              "models": {n: {"params": common.count_parameters(models[n][0]), "results": {}} for n in names},
              "ratios": {}, "run_order": {}}
    workers = {}  # CTranslate2 models, one process each
    try:
        _run_batches(models, names, baseline, batch_sizes, beam, src_len, tgt_len, repeats, warmup, threads, seed,
                     result, workers)
    finally:
        for worker in workers.values():
            worker.close()
    return result


def _run_batches(models, names, baseline, batch_sizes, beam, src_len, tgt_len, repeats, warmup, threads, seed,
                 result, workers):
    bandwidth = result["bandwidth_gb_s"] * 1e9
    # bytes a step reads, taken before --int8 quantizes a decoder (int8: a quarter of its Linear weights'; the
    # CTranslate2 models read the same weights and caches as the fp32 model, or as the int8 decoder)
    step_bytes = {(name, bsz): bytes_per_step(models[name][0], bsz, beam, src_len, tgt_len)
                  - (int8_saving(models[name][0]) if name.endswith((INT8, "ct2int8")) else 0)
                  for name in names for bsz in batch_sizes}
    # arithmetic per step, counted once per distinct model (a +fast / +ct2 name shares its model's count)
    counted = {}
    for name in names:
        key = id(models[name][0])
        if key not in counted:
            counted[key] = flops_per_step(*models[name], 1, beam, src_len, tgt_len)
    step_flops = {name: counted[id(models[name][0])] for name in names}
    for bsz in batch_sizes:
        fns, peaks, enc_ms = {}, {}, {}
        for name in names:
            model, task = models[name]
            vocab = len(task.target_dictionary)
            sample = make_sample(bsz, src_len, vocab, task.target_dictionary.eos(), seed)
            if ct2_suffix(name):
                if name not in workers:  # converted here, run in its own process (benchmarks/ct2.py)
                    ctype = ct2.SUFFIXES[ct2_suffix(name)]
                    workers[name] = ct2.Worker(ct2.convert(model, task, ctype), ctype, threads)
                fns[name] = make_ct2_fn(workers[name], name, sample, task, beam, tgt_len, peaks)
                continue
            gen = make_generator(model, task, beam, tgt_len, name)
            hyps = gen.generate([model], sample)  # check the forced length once
            lengths = {len(h[0]["tokens"]) for h in hyps}
            if lengths != {tgt_len + 1}:
                raise RuntimeError(f"{name}: expected {tgt_len + 1} output tokens, got {lengths}")
            if name.endswith(BF16):
                step_bytes[name, bsz] -= bf16_saving(gen)
            enc_ms[name] = encoder_ms(model, sample, bf16=getattr(gen.model, "encoder_bf16", False))

            def decode(gen=gen, model=model, sample=sample):
                with torch.inference_mode():
                    gen.generate([model], sample)

            fns[name] = with_peak_rss(decode, name, peaks)
        times, order = common.interleaved(fns, repeats, warmup)
        result["run_order"][bsz] = order
        for name in names:
            model = models[name][0]
            steps = tgt_len + 1
            tok_s = [bsz * tgt_len / t for t in times[name]]
            ms_step = [1000 * t / steps for t in times[name]]
            nbytes = step_bytes[name, bsz]
            roof_ms = 1000 * nbytes / bandwidth
            med_ms = common.summary(ms_step)["median"]
            result["models"][name]["results"][bsz] = {
                "bytes_per_step": nbytes, "flops_per_step": bsz * step_flops[name], "encoder_ms": enc_ms.get(name),
                "seconds": times[name], "tokens_per_s": common.summary(tok_s),
                "ms_per_step": common.summary(ms_step), "peak_rss_delta_mb": peaks[name] / 2**20,
                "roofline_ms_per_step": roof_ms, "roofline_pct": 100 * roof_ms / med_ms}
        result["ratios"][bsz] = {}
        for name in names[1:]:
            r = common.ratios(times, name, baseline)
            result["ratios"][bsz][name] = {**common.summary(r), "per_round": r}


def table(result):
    base = result["baseline"]
    rows = []
    for bsz in result["settings"]["batch_sizes"]:
        for name, m in result["models"].items():
            r = m["results"][bsz]
            ratio = result["ratios"][bsz].get(name)
            ratio_s = "1 (baseline)" if name == base else f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})"
            rows.append([name, bsz, f"{m['params'] / 1e6:.1f}M", f"{r['tokens_per_s']['median']:.1f}",
                         f"{r['ms_per_step']['median']:.1f}", ratio_s, f"{r['roofline_pct']:.1f}%",
                         f"{r['peak_rss_delta_mb']:.1f}"])
    s = result["settings"]
    head = (f"Decoding: beam {s['beam']}, source {s['src_len']} tokens, {s['tgt_len']} forced target tokens, "
            f"{s['threads']} threads, {s['repeats']} interleaved rounds; measured bandwidth "
            f"{result['bandwidth_gb_s']:.1f} GB/s\n\n")
    return head + common.markdown_table(
        ["model", "batch", "params", "tokens/s", "ms/step", "speed vs baseline (min–max)", "% of roofline",
         "peak RSS +MB"], rows)


def plot(result, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    sizes = result["settings"]["batch_sizes"]
    for name, m in result["models"].items():
        ax.plot(sizes, [m["results"][b]["tokens_per_s"]["median"] for b in sizes], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (sentences)")
    ax.set_ylabel("tokens/s (median)")
    ax.set_title(f"fairseq SequenceGenerator, beam {result['settings']['beam']}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _same_model(base, models, vocab):
    """(model, task) of spec `base`: the one already parsed (shared), else built; None if unregistered."""
    name = common.split_label(base)[0]
    return models.get(name) or parse_models([base], vocab).get(name)


def parse_models(specs, vocab):
    """'arch', 'arch@FLAGS', 'path.pt', 'NAME=' before any of them (its name in the table), any of them +
    '+fast' (same model, fast decoding path), '+int8' (a copy whose decoder the fast path quantizes to
    int8), '+bf16' (a copy whose weights the fast path rounds to bf16 and reads as bf16) or '+ct2' / '+ct2int8' (the same model in CTranslate2, fp32 / int8) ->
    {name: (model, task)}; unregistered archs are skipped with a note."""
    models = {}
    for spec in specs:
        suffix = ct2_suffix(spec) or next((s for s in (FAST, INT8, BF16) if spec.endswith(s)), "")
        base = spec[: len(spec) - len(suffix)]
        name = common.split_label(base)[0] + suffix
        if suffix in ct2.SUFFIXES:  # the same model, converted to CTranslate2 when the run starts
            if not ct2.available():
                print(f"skipping {spec}: ctranslate2 is not installed (pip install ctranslate2)", file=sys.stderr)
                continue
            found = _same_model(base, models, vocab)
            reason = ct2.unsupported_reason(found[0]) if found is not None else "not built"
            if reason is not None:
                print(f"skipping {spec}: CTranslate2 cannot run it ({reason})", file=sys.stderr)
                continue
            models[name] = found
            continue
        if suffix == FAST:  # the same model (shared when also listed plainly), fast decoding path
            found = _same_model(base, models, vocab)
            if found is not None:
                models[name] = found
            continue
        if suffix in (INT8, BF16):  # its own copy (quantized / rounded in place by the generator), fast path
            found = parse_models([base], vocab)
            models.update({name: m for m in found.values()})
            continue
        model = common.split_label(spec)[1]
        if model.endswith(".pt") or os.path.isfile(model):
            models[name] = common.load_checkpoint_model(model)
            continue
        try:
            models[name] = common.build_model(model, vocab)
        except KeyError:
            print(f"skipping {spec}: not a registered architecture (yet)", file=sys.stderr)
    return models


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", default="transformer",
                   help="arch name, arch@FLAGS or checkpoint.pt, optionally NAME=... (its name in the table)")
    p.add_argument("--candidates", nargs="+", default=[],
                   help="arch names, arch@FLAGS (model flags, e.g. \"terraformer_base@--no-reversible\") or checkpoint.pt, "
                        "each optionally NAME=... (its name in the table) and +fast / +int8 / +bf16 / +ct2 / +ct2int8")
    p.add_argument("--vocab", type=int, default=32000, help="joint vocabulary size (random-weight models)")
    p.add_argument("--batch-sizes", default="1", help="comma list, or 'sweep' for 1,2,4,...,64")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=40)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: all cores)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2 rounds, short sequences: a smoke run")
    p.add_argument("--name", default="decode_speed", help="output file name under --out-dir")
    p.add_argument("--out-dir", default=common.DOCS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.src_len, args.tgt_len = 2, 8, 6
    batch_sizes = SWEEP if args.batch_sizes == "sweep" else [int(b) for b in args.batch_sizes.split(",")]
    threads = common.set_threads(args.threads)
    models = parse_models([args.baseline] + args.candidates, args.vocab)
    baseline = common.split_label(args.baseline)[0]
    if baseline not in models:
        p.error(f"--baseline {args.baseline}: not a registered architecture or checkpoint")
    result = run(models, baseline, batch_sizes, args.beam, args.src_len, args.tgt_len, args.repeats,
                 args.warmup, threads)
    for spec in [args.baseline] + args.candidates:  # each model's spec (arch@FLAGS or checkpoint), by its name
        name, model = common.split_label(spec)
        if name in result["models"]:
            result["models"][name]["spec"] = model
    path = common.publish(args.name, result, table(result), args.out_dir)
    plot(result, path[:-5] + ".png")
    print(f"\nwrote {path} (+ .md, .png)")
    return result


if __name__ == "__main__":
    main()
