"""Training throughput in fp32 vs bf16 autocast (`fairseq-train --bf16` on a CPU), through fairseq's own
Trainer (what fairseq-train runs: forward, backward, clipping, Adam), on real batches of a binarized corpus.

    python benchmarks/train_precision.py [--data DATA_BIN] [--models NAME=ARCH@FLAGS ...] [--threads N]
        [--batches 4] [--repeats 3] [--tokens 4096] [--bf16-products auto|fp32] [--name train_precision]

For each model two trainers are built from the same flags, one with --bf16; both train on the same batches,
interleaved (fp32, bf16, fp32, ... with a warm-up round), from the same initial weights. Reported: target
tokens/s of each (median over rounds) and the bf16/fp32 ratio per round (median, min-max). Default models:
the recipes' small dims (examples/small_dims.sh: 4+2 layers, d 256, FFN 1,024) for the baseline and each
main architecture. Default data: data/en-de-sample binarized into runs/bench-data (made once).
--bf16-products fp32 computes the bf16 products in fp32 from the bf16 values on any CPU (what --bf16 does on a
CPU without native bf16, fairseq_ext/precision.py); auto: natively where the CPU has native bf16.
Writes docs/benchmarks/<name>.{json,md}.
"""
import argparse
import copy
import os
import statistics
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

SMALL, SMALL_FFN = common.small_dims()

MODELS = [
    f"baseline=transformer@{SMALL} {SMALL_FFN}",
    f"one_wide_ffn=one_wide_ffn@{SMALL} {SMALL_FFN} --encoder-ffn-sharing shared --decoder-ffn-sharing none "
    "--encoder-shared-ffn-dim 6144",
    f"can=can_decoder@{SMALL} {SMALL_FFN} --can-value-dim 1024",
    f"sparse_ffn=scaling_sparse_ff@{SMALL} {SMALL_FFN} --sparse-ffn-block-size 64",
    f"sparse_ffn_qkv=scaling_sparse@{SMALL} --sparse-qkv-modules 4 --encoder-ffn-embed-dim 1344 "
    "--decoder-ffn-embed-dim 1344",
    f"sas=sas_block@{SMALL} {SMALL_FFN}",
]


def default_data():
    out = os.path.join(common.REPO, "runs", "bench-data")
    if not os.path.exists(os.path.join(out, "bin", ".done")):
        subprocess.run(["bash", os.path.join(common.REPO, "examples/data/binarize.sh"),
                        os.path.join(common.REPO, "data", "en-de-sample"), out], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(out, "bin")


def build_trainer(data, arch, flags, bf16, tokens):
    import fairseq_ext  # noqa: F401
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    argv = [data, "--user-dir", os.path.join(common.REPO, "fairseq_ext"), "--cpu", "--task", "translation",
            "--source-lang", "en", "--target-lang", "de", "--arch", arch, "--optimizer", "adam",
            "--adam-betas", "(0.9, 0.98)", "--lr", "1e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "500",
            "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1",
            "--max-tokens", str(tokens), "--seed", "1",
            *flags] + (["--bf16"] if bf16 else [])  # a spec's own flags last: they override (e.g. --optimizer)
    args = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion)), task


def run(models, data, batches, repeats, tokens, threads):
    result = {"kind": "train_precision", "settings": {"batches": batches, "repeats": repeats, "tokens": tokens,
                                                      "threads": threads, "data": os.path.relpath(data, common.REPO)},
              "machine": common.machine_info(threads), "models": {}}
    from fairseq_ext.precision import fp32_products
    from fairseq_ext.tools.precision import NATIVE_BF16_FLAGS, choose, cpu_flags

    result["precision_choice"] = choose()
    flags = cpu_flags()
    result["machine"]["bf16_flags"] = sorted(flags & NATIVE_BF16_FLAGS)
    result["machine"]["isa_flags"] = sorted(flags & (NATIVE_BF16_FLAGS | {"avx512f", "avx2"}))
    result["machine"]["bf16_products"] = "fp32" if fp32_products() else "native"
    for spec in models:
        name, model_spec = common.split_label(spec)
        arch, flags = common.split_spec(model_spec)
        fp32, task = build_trainer(data, arch, flags, False, tokens)
        bf16, _ = build_trainer(data, arch, flags, True, tokens)
        bf16.model.load_state_dict(copy.deepcopy(fp32.model.state_dict()))
        itr = fp32.get_train_iterator(epoch=1).next_epoch_itr(shuffle=True)
        sample = [next(itr) for _ in range(batches)]
        ntok = sum(s["ntokens"] for s in sample)

        def steps(trainer):
            def fn():
                for s in sample:
                    trainer.train_step([s])
            return fn

        times, order = common.interleaved({"fp32": steps(fp32), "bf16": steps(bf16)}, repeats, warmup=1)
        ratio = common.ratios(times, "bf16", "fp32")
        result["models"][name] = {
            "spec": model_spec, "params": common.count_parameters(fp32.model),
            "fp32_tokens_per_s": statistics.median(ntok / t for t in times["fp32"]),
            "bf16_tokens_per_s": statistics.median(ntok / t for t in times["bf16"]),
            "ratio": {**common.summary(ratio), "per_round": ratio}, "run_order": order}
        r = result["models"][name]
        print(f"{name}: fp32 {r['fp32_tokens_per_s']:.0f} tokens/s, bf16 {r['bf16_tokens_per_s']:.0f} "
              f"({r['ratio']['median']:.2f}x)", file=sys.stderr, flush=True)
    return result


def table(result):
    s, m = result["settings"], result["machine"]
    # the measuring machine's flags, as recorded (the table may be rendered elsewhere)
    flags = "+".join(sorted(set(m.get("isa_flags", m.get("bf16_flags", []))))) or "no AVX flags"
    rows = [[name, f"{r['params'] / 1e6:.2f}M", f"{r['fp32_tokens_per_s']:,.0f}", f"{r['bf16_tokens_per_s']:,.0f}",
             f"{r['ratio']['median']:.2f} ({r['ratio']['min']:.2f}–{r['ratio']['max']:.2f})"]
            for name, r in result["models"].items()]
    head = (f"Training step through fairseq's Trainer (forward, backward, Adam), fp32 vs bf16 autocast "
            f"(`--bf16` on CPU), {s['batches']} real batches of ≤ {s['tokens']} tokens ({s['data']}), "
            f"{s['repeats']} interleaved rounds, {s['threads']} thread(s), {m['processor']} ({flags}"
            + ("; no native bf16: its bf16 products computed in fp32" if m.get("bf16_products") == "fp32" else "")
            + f"); precision the recipes choose here: {result['precision_choice']['reason']}\n\n")
    return head + common.markdown_table(["model", "params", "fp32 tokens/s", "bf16 tokens/s", "bf16 / fp32 (min–max)"],
                                        rows)


def parser(doc, models, name):
    """The command line this benchmark and benchmarks/train_allocator.py share (models, data, batches, rounds)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="binarized translation data (default: data/en-de-sample, binarized once)")
    p.add_argument("--models", nargs="+", default=models, metavar="NAME=ARCH@FLAGS")
    p.add_argument("--baseline", help="with --candidates: the models are the baseline, then the candidates "
                                      "(benchmarks/run_presets.py's interface)")
    p.add_argument("--candidates", nargs="*", default=[])
    p.add_argument("--batches", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="1 batch of 512 tokens, 1 round: a smoke run")
    p.add_argument("--name", default=name)
    p.add_argument("--out-dir", default=common.DOCS)
    p.add_argument("--bf16-products", choices=["auto", "fp32"], default="auto",
                   help="fp32: bf16 products computed in fp32 even on a CPU with native bf16")
    return p


def settle(args):
    """--quick and --baseline/--candidates applied to the parsed arguments; the data (default_data unless
    --data) and the thread count (set)."""
    if args.quick:
        args.batches, args.repeats, args.tokens = 1, 1, 512
    if args.baseline:
        args.models = [args.baseline, *args.candidates]
    return args.data or default_data(), common.set_threads(args.threads)


def main(argv=None):
    args = parser(__doc__, MODELS, "train_precision").parse_args(argv)
    data, threads = settle(args)
    if args.bf16_products == "fp32":
        from fairseq_ext import precision

        precision.native_bf16 = lambda: False  # the path of a CPU without native bf16
    result = run(args.models, data, args.batches, args.repeats, args.tokens, threads)
    path = common.publish(args.name, result, table(result), args.out_dir)
    print(f"\nwrote {path} (+ .md)")
    return result


if __name__ == "__main__":
    main()
