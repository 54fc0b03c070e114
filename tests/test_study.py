"""The reproduction study's command end to end on its tiny protocol (fairseq_ext/tools/study.py): two
models (the baseline and One Wide FFN), two learning rates, two seeds; the first sitting is killed inside
the first run, the second resumes and finishes every planned run, a third has nothing to do, and the
generated table is checked against the run files."""
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time

import pytest
import torch

from conftest import REPO, clean_env, run


def _study(out, corpus, results):
    return [sys.executable, "-m", "fairseq_ext.tools.study", "run", str(out), "--protocol", "tiny", "--corpus",
            str(corpus), "--configs", "one_wide_ffn", "--publish", str(results / "runs")]


@pytest.mark.heavy(6)
def test_study_runs_resumes_and_tabulates(tiny_data, tmp_path):
    corpus, out, results = tiny_data.parent / "corpus", tmp_path / "study", tmp_path / "results"
    results.mkdir()
    (results / "README.md").write_text("# Results\n\n<!-- study:results:begin -->\n<!-- study:results:end -->\n")
    first = out / "runs" / "baseline-lr3e-3-s1"

    # sitting 1: killed (the whole process group, as a lost session) once the first run has a checkpoint
    with open(tmp_path / "sitting1.log", "w") as log:
        p = subprocess.Popen(_study(out, corpus, results), cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"),
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 600
        while not (first / "checkpoint_last.pt").exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert (first / "checkpoint_last.pt").exists(), open(tmp_path / "sitting1.log").read()[-3000:]
    assert not (out / "results" / "baseline-lr3e-3-s1.json").exists()

    # sitting 2: two processes side by side (one per core) resume the killed run (its lock is stale) and
    # carry out the whole plan, each claiming other runs
    procs = [subprocess.Popen(_study(out, corpus, results), cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=1200)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][-3000:] + outs[1][-3000:]
    second = outs[0] + outs[1]
    assert all("run " in o for o in outs), "one process trained nothing"
    assert "run baseline-lr3e-3-s1" in second
    train_log = (first / "train.log").read_text()
    assert train_log.count("Loaded checkpoint") >= 1 and "epoch 2" in second, second[-3000:]
    planned = {"baseline-lr3e-3-s1", "baseline-lr6e-3-s1", "baseline-lr{lr}-s2", "one_wide_ffn-lr{lr}-s1",
               "one_wide_ffn-lr{lr}-s2", "one_wide_ffn-lr{other}-s1"}
    runs = {f[:-5]: json.loads((results / "runs" / f).read_text()) for f in os.listdir(results / "runs")}
    sweep = {lr: runs[f"baseline-lr{lr}-s1"]["valid_loss"] for lr in ("3e-3", "6e-3")}
    lr = min(sweep, key=sweep.get)  # chosen on the validation set
    other = "6e-3" if lr == "3e-3" else "3e-3"
    assert set(runs) == {n.format(lr=lr, other=other) for n in planned}, sorted(runs)
    for name in runs:  # each run trained by one process
        assert second.count(f"run {name} (") == 1, (name, second[-4000:])
    for name, r in runs.items():
        assert r["epochs"] == 2 and r["stopped_by"] == "max_epochs" and not r["converged"], (name, r)
        assert 0 <= r["bleu"] <= 100 and r["parameters"] > 0 and r["averaged_checkpoints"] == 2
        assert r["valid_curve"][-1][0] == r["updates"]
        assert (out / "results" / f"{name}.json").read_text() == (results / "runs" / f"{name}.json").read_text()

    # the median-BLEU seed of each complete configuration, shipped as make demo expects it
    from fairseq_ext.compat import load_checkpoint

    shipped = tmp_path / "shipped"
    run([sys.executable, "-m", "fairseq_ext.tools.study", "ship", "--study", str(out), "--results", str(results),
         "--out", str(shipped), "--protocol", "tiny"])
    for config in ("baseline", "one_wide_ffn"):
        seeds = sorted((r for r in runs.values() if r["config"] == config and r["lr"] == lr),
                       key=lambda r: (r["bleu"], r["seed"]))
        assert len(seeds) == 2
        folder = shipped / f"study-{config}"
        assert json.loads((folder / "score.json").read_text())["name"] == seeds[0]["name"]  # the lower middle
        run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=folder)
        state = load_checkpoint(str(folder / "checkpoint.pt"))  # weights_only=True, the plugin's safe globals
        assert "last_optimizer_state" not in state and state["model"]
        assert all(v.dtype == torch.float16 for v in state["model"].values() if v.is_floating_point())
        assert "| valid | " in (folder / "train.log").read_text() and seeds[0]["name"] in (folder / "README.md").read_text()

    # a chosen run whose model is gone (it finished on another machine) is an error naming --retrain; with it,
    # the run trains again from the same settings and seed and reproduces the committed curve and scores
    from fairseq_ext.tools.study_ship import REPRODUCED

    median = json.loads((shipped / "study-baseline" / "score.json").read_text())["name"]
    ship = [sys.executable, "-m", "fairseq_ext.tools.study", "ship", "--study", str(out), "--results", str(results),
            "--out", str(shipped), "--protocol", "tiny"]
    # a folder that holds its chosen run already (name, checksums) is kept, even with the run's model gone
    shutil.rmtree(out / "runs" / median)
    kept = run(ship).stdout
    assert f"baseline: {median} is shipped in" in kept and "one_wide_ffn: " in kept and "kept as it is" in kept, kept
    with open(shipped / "study-baseline" / "dict.de.txt", "a") as f:
        f.write("changed 1\n")  # no longer what SHA256SUMS says: shipped again, which needs the model
    missing = subprocess.run(ship, cwd=REPO, env=clean_env(), capture_output=True, text=True)
    assert missing.returncode != 0 and median in missing.stderr and "--retrain" in missing.stderr, missing.stderr
    again = run(ship + ["--retrain", "--corpus", str(corpus)], OMP_NUM_THREADS="1").stdout
    assert f"{median}: trained again; identical to the committed run" in again, again[-3000:]
    score = json.loads((shipped / "study-baseline" / "score.json").read_text())
    assert all(score[k] == runs[median][k] for k in REPRODUCED) and score["name"] == median
    assert "identical to the committed run's" in (shipped / "study-baseline" / "README.md").read_text()
    assert json.loads((results / "runs" / f"{median}.json").read_text()) == runs[median]  # the committed file stays

    # sitting 3: nothing left, also for a fresh OUT (another clone or machine) that has only the published
    # run files: they count as finished runs
    assert "nothing left to run" in run(_study(out, corpus, results), OMP_NUM_THREADS="1").stdout
    fresh = run(_study(tmp_path / "fresh", corpus, results), OMP_NUM_THREADS="1").stdout
    assert "nothing left to run" in fresh and not (tmp_path / "fresh" / "runs").exists(), fresh[-2000:]

    # the table, from the run files
    run([sys.executable, "-m", "fairseq_ext.tools.study", "table", "--results", str(results)])
    text = (results / "README.md").read_text()
    summary = json.loads((results / "summary.json").read_text())
    assert summary["lr"] == lr and summary["runs"] == 6
    for config in ("baseline", "one_wide_ffn"):
        bleus = [r["bleu"] for r in runs.values() if r["config"] == config and r["lr"] == lr]
        assert len(bleus) == 2
        cell = f"{statistics.mean(bleus):.2f} ± {statistics.stdev(bleus):.2f}"
        table = text.split("### Every configuration", 1)[1]
        row = next(line for line in table.splitlines() if line.startswith(f"| {config} "))
        assert cell in row, (cell, row)
    assert (results / "valid_curves.png").exists()
    check = subprocess.run([sys.executable, "-m", "fairseq_ext.tools.study", "table", "--results", str(results),
                            "--check"], cwd=REPO, env=clean_env(), capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


# settings every configuration must share with the baseline: the papers compare at equal regularisation,
# normalisation and embedding setup (an arch's own defaults must not leak into the study)
SHARED_SETTINGS = ["dropout", "attention_dropout", "activation_dropout", "relu_dropout", "activation_fn",
                   "encoder_normalize_before", "decoder_normalize_before", "layernorm_embedding",
                   "no_scale_embedding", "share_all_embeddings", "encoder_learned_pos", "decoder_learned_pos",
                   "encoder_layerdrop", "decoder_layerdrop", "encoder_embed_dim", "decoder_embed_dim",
                   "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads"]


def test_every_study_configuration_trains_with_the_baselines_settings():
    """The flags the study passes, resolved by each arch as fairseq-train would: everything but the method
    itself equals the baseline's (e.g. the scaling_sparse archs' Transformer Big attention dropout is pinned)."""
    import fairseq_ext  # noqa: F401
    from fairseq_ext.tools.params import parse_arch_args
    from fairseq_ext.tools.study import PROTOCOLS, configs

    for name, p in PROTOCOLS.items():
        resolved = {}
        for c in configs(p):
            flags = p.dims + c.flags + ["--dropout", str(p.dropout)]
            i = flags.index("--arch")
            args = parse_arch_args(flags[i + 1], flags[:i] + flags[i + 2:])
            resolved[c.name] = {k: getattr(args, k, None) for k in SHARED_SETTINGS}
        base = resolved.pop("baseline")
        for config, settings in resolved.items():
            differ = {k: (v, base[k]) for k, v in settings.items() if v != base[k]}
            assert not differ, f"protocol {name}, {config}: (its value, the baseline's) {differ}"


def test_committed_results_docs_match_the_run_files():
    """README's and docs/results' study tables and docs/results/summary.json are what the tool generates
    from the committed run files (nothing typed by hand, nothing stale)."""
    from fairseq_ext.tools.study import RESULTS
    from fairseq_ext.tools.study_report import write_report

    stale = write_report(RESULTS, check=True)
    assert not stale, f"{stale}: run `python -m fairseq_ext.tools.study table`"


def test_committed_shipped_study_models_match_their_runs():
    """Each shipped/study-CONFIG folder is its configuration's median-BLEU seed of the committed run files,
    its files match SHA256SUMS, its result reproduces the committed run, and its README names the folder
    relative to the repository (no machine's path)."""
    from fairseq_ext.compat import load_checkpoint
    from fairseq_ext.tools.study import RESULTS
    from fairseq_ext.tools.study_report import load_runs, main_lr
    from fairseq_ext.tools.study_ship import REPRODUCED, _shown, median_seed

    assert _shown(os.path.join(REPO, "shipped", "study-x")) == os.path.join("shipped", "study-x")
    assert _shown("/elsewhere/study-x") == "/elsewhere/study-x"
    runs = [r for r in load_runs(RESULTS) if r.get("role") in ("baseline", "main")]
    lr = main_lr(runs)
    folders = sorted(f for f in os.listdir(os.path.join(REPO, "shipped")) if f.startswith("study-"))
    for folder in folders:
        path = os.path.join(REPO, "shipped", folder)
        seeds = [r for r in runs if r["config"] == folder[len("study-"):] and r["lr"] == lr]
        chosen = median_seed(seeds)
        score = json.loads(open(os.path.join(path, "score.json")).read())
        assert score["name"] == chosen["name"], (folder, score["name"], chosen["name"])
        assert all(score[k] == chosen[k] for k in REPRODUCED), folder
        run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=path)
        readme = open(os.path.join(path, "README.md"), encoding="utf-8").read()
        assert f"examples/evaluate.sh shipped/{folder} " in readme and REPO not in readme, folder
        assert REPO + os.sep not in open(os.path.join(path, "train.log"), encoding="utf-8").read(), folder
        state = load_checkpoint(os.path.join(path, "checkpoint.pt"))
        assert all(v.dtype == torch.float16 for v in state["model"].values() if v.is_floating_point())


def test_claim_is_exclusive_and_dies_with_its_process(tmp_path):
    """A run is trained by one process at a time: a second claim fails while the first holds it, and the
    run is free again once its holder releases it or is killed (no stale lock to clean up); a run with a
    result is never claimed."""
    code = ("import sys, time; from fairseq_ext.tools.study import Study, PROTOCOLS; "
            "s = Study(sys.argv[1], PROTOCOLS['tiny']); print(s.claim('r'), flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, env=clean_env(),
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "True"
    sys.path.insert(0, str(REPO))
    from fairseq_ext.tools.study import PROTOCOLS, Study

    mine, other = Study(tmp_path, PROTOCOLS["tiny"]), Study(tmp_path, PROTOCOLS["tiny"])
    assert not mine.claim("r")
    holder.kill()
    holder.wait()
    assert mine.claim("r") and not other.claim("r")
    mine.release("r")
    assert other.claim("r")
    other.release("r")
    (tmp_path / "results" / "r.json").write_text("{}")
    assert not mine.claim("r")


def test_a_study_keeps_one_precision_across_machines(tmp_path, monkeypatch):
    """A study's runs share one precision: a fresh OUT takes the precision of the finished runs (here the
    published ones), not this machine's choice, also for an OUT carried over with its study.json; fp32 and
    bf16 run on any CPU (bf16 without native bf16: products computed in fp32, recorded in each run's file),
    fp16 stops before any run where there is no CUDA device, naming the fix; runs that already disagree are an
    error. Each run's file records the machine it trained on, not the one that wrote study.json."""
    from fairseq_ext.tools import study as st

    bf16 = {"flag": "--bf16", "precision": "bf16", "cpu": "CPU A", "reason": "bf16 autocast: CPU A has avx512_bf16"}
    fp32 = {"flag": "", "precision": "fp32", "cpu": "CPU B", "reason": "fp32: CPU B has no native bf16"}
    fp16 = {"flag": "--fp16", "precision": "fp16", "reason": "CUDA device G: fp16 mixed precision"}
    assert st.agreed_precision({}, fp32) == fp32  # a new study: this machine's choice
    assert st.agreed_precision({"bf16": ["r1"]}, bf16) == bf16
    carried = bf16 | {"cpu": "CPU C"}
    assert st.agreed_precision({"bf16": ["r1"]}, bf16, stored=carried) == carried  # study.json's stays
    kept = st.agreed_precision({"fp32": ["r1"]}, bf16)
    assert kept["precision"] == "fp32" and kept["flag"] == ""  # fp32 runs on a bf16 machine too
    monkeypatch.setattr(st, "fp32_products", lambda: True)
    for finished, stored in (({"bf16": ["r1", "r2"]}, None), ({}, bf16)):  # bf16 on a CPU without native bf16
        kept = st.agreed_precision(finished, fp32, stored)
        assert kept["precision"] == "bf16" and kept["flag"] == "--bf16" and kept["cpu"] == "CPU B"
        assert "CPU B has no native bf16" in kept["reason"] and "computed in fp32" in kept["reason"]
    monkeypatch.setattr(st, "fp32_products", lambda: False)  # native bf16, but a probe product too slow for it
    slow = dict(fp32, reason="fp32: CPU E has avx512_bf16 but a bf16 product ran only 1.10x fp32's speed")
    kept = st.agreed_precision({"bf16": ["r1"]}, slow)
    assert kept["flag"] == "--bf16" and "1.10x" in kept["reason"] and "computed in fp32" not in kept["reason"]
    for finished, stored, what in (({"fp16": ["r1", "r2"]}, None, "its 2 finished runs"), ({}, fp16, "its study.json")):
        with pytest.raises(SystemExit, match=f"{what} trained in fp16, but this machine would train in fp32 "
                                             r"\(fp32: CPU B has no native bf16\).*a CUDA device.*"
                                             "another OUT folder and --publish folder"):
            st.agreed_precision(finished, fp32, stored)
    for finished, stored in (({"bf16": ["r1"], "fp32": ["r2"]}, None), ({"fp32": ["r2"]}, bf16)):
        with pytest.raises(SystemExit, match=r"disagree on the precision \(bf16: .*; fp32: r2\)"):
            st.agreed_precision(finished, bf16, stored)

    # through Study.setup (a synthetic configuration alone: no corpus to binarize)
    published = tmp_path / "published"
    published.mkdir()
    (published / "copy_transformer-lr1e-3-s1.json").write_text(json.dumps({"name": "copy_transformer-lr1e-3-s1",
                                                                            "precision": "fp16"}))
    monkeypatch.setattr(st, "choose", lambda: dict(fp32))
    study = st.Study(tmp_path / "out", st.PROTOCOLS["tiny"], publish=str(published), only={"copy_terraformer"})
    with pytest.raises(SystemExit, match="its 1 finished run trained in fp16"):
        study.setup()
    assert not (tmp_path / "out" / "study.json").exists()
    (published / "copy_transformer-lr1e-3-s1.json").write_text(json.dumps({"name": "copy_transformer-lr1e-3-s1",
                                                                            "precision": "bf16"}))
    monkeypatch.setattr(st, "choose", lambda: dict(bf16))
    study.setup()
    assert json.loads((tmp_path / "out" / "study.json").read_text())["precision"] == bf16
    monkeypatch.setattr(st, "choose", lambda: dict(fp32))  # the same OUT, carried to a machine without bf16
    monkeypatch.setattr(st, "cpu_model", lambda: "CPU D")
    monkeypatch.setattr(st, "fp32_products", lambda: True)
    again = st.Study(tmp_path / "out", st.PROTOCOLS["tiny"], only={"copy_terraformer"})
    again.setup()
    assert again.meta["precision"] == bf16  # study.json's decision stays
    facts = again.run_facts(str(tmp_path), {"train": []})
    assert (facts["precision"], facts["cpu"], facts["bf16_products"]) == ("bf16", "CPU D", "fp32")
    monkeypatch.setattr(st, "fp32_products", lambda: False)
    assert again.run_facts(str(tmp_path), {"train": []})["bf16_products"] == "native"
    # a run carried across machines: each fairseq-train call logs how it computed its products
    from fairseq_ext.precision import BF16_LINE, FP32_PRODUCTS_LINE

    calls = [f"INFO | {BF16_LINE}, fp32 weights ...; {FP32_PRODUCTS_LINE}\n", f"INFO | {BF16_LINE}, fp32 weights ...\n"]
    for lines, products in ((calls[:1], "fp32"), (calls[1:], "native"), (calls, "fp32 in 1 of 2 training calls")):
        (tmp_path / "train.log").write_text("".join(lines))
        assert again.run_facts(str(tmp_path), {"train": []})["bf16_products"] == products


def test_plan_orders_seeds_then_ablations_then_generalisation_tasks(tmp_path):
    """After the sweep: seed 1 of every method, seeds 2 and 3 of the baseline and the main configurations,
    the ablations, the Terraformer's generalisation tasks, the main configurations' other rates; the
    synthetic configurations alone need neither the baseline nor the corpus."""
    from fairseq_ext.tools.study import PROTOCOLS, Study, run_name, synthetic_configs

    p = PROTOCOLS["paper"]
    study = Study(tmp_path, p)
    for lr, loss in zip(p.lrs, (6.4, 6.1, 6.2)):
        (tmp_path / "results" / f"baseline-lr{lr}-s1.json").write_text(json.dumps({"valid_loss": loss}))
    plan = study.plan()
    why = [r[3] for r in plan]
    assert all(r[1] == "2e-3" for r in plan if r[3] not in ("learning-rate sweep", "generalisation task",
                                                             "its own learning rate"))
    stages = ["learning-rate sweep", "seed 1", "seed 2", "seed 3", "ablation", "generalisation task",
              "its own learning rate"]
    firsts = [why.index(s) for s in stages]
    lasts = [len(why) - 1 - why[::-1].index(s) for s in stages]
    assert all(lasts[i] < firsts[i + 1] for i in range(len(stages) - 1)), why
    assert {r[0] for r in plan if r[3] == "generalisation task"} == {c.name for c in synthetic_configs(p)} == {
        "copy_terraformer", "copy_transformer", "addition_terraformer", "addition_transformer",
        "copy_terraformer_nopos", "copy_terraformer_offset"}
    assert [r for r in plan if r[0].startswith("can_uncapped")] == [("can_uncapped", "2e-3", 2, "diagnosis"),
                                                                     ("can_uncapped_s3", "2e-3", 3, "diagnosis")]
    assert [r for r in plan if r[0].endswith("_window")] == [("one_wide_ffn_window", "2e-3", 1, "diagnosis"),
                                                              ("can_ffn_window", "2e-3", 1, "diagnosis")]
    # the protocol's cost paragraph counts this plan's runs
    doc = " ".join(open(os.path.join(REPO, "docs", "results", "README.md")).read().split())
    assert f"The full plan below is {len(plan) - len(synthetic_configs(p))} translation runs" in doc
    assert f"the {len(synthetic_configs(p))} runs of Terraformer's generalisation tasks" in doc
    alone = Study(tmp_path / "alone", p, only={"copy_transformer"})
    assert [r[0] for r in alone.plan()] == ["copy_transformer"] and "baseline" not in alone.configs

    # a run a sitting started (here an ablation) is finished before any new run of an earlier stage
    todo = study.todo()
    assert todo == [r for r in plan if r[3] != "learning-rate sweep"]
    started = next(r for r in plan if r[3] == "ablation")
    (tmp_path / "runs" / run_name(*started[:3])).mkdir(parents=True)
    (tmp_path / "runs" / run_name(*started[:3]) / "checkpoint_last.pt").write_bytes(b"")
    assert study.todo() == [started] + [r for r in todo if r != started]


def test_convergence_rules_and_a_configurations_own_cap():
    """Patience, plateau (the last 20% of the updates improved the best by under 1%), the 20-epoch cap; the
    CAN diagnosis trains the same model and seed under twice the cap, paired with the baseline's seed 2."""
    from fairseq_ext.tools.study import PROTOCOLS, configs, convergence, run_protocol

    p = PROTOCOLS["paper"]
    updates = [700 * (i + 1) for i in range(40)]
    steady = [7.0 - 0.02 * i for i in range(40)]  # 0.3% better every epoch: never a plateau
    assert convergence(steady[:19], updates[:19], p) is None
    assert convergence(steady[:20], updates[:20], p) == "max_epochs"
    flat = steady[:12] + [steady[11] - 0.001 * i for i in range(1, 9)]
    assert convergence(flat, updates[:20], p) == "plateau"
    worse = steady[:10] + [steady[9] + 0.01] * 3
    assert convergence(worse, updates[:13], p) == "patience"
    c = {c.name: c for c in configs(p)}
    uncapped, can = c["can_uncapped"], c["can"]
    assert uncapped.flags == can.flags and (uncapped.seed, uncapped.max_epochs) == (2, 40)
    s3 = c["can_uncapped_s3"]
    assert s3.flags == can.flags and (s3.seed, s3.max_epochs) == (3, 40)
    assert "can_uncapped_s3" not in {x.name for x in configs(PROTOCOLS["tiny"])}
    assert run_protocol(p, can) is p and run_protocol(p, uncapped).max_epochs == 40 and p.max_epochs == 20
    assert convergence(steady[:20], updates[:20], run_protocol(p, uncapped)) is None
    assert convergence(steady, updates, run_protocol(p, uncapped)) == "max_epochs"


def test_plateau_window_diagnosis_trains_on_where_the_protocol_stopped_after_10_epochs():
    """The committed One Wide FFN seed 1 and CAN FFN-only runs: the protocol's plateau rule stopped them after
    10 epochs, judged on a 2-epoch window (the last 20% of the updates); their diagnosis runs (same flags and
    seed, a window of at least 4 epochs, cap 40) train on from the same curves, stop once 4 epochs gain under
    1%, and leave the protocol itself unchanged."""
    from fairseq_ext.tools.study import PROTOCOLS, configs, convergence, run_protocol

    p = PROTOCOLS["paper"]
    c = {c.name: c for c in configs(p)}
    for judged, diag in (("one_wide_ffn", "one_wide_ffn_window"), ("can_ffn", "can_ffn_window")):
        d = c[diag]
        assert (d.flags, d.role, d.paper, d.seed) == (c[judged].flags, "diagnosis", c[judged].paper, 1)
        assert (d.max_epochs, d.min_window) == (40, 4)
        run = json.load(open(os.path.join(REPO, "docs", "results", "runs", f"{judged}-lr4e-3-s1.json")))
        updates, losses = zip(*[(u, loss) for u, loss, _ in run["valid_curve"]])
        assert (run["epochs"], run["stopped_by"]) == (10, "plateau")
        assert convergence(losses, updates, p) == "plateau"
        assert all(convergence(losses[:n], updates[:n], p) is None for n in range(1, 10))
        assert convergence(losses, updates, run_protocol(p, d)) is None
        # then a curve that keeps gaining 0.4% per epoch trains on to the cap; one that flattens after epoch 10
        # stops within the 4-epoch window
        ups = [updates[0] * (i + 1) for i in range(40)]
        gaining = list(losses) + [losses[-1] * 0.996 ** i for i in range(1, 31)]
        assert all(convergence(gaining[:n], ups[:n], run_protocol(p, d)) is None for n in range(10, 40))
        assert convergence(gaining, ups, run_protocol(p, d)) == "max_epochs"
        flat = list(losses) + [losses[-1] - 1e-3 * i for i in range(1, 11)]  # 0.015% per epoch after epoch 10
        stops = [n for n in range(10, len(flat) + 1) if convergence(flat[:n], ups[:n], run_protocol(p, d))]
        assert 11 < stops[0] <= 14 and convergence(flat[:stops[0]], ups[:stops[0]], run_protocol(p, d)) == "plateau"
    assert run_protocol(p, c["one_wide_ffn"]) is p and p.min_window == 0
    assert not {"one_wide_ffn_window", "can_ffn_window"} & {x.name for x in configs(PROTOCOLS["tiny"])}


def test_synthetic_convergence_rules():
    from fairseq_ext.tools.study import PROTOCOLS, synthetic_convergence

    s = PROTOCOLS["paper"].synthetic  # every 500 updates, patience 4, at least 4,000 updates, cap 12,000
    ev = lambda u, seq, tok: {"updates": u, "sequence_accuracy": seq, "token_accuracy": tok}
    flat = [ev(500 * (i + 1), 0.0, 6.0) for i in range(8)]
    assert synthetic_convergence([], s) is None
    assert synthetic_convergence(flat[:7], s) is None  # under min_updates: a stall may end
    assert synthetic_convergence(flat, s) == "plateau"
    rising = flat[:7] + [ev(4000, 0.0, 6.6)]  # token accuracy still improving by 0.5 points or more
    assert synthetic_convergence(rising, s) is None
    assert synthetic_convergence([ev(500, 100.0, 100.0)], s) == "perfect"
    climbing = [ev(500 * (i + 1), float(i), float(i)) for i in range(24)]
    assert synthetic_convergence(climbing, s) == "max_updates"


@pytest.mark.heavy
def test_synthetic_tasks_run_resume_and_tabulate(tmp_path):
    """The study's generalisation stage on the tiny protocol, without a translation corpus: killed after its
    second chunk trained and before that chunk's valid decoding was recorded, resumed to the end: the chunk
    is not trained again (fairseq-train restarted at its --max-update would take one more update), the
    decodings are every `interval` updates with none repeated, the kept checkpoint holds the best valid
    decoding's updates, the test set is decoded with it, and the table shows the run beside the paper's
    figures."""
    import re

    import torch

    from fairseq_ext.tools import synthetic

    out, results = tmp_path / "study", tmp_path / "results"
    (results / "runs").mkdir(parents=True)
    (results / "README.md").write_text("# Results\n\n<!-- study:results:begin -->\n<!-- study:results:end -->\n")
    cmd = [sys.executable, "-m", "fairseq_ext.tools.study", "run", str(out), "--protocol", "tiny", "--configs",
           "copy_transformer", "--publish", str(results / "runs")]
    save = out / "runs" / "copy_transformer-lr3e-3-s1"
    s = __import__("fairseq_ext.tools.study", fromlist=["PROTOCOLS"]).PROTOCOLS["tiny"].synthetic
    second_chunk = f"max_update: {2 * s.interval}"
    with open(tmp_path / "sitting1.log", "w") as log:
        p = subprocess.Popen(cmd, cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"), stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 600
        while p.poll() is None and time.time() < deadline and not (
                (save / "train.log").exists() and second_chunk in (save / "train.log").read_text()):
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    assert second_chunk in (save / "train.log").read_text(), open(tmp_path / "sitting1.log").read()[-3000:]
    assert len(json.loads((save / "evals.json").read_text())) == 1  # killed between training and decoding
    second = run(cmd, OMP_NUM_THREADS="1").stdout
    train_log = (save / "train.log").read_text()
    stops = re.findall(r"num_updates: (\d+) >= max_update: (\d+)", train_log)
    assert stops and all(a == b for a, b in stops), stops  # no chunk trained past its target
    r = json.loads((results / "runs" / "copy_transformer-lr3e-3-s1.json").read_text())
    assert [e["updates"] for e in r["evals"]] == [s.interval * (i + 1) for i in range(len(r["evals"]))]
    assert len(r["evals"]) >= 2 and f"updates {s.interval}-{2 * s.interval}" in second, second[-3000:]
    assert r["updates"] == r["evals"][-1]["updates"] and r["stopped_by"] in ("perfect", "plateau", "max_updates")
    best = max(r["evals"], key=lambda e: (e["sequence_accuracy"], e["token_accuracy"]))
    assert r["chosen_updates"] == best["updates"] and r["valid"]["token_accuracy"] == best["token_accuracy"]
    kept = [f for f in os.listdir(save) if f.startswith("checkpoint_at")]
    assert kept == [f"checkpoint_at{best['updates']}.pt"], kept
    state = torch.load(save / kept[0], map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == best["updates"]
    assert r["test"]["examples"] == s.test and r["valid"]["examples"] == s.valid and r["role"] == "synthetic"
    assert r["parameters"] > 0 and all(e["valid_loss"] is not None for e in r["evals"])
    assert (out / "results" / f"{r['name']}.json").read_text() == (results / "runs" / f"{r['name']}.json").read_text()
    assert "nothing left to run" in run(cmd, OMP_NUM_THREADS="1").stdout
    run([sys.executable, "-m", "fairseq_ext.tools.study", "table", "--results", str(results)])
    table = (results / "README.md").read_text()
    assert "### Terraformer's generalisation" in table and "| copy | transformer |" in table, table
    e = r["test"]["errors"]  # how the wrong test answers are wrong, from the test decoding's own file
    assert e == synthetic.errors(synthetic.read_generate(save / "generate-test.txt"))
    assert e["exact"] + e["wrong_digits"] + e["too_long"] + e["too_short"] == s.test
    assert (f"{r['test']['sequence_accuracy']:.1f} / {r['test']['token_accuracy']:.1f} | "
            f"{e['edit_token_accuracy']:.1f} | 0.0 / 79.8 |") in table

    # examples of another data format (an older synthetic.py, other flags): the data is made again, a result
    # of the old examples counts as not run, and the run's old files (evaluations, kept checkpoint; here no
    # checkpoint_last.pt) are moved aside, not resumed: it trains afresh on the new examples
    data = out / "synthetic" / "copy"
    assert json.loads((data / "bin" / "done").read_text()) == json.loads((save / "data_signature").read_text())
    assert r["data_format"] == synthetic.DATA_FORMAT["copy"] and synthetic.current_format(r)
    old = {"format": 0}
    (data / "bin" / "done").write_text(json.dumps(old))
    (save / "data_signature").write_text(json.dumps(old))
    (data / "raw" / "train.src").write_text("stale\n")
    os.remove(save / "checkpoint_last.pt")
    for folder in (out / "results", results / "runs"):
        (folder / f"{r['name']}.json").write_text(json.dumps({**r, "data_format": 0}))
    with open(tmp_path / "sitting3.log", "w") as log:  # stopped once it trains afresh
        p = subprocess.Popen(cmd, cwd=REPO, env=clean_env(OMP_NUM_THREADS="1"), stdout=log,
                             stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 600
        while p.poll() is None and time.time() < deadline and "updates 0-" not in (tmp_path / "sitting3.log").read_text():
            time.sleep(0.1)
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    third = (tmp_path / "sitting3.log").read_text()
    assert "making it again" in third and "training afresh" in third and "updates 0-" in third, third[-3000:]
    assert (data / "raw" / "train.src").read_text() != "stale\n"
    retired = list((out / "retired").iterdir())
    assert len(retired) == 1 and (retired[0] / "evals.json").exists() and (retired[0] / kept[0]).exists()
    assert not (save / "evals.json").exists() and not any(f.startswith("checkpoint_at") for f in os.listdir(save))
    assert (save / "lock").exists() and json.loads((save / "data_signature").read_text())["format"] == 1
    from fairseq_ext.tools.study import PROTOCOLS, Study

    study = Study(out, PROTOCOLS["tiny"], publish=str(results / "runs"), only={"copy_transformer"})
    assert study.result(r["name"]) is None  # the result of the old examples counts as not run


def test_speed_columns_come_from_the_benchmarks_by_model_spec():
    """The table's training and decoding speeds are the train_study / decode_study benchmarks' (every model in
    one run, ratios to the baseline there), not the runs' own logs: a diagnosis that retrains a measured
    configuration's model (same flags) shows that model's figures, a model the benchmark lacks shows '-', and
    the decoding ratio is the benchmark's median of interleaved rounds."""
    from fairseq_ext.tools.study import PROTOCOLS, bench_spec, configs
    from fairseq_ext.tools.study_report import report

    p = PROTOCOLS["paper"]
    c = {c.name: c for c in configs(p)}
    spec = {n: bench_spec(p.dims + c[n].flags) for n in ("baseline", "can", "sas")}
    assert spec["can"].startswith("can_decoder@--encoder-layers 4") and "--arch" not in spec["can"]

    def run_file(config, seed, bleu):
        return {"name": f"{config}-lr4e-3-s{seed}", "config": config, "paper": c[config].paper,
                "role": c[config].role, "lr": "4e-3", "seed": seed, "flags": " ".join(p.dims + c[config].flags),
                "parameters": 2_000_000, "epochs": 10, "updates": 7000, "stopped_by": "plateau", "converged": True,
                "valid_curve": [[7000, 6.2, 5.0]], "valid_loss": 6.2, "averaged_valid_loss": 6.2, "bleu": bleu,
                "chrf": 30.0, "decode_sentences_per_s": 999.0, "train_tokens_per_s": 99_999}

    runs = [run_file("baseline", s, 8.0) for s in (1, 2, 3)] + [run_file("can", s, 7.5) for s in (1, 2, 3)]
    runs += [run_file("can_uncapped", 2, 7.7), run_file("sas_encoder", 1, 7.4)]
    train = {"settings": {"threads": 1}, "machine": {"processor": "CPU X"},
             "models": {"baseline": {"spec": spec["baseline"], "bf16_tokens_per_s": 10_000.0},
                        "can": {"spec": spec["can"], "bf16_tokens_per_s": 12_000.0}}}
    decode = {"settings": {"beam": 5, "threads": 1}, "machine": {"processor": "CPU Y"},
              "models": {"baseline": {"spec": spec["baseline"], "results": {"64": {"tokens_per_s": {"median": 1000.0}}}},
                         "can": {"spec": spec["can"], "results": {"64": {"tokens_per_s": {"median": 800.0}}}}},
              "ratios": {"64": {"can": {"median": 0.79}}}}
    body, summary = report(runs, train, None, decode)
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in body.splitlines() if line.startswith("| ")}
    assert "decoding tokens/s" in body and "decode_study" in body and "99,999" not in body and "999.0" not in body
    assert rows["baseline"][9:11] == ["10,000", "1,000.0"]
    assert rows["can"][9:11] == ["12,000 (1.20×)", "800.0 (0.79×)"]
    assert rows["can_uncapped"][9:11] == rows["can"][9:11]  # the same model, found by its spec
    assert rows["sas_encoder"][9:11] == ["-", "-"]  # not measured
    assert summary["configs"]["can_uncapped"]["decode_ratio"] == 0.79


def test_valid_loss_at_equal_updates_pairs_each_seed_at_the_last_epoch_both_reached():
    """The table's Δ valid at equal updates: per seed, the method's epoch checkpoint against the baseline's of
    the same seed at the last validation both have (not the averaged checkpoints, not the runs' last epochs),
    relative; mean ± sd over seeds with the paired t-test's mark; a seed the baseline lacks is left out."""
    from fairseq_ext.tools.study_report import at_equal_updates, fmt_equal

    curve = lambda losses: [[691 * (i + 1), x, x - 0.8] for i, x in enumerate(losses)]
    base = [{"seed": 1, "valid_curve": curve([8.0, 7.0, 6.0, 5.0])},  # runs on past the method's seed 1
            {"seed": 2, "valid_curve": curve([8.0, 6.5])}]  # stops before the method's seed 2
    method = [{"seed": 1, "valid_curve": curve([8.0, 7.7, 6.3])},
              {"seed": 2, "valid_curve": curve([8.2, 6.89, 6.0, 5.5])},
              {"seed": 3, "valid_curve": curve([9.0])}]
    m, sd, n, significant, epochs = at_equal_updates(method, base)
    assert n == 2 and epochs == [3, 2]
    assert abs(m - statistics.mean([6.3 / 6.0 - 1, 6.89 / 6.5 - 1])) < 1e-12
    assert abs(sd - statistics.stdev([0.05, 0.06])) < 1e-9
    assert not significant  # 5% and 6%: t = 11.0 with one degree of freedom, under the 12.706 of p = 0.05
    assert fmt_equal((0.05, None, 1, False, [10])) == "+5.0% (epoch 10)"
    assert fmt_equal(None) == "-" and at_equal_updates(method[2:], base) is None
