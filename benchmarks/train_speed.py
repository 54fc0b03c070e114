"""Training throughput of registered archs: forward + backward + optimizer step on synthetic batches.

    python benchmarks/train_speed.py --baseline transformer --candidates transformer_balanced "arch@--flag v" "NAME=arch@..." \\
        [--tokens 4096] [--len 32] [--vocab 32000] [--threads N] [--repeats 5] [--quick]

Each step trains on the same random batch of a fixed token count (--tokens target tokens, sentences of
--len tokens on both sides; for a language-model arch, blocks of --len tokens) with fairseq's
label-smoothed cross-entropy and Adam, in train mode (dropout as the arch sets it). Models run interleaved (A B A B ..., warm-up first); reported: median
target tokens/s, ratio candidate/baseline per round (median, min-max), peak RSS increase during a
step, parameters. Writes docs/benchmarks/<name>.json and .md.
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from fairseq_ext.tools.params import is_language_model  # noqa: E402


def make_batch(tokens, length, vocab, eos, pad, seed, lm=False):
    """A translation batch (sources and targets of `length` tokens), or for a language model (lm=True)
    blocks of `length` tokens predicting the next token (--task language_modeling's batches)."""
    g = torch.Generator().manual_seed(seed)
    bsz = max(1, tokens // length)
    src = torch.randint(4, vocab, (bsz, length), generator=g)
    src[:, -1] = eos
    tgt = torch.randint(4, vocab, (bsz, length), generator=g)
    tgt[:, -1] = eos
    prev = torch.cat([torch.full((bsz, 1), eos), tgt[:, :-1]], dim=1)
    lengths = torch.full((bsz,), length, dtype=torch.long)
    net_input = {"src_tokens": prev, "src_lengths": lengths} if lm else \
        {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev}
    return {"net_input": net_input, "target": tgt, "ntokens": bsz * length, "nsentences": bsz}


def train_step_fn(model, task, sample, lr=1e-4, label_smoothing=0.1):
    from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    pad = task.target_dictionary.pad()

    def step():
        opt.zero_grad(set_to_none=True)
        net_output = model(**sample["net_input"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True).view(-1, net_output[0].size(-1))
        loss, _ = label_smoothed_nll_loss(lprobs, sample["target"].view(-1), label_smoothing, ignore_index=pad)
        loss.backward()
        opt.step()

    return step


def run(models, baseline, tokens, length, repeats, warmup, threads, seed=1, specs=None):
    """models: {name: (model, task)}; specs: {name: the spec it was built from} (default: the name)."""
    names = [baseline] + [n for n in models if n != baseline]
    result = {"kind": "train", "baseline": baseline,
              "settings": {"tokens": tokens, "len": length, "repeats": repeats, "warmup": warmup,
                           "threads": threads},
              "machine": common.machine_info(threads),
              "models": {n: {"params": common.count_parameters(models[n][0])} for n in names},
              "ratios": {}}
    fns, peaks = {}, {}
    for name in names:
        model, task = models[name]
        d = task.target_dictionary
        arch = common.split_spec((specs or {}).get(name, name))[0]
        sample = make_batch(tokens, length, len(d), d.eos(), d.pad(), seed, lm=is_language_model(arch))
        step = train_step_fn(model, task, sample)

        def fn(step=step, name=name):
            with common.PeakRSS() as mem:
                step()
            peaks[name] = max(peaks.get(name, 0), mem.peak - mem.start)

        fns[name] = fn
    times, order = common.interleaved(fns, repeats, warmup)
    result["run_order"] = order
    ntok = max(1, tokens // length) * length
    for name in names:
        result["models"][name].update({
            "seconds": times[name], "tokens_per_s": common.summary([ntok / t for t in times[name]]),
            "peak_rss_delta_mb": peaks[name] / 2**20})
    for name in names[1:]:
        r = common.ratios(times, name, baseline)
        result["ratios"][name] = {**common.summary(r), "per_round": r}
    return result


def table(result):
    rows = []
    for name, m in result["models"].items():
        ratio = result["ratios"].get(name)
        ratio_s = "1 (baseline)" if ratio is None else f"{ratio['median']:.2f} ({ratio['min']:.2f}–{ratio['max']:.2f})"
        rows.append([name, f"{m['params'] / 1e6:.1f}M", f"{m['tokens_per_s']['median']:.0f}", ratio_s,
                     f"{m['peak_rss_delta_mb']:.0f}"])
    s = result["settings"]
    head = (f"Training step (forward + backward + Adam): {s['tokens']} target tokens per batch, length "
            f"{s['len']}, {s['threads']} threads, {s['repeats']} interleaved rounds\n\n")
    return head + common.markdown_table(
        ["model", "params", "tokens/s", "speed vs baseline (min–max)", "peak RSS +MB"], rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", default="transformer")
    p.add_argument("--candidates", nargs="+", default=[])
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--len", type=int, default=32)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="2 rounds of 256-token batches: a smoke run")
    p.add_argument("--name", default="train_speed")
    p.add_argument("--out-dir", default=common.DOCS)
    args = p.parse_args(argv)
    if args.quick:
        args.repeats, args.tokens, args.len = 2, 256, 16
    threads = common.set_threads(args.threads)
    models, specs = {}, {}  # by name: 'NAME=MODEL' names a spec in the table
    for spec in [args.baseline] + args.candidates:
        name, specs[name] = common.split_label(spec)
        try:
            models[name] = common.build_model(specs[name], args.vocab)
        except KeyError:
            print(f"skipping {spec}: not a registered architecture (yet)", file=sys.stderr)
    baseline = common.split_label(args.baseline)[0]
    if baseline not in models:
        p.error(f"--baseline {args.baseline}: not a registered architecture")
    result = run(models, baseline, args.tokens, args.len, args.repeats, args.warmup, threads, specs=specs)
    path = common.publish(args.name, result, table(result), args.out_dir)
    print(f"\nwrote {path} (+ .md)")
    return result


if __name__ == "__main__":
    main()
