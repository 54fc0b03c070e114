"""Where a decoding step's time goes on the fast path: products, attention, other ops, and the time outside
any op (Python and the dispatcher), per part of the step.

    python benchmarks/step_profile.py [--models transformer_wmt_en_de_big+fast transformer_wmt_en_de_big+bf16 ...]
        [--batch 1] [--beam 5] [--vocab 32000] [--threads N] [--repeats 5] [--quick]

Each model (decode_speed.py's specs: arch+fast / +bf16 / +int8, random weights at the arch's dims) decodes the
same forced-length batch as decode_speed.py. Its ms per step is the median of `--repeats` timed decodes; one
more decode runs under torch.profiler with every part of the step in a labelled scope (the encoder; the
decoder layers; the rest of the stepper's step: embedding, final LayerNorm, output projection; the
log-softmax; the cache reorders; beam search, the rest of the decode). Each op's self time goes to its part
and to a kind of call:
- products: the weight products (few-rows kernel, int8 kernel, sparse FFN op, oneDNN / BLAS products,
  convolutions);
- attention: the attention over the caches (bmm, softmax, SDPA; CAN's fused op, which also holds the
  second FFN layer's product);
- other ops: every other op (LayerNorm, additions, copies, indexing, top-k ...);
- Python + dispatch: time in a part outside every op (the profiler's scopes measure it).
The shares are of the profiled decode (the profiler adds a few microseconds per op: its wall time is given
beside the unprofiled one); the ms columns apply them to the unprofiled ms per step. Roofline: the bytes a
step reads (decode_speed.bytes_per_step) at the bandwidth measured in the same run. Writes
docs/benchmarks/<name>.json and .md.
"""
import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import decode_speed  # noqa: E402

PARTS = ["encoder", "decoder layers", "embedding + output layer", "log-softmax", "cache reorder", "beam search"]
KINDS = ["products", "attention", "other ops", "Python + dispatch"]
PRODUCT_OPS = ("aten::addmm", "aten::mm", "aten::linear", "aten::conv1d", "aten::convolution", "aten::_convolution",
               "aten::mkldnn_convolution", "aten::_mkldnn_linear", "aten::baddbmm")
ATTENTION_OPS = ("aten::bmm", "aten::_softmax", "aten::softmax", "aten::scaled_dot_product_attention",
                 "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_safe_softmax")
SCOPE = "step_profile:"


def kind_of(name):
    """The kind of call of a profiled op's name (see the module docstring)."""
    if name.startswith("mkldnn::") or name in PRODUCT_OPS:
        return "products"
    if name.startswith("fairseq_ext::"):
        return "attention" if "compressed_attention" in name else "products"
    if name in ATTENTION_OPS:
        return "attention"
    return "other ops"


def _scoped(label, fn):
    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(SCOPE + label):
            return fn(*args, **kwargs)
    return wrapped


def instrument(gen):
    """Label the parts of the decode on this generator's instances (no effect outside the profiler)."""
    ens, stepper = gen.model, gen.model.stepper
    ens.forward_encoder = _scoped("encoder", ens.forward_encoder)
    ens.forward_decoder = _scoped("log-softmax", ens.forward_decoder)  # minus the step inside it
    stepper.step = _scoped("embedding + output layer", stepper.step)  # minus the layers inside it
    stepper.reorder = _scoped("cache reorder", stepper.reorder)
    for name in ("_layer", "_attention_swap", "_ffn_swap"):
        if hasattr(stepper, name):
            setattr(stepper, name, _scoped("decoder layers", getattr(stepper, name)))


def attribute(events):
    """{(part, kind): microseconds} over a profiled decode's event tree."""
    out = {}

    def walk(ev, part):
        if ev.name.startswith(SCOPE):
            part = ev.name[len(SCOPE):]
            kind = "Python + dispatch"
        else:
            kind = kind_of(ev.name)
        out[part, kind] = out.get((part, kind), 0.0) + ev.self_cpu_time_total
        for child in ev.cpu_children:
            walk(child, part)

    for ev in events:
        if ev.cpu_parent is None:
            walk(ev, "beam search")
    return out


def profile_model(name, model, task, bsz, beam, src_len, tgt_len, repeats, bandwidth, seed=1):
    sample = decode_speed.make_sample(bsz, src_len, len(task.target_dictionary), task.target_dictionary.eos(), seed)
    # the bytes a step reads, as decode_speed counts them (int8: taken before the generator quantizes the copy)
    nbytes = decode_speed.bytes_per_step(model, bsz, beam, src_len, tgt_len)
    if name.endswith(decode_speed.INT8):
        nbytes -= decode_speed.int8_saving(model)
    gen = decode_speed.make_generator(model, task, beam, tgt_len, name)
    if not hasattr(gen.model, "stepper"):
        raise ValueError(f"{name}: not on a fast-path stepper (step_profile profiles +fast / +bf16 / +int8 names)")
    steps = tgt_len + 1
    with torch.inference_mode():
        # a warm-up decode first (--bf16 prepares its weights' copies in it), then `repeats` timed ones
        def decode():
            gen.generate([model], sample)  # (returns None: interleaved times the call)

        times = common.interleaved({name: decode}, repeats)[0][name]
        if name.endswith(decode_speed.BF16):
            nbytes -= decode_speed.bf16_saving(gen)
        instrument(gen)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            t = time.perf_counter()
            with torch.profiler.record_function(SCOPE + "beam search"):
                gen.generate([model], sample)
            profiled = time.perf_counter() - t
    us = attribute(prof.events())
    total = sum(us.values())
    ms_step = 1000 * statistics.median(times) / steps
    share = {f"{p}|{k}": v / total for (p, k), v in us.items()}
    return {"ms_per_step": ms_step, "ms_per_step_profiled": 1000 * profiled / steps, "bytes_per_step": nbytes,
            "roofline_ms_per_step": 1000 * nbytes / bandwidth, "profiled_ms_attributed": total / 1000, "share": share}


def run(specs, bsz, beam, src_len, tgt_len, vocab, repeats, threads):
    bandwidth = common.measure_bandwidth()
    models = decode_speed.parse_models(specs, vocab)
    result = {"kind": "step_profile", "settings": {"batch": bsz, "beam": beam, "src_len": src_len, "tgt_len": tgt_len,
                                                   "vocab": vocab, "repeats": repeats, "threads": threads},
              "machine": common.machine_info(threads), "bandwidth_gb_s": bandwidth / 1e9, "models": {}}
    for name, (model, task) in models.items():
        result["models"][name] = profile_model(name, model, task, bsz, beam, src_len, tgt_len, repeats, bandwidth)
    return result


def _sum(share, part=None, kind=None):
    return sum(v for key, v in share.items()
               if (part is None or key.split("|")[0] == part) and (kind is None or key.split("|")[1] == kind))


def table(result):
    s = result["settings"]
    head = (f"batch {s['batch']}, beam {s['beam']}, source {s['src_len']} tokens, {s['tgt_len']} target tokens, "
            f"vocabulary {s['vocab']}, {s['threads']} threads; ms per step: median of {s['repeats']} decodes; "
            f"shares: one profiled decode; roofline at the measured bandwidth {result['bandwidth_gb_s']:.1f} GB/s\n\n")
    rows_kind, rows_part = [], []
    for name, m in result["models"].items():
        ms, sh = m["ms_per_step"], m["share"]
        lead = [name, f"{ms:.1f}", f"{m['roofline_ms_per_step']:.1f}"]
        rows_kind.append(lead + [f"{ms * _sum(sh, kind=k):.1f} ({100 * _sum(sh, kind=k):.0f}%)" for k in KINDS]
                         + [f"{m['ms_per_step_profiled']:.1f}"])
        rows_part.append([name] + [f"{ms * _sum(sh, part=p):.1f} ({100 * _sum(sh, part=p):.0f}%)" for p in PARTS]
                         + [f"{100 * _sum(sh, part='decoder layers', kind='Python + dispatch') / max(1e-9, _sum(sh, part='decoder layers')):.0f}%"])
    by_kind = common.markdown_table(["model", "ms/step", "roofline ms/step"] + [f"{k} ms" for k in KINDS]
                                    + ["ms/step profiled"], rows_kind)
    by_part = common.markdown_table(["model"] + [f"{p} ms" for p in PARTS]
                                    + ["decoder layers: Python + dispatch share"], rows_part)
    return head + "By kind of call:\n\n" + by_kind + "\n\nBy part of the step:\n\n" + by_part


DEFAULT_MODELS = ["transformer_wmt_en_de_big+fast", "transformer_wmt_en_de_big+bf16", "transformer_wmt_en_de_big+int8",
                  "one_wide_ffn_big+fast", "scaling_sparse+fast", "transformer_balanced+fast", "can_decoder+fast",
                  "transformer+fast", "sas_block+fast", "terraformer+fast"]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", help="decode_speed.py specs ending in +fast / +bf16 / +int8 (default: "
                   + " ".join(DEFAULT_MODELS) + "; --quick: transformer+fast can_decoder+fast)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--src-len", type=int, default=30)
    p.add_argument("--tgt-len", type=int, default=40)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="two small models, short sequences: a smoke run")
    p.add_argument("--name", default="step_profile")
    p.add_argument("--out-dir", default=common.DOCS)
    a = p.parse_args(argv)
    if a.quick:
        a.src_len, a.tgt_len, a.vocab, a.repeats = 8, 6, 1000, 2
    a.models = a.models or (["transformer+fast", "can_decoder+fast"] if a.quick else DEFAULT_MODELS)
    bad = [m for m in a.models if not m.endswith((decode_speed.FAST, decode_speed.BF16, decode_speed.INT8))]
    if bad:
        p.error(f"--models {' '.join(bad)}: profile the fast path; end each spec in +fast, +bf16 or +int8")
    threads = common.set_threads(a.threads)
    result = run(a.models, a.batch, a.beam, a.src_len, a.tgt_len, a.vocab, a.repeats, threads)
    path = common.publish(a.name, result, table(result), a.out_dir)
    print(f"\nwrote {path} (+ .md)")
    return result


if __name__ == "__main__":
    main()
