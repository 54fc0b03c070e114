"""CPU training throughput with glibc's malloc vs tcmalloc (what examples/train.sh preloads when the machine has
libtcmalloc_minimal.so.4), through fairseq's own Trainer on real batches of a binarized corpus.

    python benchmarks/train_allocator.py [--data DATA_BIN] [--models NAME=ARCH@FLAGS ...] [--threads N]
        [--batches 4] [--repeats 3] [--tokens 4096] [--name train_allocator]

The allocator is chosen when a process starts (LD_PRELOAD), so each measurement is a child process: for each
model, rounds alternate glibc, tcmalloc, glibc, tcmalloc, ... (--repeats of each); every child builds the
trainer (same flags, seed 1, the precision the recipes choose on this machine), takes a warm-up pass over the
batches, then times one pass. Reported: target tokens/s of each (median over rounds) and the tcmalloc/glibc
ratio per round (median, min-max). Writes docs/benchmarks/<name>.{json,md}.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import train_precision  # noqa: E402

ALLOCATORS = ("glibc", "tcmalloc")


def tcmalloc_path():
    """The path of libtcmalloc_minimal.so.4 from the linker cache (what examples/device.sh preloads), or None."""
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == "libtcmalloc_minimal.so.4":
            return parts[-1]
    return None


def child(spec, data, batches, tokens, threads):
    """One measurement in this process: {"tokens": target tokens per pass, "seconds": one timed pass}."""
    common.set_threads(threads)
    from fairseq_ext.tools.precision import choose

    _, model_spec = common.split_label(spec)
    arch, flags = common.split_spec(model_spec)
    bf16 = "--bf16" in choose()["flag"].split()
    trainer, _ = train_precision.build_trainer(data, arch, flags, bf16, tokens)
    itr = trainer.get_train_iterator(epoch=1).next_epoch_itr(shuffle=True)
    sample = [next(itr) for _ in range(batches)]
    for s in sample:  # warm-up pass
        trainer.train_step([s])
    t = time.perf_counter()
    for s in sample:
        trainer.train_step([s])
    return {"tokens": sum(s["ntokens"] for s in sample), "seconds": time.perf_counter() - t,
            "params": common.count_parameters(trainer.model), "bf16": bf16}


def run(models, data, batches, repeats, tokens, threads):
    lib = tcmalloc_path()
    if lib is None:
        sys.exit("train_allocator: libtcmalloc_minimal.so.4 is not in the linker cache; install it "
                 "(Debian/Ubuntu: apt install libtcmalloc-minimal4) to compare")
    result = {"kind": "train_allocator", "tcmalloc": lib,
              "settings": {"batches": batches, "repeats": repeats, "tokens": tokens, "threads": threads,
                           "data": os.path.relpath(data, common.REPO)},
              "machine": common.machine_info(threads), "models": {}}
    for spec in models:
        name, model_spec = common.split_label(spec)
        times, info = {a: [] for a in ALLOCATORS}, None
        for r in range(repeats):
            for alloc in ALLOCATORS:
                env = dict(os.environ)
                env.pop("LD_PRELOAD", None)
                if alloc == "tcmalloc":
                    env["LD_PRELOAD"] = lib
                    env.setdefault("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD", str(1 << 40))
                out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", spec, "--data", data,
                                      "--batches", str(batches), "--tokens", str(tokens), "--threads", str(threads)],
                                     env=env, capture_output=True, text=True)
                if out.returncode:
                    sys.exit(f"train_allocator: the {alloc} child failed:\n{out.stderr[-3000:]}")
                info = json.loads(out.stdout.strip().splitlines()[-1])
                times[alloc].append(info["seconds"])
        ntok = info["tokens"]
        ratio = common.ratios(times, "tcmalloc", "glibc")
        result["models"][name] = {
            "spec": model_spec, "params": info["params"], "precision": "bf16" if info["bf16"] else "fp32",
            **{f"{a}_tokens_per_s": statistics.median(ntok / t for t in times[a]) for a in ALLOCATORS},
            "ratio": {**common.summary(ratio), "per_round": ratio}}
        m = result["models"][name]
        print(f"{name}: glibc {m['glibc_tokens_per_s']:.0f} tokens/s, tcmalloc {m['tcmalloc_tokens_per_s']:.0f} "
              f"({m['ratio']['median']:.2f}x)", file=sys.stderr, flush=True)
    return result


def table(result):
    s, m = result["settings"], result["machine"]
    rows = [[name, f"{r['params'] / 1e6:.2f}M", r["precision"], f"{r['glibc_tokens_per_s']:,.0f}",
             f"{r['tcmalloc_tokens_per_s']:,.0f}",
             f"{r['ratio']['median']:.2f} ({r['ratio']['min']:.2f}–{r['ratio']['max']:.2f})"]
            for name, r in result["models"].items()]
    head = (f"Training step through fairseq's Trainer (forward, backward, Adam) with glibc's malloc vs tcmalloc "
            f"(LD_PRELOAD, as examples/train.sh does), {s['batches']} real batches of ≤ {s['tokens']} tokens "
            f"({s['data']}), {s['repeats']} alternating rounds of one process each, {s['threads']} thread(s), "
            f"{m['processor']}\n\n")
    return head + common.markdown_table(["model", "params", "precision", "glibc tokens/s", "tcmalloc tokens/s",
                                         "tcmalloc / glibc (min–max)"], rows)


def main(argv=None):
    p = train_precision.parser(__doc__, train_precision.MODELS[:1], "train_allocator")
    p.add_argument("--child", metavar="SPEC", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.data, args.batches, args.tokens, args.threads)))
        return None
    data, threads = train_precision.settle(args)
    result = run(args.models, data, args.batches, args.repeats, args.tokens, threads)
    path = common.publish(args.name, result, table(result), args.out_dir)
    print(f"\nwrote {path} (+ .md)")
    return result


if __name__ == "__main__":
    main()
