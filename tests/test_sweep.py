"""Tests for machinery/sweep.py: the IsoFLOP plan and its train.py commands, the analysis on runs drawn from a known law,
the reports, the CLI's checks before any run, and (marked long) the quick sweep end to end."""

import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import scaling
from machinery import sweep
from machinery.commands import scaling as command
from machinery.runs_file import load_runs
from scaling import ScalingError, fit_all


def cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, str(sweep.ROOT / "scaling.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_docstring_examples():
    import doctest

    assert doctest.testmod(sweep).failed == 0


# --- the plan ----------------------------------------------------------------------------------------------------


def test_isoflop_plan_trains_each_size_for_its_budget():
    """The default design: 4 budgets over 8x from 1e12, 5 distinct sizes per budget around the 20:1 guess, 6·N·D
    equal to the budget (within the rounding to whole steps), and every model a model: width >= 32, heads of 16
    channels, 2+ layers, 800 to 1,600 steps each (min_steps, and under 2x that, so no point gains more from its
    step count than its neighbours), at most 2 epochs of pystdlib's 13.6M train tokens."""
    settings = sweep.SweepSettings()
    plan = sweep.plan_isoflop(settings)
    budgets = sorted({r.budget for r in plan})
    assert len(budgets) == 4 and budgets[0] >= 1e12 and budgets[-1] / budgets[0] >= 8
    for budget in budgets:
        group = [r for r in plan if r.budget == budget]
        sizes = [r.params for r in group]
        assert len(group) == 5 and sizes == sorted(set(sizes))
        assert sizes[0] < scaling.params_for_budget(budget, 20) < sizes[-1]
        for r in group:
            assert r.tokens == r.steps * r.batch_size * settings.block_size
            assert 6 * r.params * r.tokens == pytest.approx(budget, rel=0.03)
            assert r.lr == pytest.approx(settings.lr_at_64 * 64 / r.shape.n_embd)
            heads = r.shape.config_overrides()["n_head"]
            assert r.shape.n_embd >= 32 and r.shape.n_embd // heads == 16 and r.shape.n_layer >= 2
            assert (
                settings.min_steps <= r.steps < 2 * settings.min_steps
                and r.tokens <= 2 * 13_588_944
            )
            bigger = [
                b for b in settings.batch_sizes if b > r.batch_size
            ]  # the largest batch that keeps the steps
            assert not bigger or r.tokens / (min(bigger) * settings.block_size) < settings.min_steps
    held = sweep.plan_heldout(settings, scaling.params_for_budget(2e13, 20))
    assert len(held) == 3 + 1 and all(
        r.budget == 2.5 * budgets[-1] for r in held
    )  # + the predicted size again
    assert all(settings.min_steps <= r.steps < 2 * settings.min_steps for r in held)
    assert sweep.planned_hours(settings) <= 1.5  # the 90 minutes, by the estimate


def test_second_seeds_go_to_the_sizes_nearest_each_minimum():
    """At each budget the 3 sizes around its best run (slid inside at an edge), at the held-out budget the size
    nearest the prediction, each trained again from seed + 1 under its own name; --second-seeds 0 trains none."""
    settings = sweep.SweepSettings()
    law = scaling.ChinchillaFit(1.2, 93.0, 250.0, 0.33, 0.33)
    records, record = _sweep_records(settings, law, noise=0.0)
    grid = sweep.plan_isoflop(settings)
    again = sweep.plan_second_seeds(settings, records)
    assert len(again) == 3 * len(settings.budgets) and all(
        r.seed == 1 and not r.heldout for r in again
    )
    for budget in settings.budgets:
        sizes = [r for r in records if r["budget"] == budget]
        best = min(range(5), key=lambda i: sizes[i]["loss"])
        want = {
            sizes[i]["parameters"]
            for i in range(max(0, min(best - 1, 2)), max(0, min(best - 1, 2)) + 3)
        }
        assert {r.params for r in again if r.budget == budget} == want
    edge = [
        dict(r, loss=r["parameters"]) for r in records if r["budget"] == 1e12
    ]  # the smallest size is best
    assert [r.params for r in sweep.plan_second_seeds(settings, edge)] == [
        r.params for r in grid[:3]
    ]
    for run in again:
        twin = next(r for r in grid if (r.budget, r.params) == (run.budget, run.params))
        assert run.name == twin.name + "-s1" and (run.steps, run.batch_size, run.lr) == (
            twin.steps,
            twin.batch_size,
            twin.lr,
        )
        cmd = sweep.train_command(settings, run, "/data/x", "out/x")
        assert cmd[cmd.index("--seed") + 1] == "1"
        cmd = sweep.train_command(settings, twin, "/data/x", "out/x")
        assert cmd[cmd.index("--seed") + 1] == "0"
    *held, twice = sweep.plan_heldout(settings, 4e5)
    nearest = min(held, key=lambda r: abs(math.log(r.params / 4e5)))
    assert (
        [r.seed for r in held] == [0, 0, 0]
        and twice == dataclasses.replace(nearest, seed=1)
        and twice.heldout
    )
    one_seed = dataclasses.replace(settings, second_seed_sizes=0)
    assert (
        sweep.plan_second_seeds(one_seed, records) == []
        and sweep.plan_heldout(one_seed, 4e5) == held
    )
    # the estimate counts them: 3 per budget and one held out
    assert len(sweep.planned_runs(settings)) == len(grid) + 3 + 3 * len(settings.budgets) + 1


def test_a_points_seeds_are_fitted_as_their_mean(tmp_path):
    """runs_of (the sweep's fits) and load_runs (`scaling.py fit final.jsonl`) see one point at its mean loss."""
    settings = sweep.SweepSettings()
    records, _ = _sweep_records(settings, scaling.ChinchillaFit(1.2, 93.0, 250.0, 0.33, 0.33))
    first = records[0]
    records.append(dict(first, name=first["name"] + "-s1", seed=1, loss=first["loss"] + 0.1))
    for runs in (
        sweep.runs_of(records),
        load_runs(_write_jsonl(tmp_path / "final.jsonl", records)),
    ):
        assert len(runs) == len(records) - 1
        [point] = [
            r for r in runs if (r.params, r.budget) == (first["parameters"], first["budget"])
        ]
        assert point.loss == pytest.approx(first["loss"] + 0.05)


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_budget_the_family_cannot_cover_names_the_setting():
    """1e11 is too small for sizes of >= 800 steps: even the smallest (43k parameters) gets 754 at 4 x 128."""
    with pytest.raises(
        ScalingError, match="at C = 1e\\+11 only 0 sizes .* choose other settings.budgets"
    ):
        sweep.plan_isoflop(dataclasses.replace(sweep.SweepSettings(), budgets=(1e11, 1e12)))


def test_shape_counts_are_the_built_models_parameters():
    from model import GPT, GPTConfig

    for shape in sweep.shape_family(96):
        cfg = GPTConfig(vocab_size=512, block_size=64, **shape.config_overrides())
        model = GPT(cfg)
        built = sum(p.numel() for p in model.parameters())  # a tied weight is counted once
        embedding = model.tok_emb.weight.numel()
        assert shape.counts(512) == (built, built - embedding), shape.name


def test_train_command_builds_the_planned_shape_and_schedule():
    from machinery import run as train_run

    settings = sweep.SweepSettings()
    plan = sweep.plan_isoflop(settings)
    assert len({r.batch_size for r in plan}) >= 3  # the batch follows the size and the budget
    for run in plan:
        cmd = sweep.train_command(settings, run, "/data/x", "out/x")
        value = lambda flag: cmd[cmd.index(flag) + 1]
        assert (
            cmd[1].endswith("train.py")
            and value("--data") == "/data/x"
            and value("--out-dir") == "out/x"
        )
        assert (
            int(value("--max-steps")) == run.steps == int(value("--eval-interval"))
        )  # one evaluation, at the end
        assert "--no-eval-at-start" in cmd and "--no-plot" in cmd  # no per-run overhead
        assert (
            float(value("--lr")) == pytest.approx(run.lr, rel=1e-5)
            and value("--schedule") == "cosine"
        )
        assert (
            int(value("--batch-size")) * int(value("--max-steps")) * int(value("--block-size"))
            == run.tokens
        )
        # every run is scored on the same 384 windows, whatever its batch
        assert int(value("--batch-size")) * int(value("--eval-batches")) == settings.eval_windows
        assert (value("--device"), value("--dtype")) == ("cpu", "fp32")
        overrides = train_run.parse_model_args(value("--model-args"))
        assert (overrides["n_layer"], overrides["n_embd"]) == (run.shape.n_layer, run.shape.n_embd)
    gpu = sweep.GPU_SWEEP
    run = sweep.plan_isoflop(gpu)[0]
    cmd = sweep.train_command(gpu, run, "/data/x", "out/x")
    assert cmd[cmd.index("--device") + 1] == "cuda" and cmd[cmd.index("--dtype") + 1] == "bf16"
    assert run.budget == 10 * sweep.SweepSettings().budgets[0] and run.batch_size in gpu.batch_sizes


def test_the_same_eval_windows_whatever_the_batch(tiny_dataset):
    """train.py's evaluation reads the val split's windows in one fixed order (seed 0), so batch × eval_batches
    windows are the same windows at any batch: the sweep's runs are scored on one held-out set."""
    import data

    ds = data.TokenData(tiny_dataset)

    def windows(batch, batches):
        it = ds.iterator("val", batch, 16, seed=0)
        return np.concatenate([it.next()[0].numpy() for _ in range(batches)])

    assert np.array_equal(windows(2, 4), windows(8, 1)) and np.array_equal(
        windows(1, 8), windows(4, 2)
    )


def test_shell_command_is_the_run_to_copy():
    cmd = [
        sys.executable,
        str(sweep.ROOT / "train.py"),
        "--data",
        str(sweep.ROOT / ".cache" / "d"),
        "--out-dir",
        "/tmp/elsewhere",
        "--model-args",
        "n_layer=2,n_embd=32",
    ]
    assert sweep.shell_command(cmd, threads=1) == (
        "OMP_NUM_THREADS=1 python train.py --data .cache/d "
        "--out-dir /tmp/elsewhere --model-args n_layer=2,n_embd=32"
    )
    assert sweep.shell_command(cmd, threads=0).startswith("python train.py ")


def test_final_val_loss_is_the_last_steps_evaluation(tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [
        {"step": 0, "val_loss": 6.2},
        {"step": 9, "loss": 4.0, "lr": 1e-3, "tokens": 100},
        {"step": 10, "val_loss": 4.4},
    ]
    path.write_text(
        "".join(json.dumps(r) + "\n" for r in lines) + '{"step": 11, "val'
    )  # a torn last line
    assert sweep.final_val_loss(path, 10) == 4.4
    assert sweep.final_val_loss(path, 20) is None  # the run stopped early: no final point
    assert sweep.final_val_loss(tmp_path / "missing.jsonl", 10) is None


def _sweep_records(settings, law, noise=0.003, seed=0):
    """final.jsonl records of the planned grid with losses from a known law (and the held-out run it predicts)."""
    rng = np.random.default_rng(seed)

    def record(r):
        return {
            "name": r.name,
            "budget": r.budget,
            "parameters": r.params,
            "non_embedding_parameters": r.non_embedding,
            "tokens": r.tokens,
            "compute": r.compute,
            "n_layer": r.shape.n_layer,
            "n_embd": r.shape.n_embd,
            "lr": r.lr,
            "steps": r.steps,
            "batch_size": r.batch_size,
            "heldout": r.heldout,
            "seconds": 1.0,
            "command": "python train.py",
            "loss": law.loss(r.params, r.tokens) * math.exp(noise * rng.standard_normal()),
        }

    return [record(r) for r in sweep.plan_isoflop(settings)], record


def test_sweep_recovers_a_known_law_and_predicts_the_held_out_run(tmp_path):
    """The whole analysis on runs drawn from a law (1/4 of the sizes' noise of a real sweep): the three
    approaches agree with the truth, the prediction at 2.5x the largest budget lands, and the report says so."""
    settings = sweep.SweepSettings()
    law = scaling.ChinchillaFit(
        1.2, 93.0, 250.0, 0.33, 0.33
    )  # made up: N_opt = sqrt(C/120), inside the sizes
    records, record = _sweep_records(settings, law)
    rng = np.random.default_rng(1)
    records += [
        dict(
            record(r),
            loss=law.loss(r.params, r.tokens) * math.exp(0.003 * rng.standard_normal()),
            name=r.name,
            seed=1,
        )
        for r in sweep.plan_second_seeds(settings, records)
    ]
    grid = sweep.runs_of(records)
    report = fit_all(grid, 2e13, bootstrap=2, refine=4)
    prediction = sweep.predict_heldout(report, grid)
    assert prediction["approach"] == "approach2"
    assert prediction["params"] == pytest.approx(float(law.optimal_params(2e13)), rel=0.3)
    held = sweep.plan_heldout(settings, prediction["params"])
    assert held[-1].seed == 1  # the size nearest the prediction, twice
    held_records = [dict(record(r), seed=r.seed) for r in held]
    held_records[-1]["loss"] = (
        next(h["loss"] for h in held_records if h["parameters"] == held[-1].params) + 0.002
    )
    records += [
        dict(
            r,
            predicted_loss=scaling.ChinchillaFit(**prediction["law3"]).loss(
                r["parameters"], r["tokens"]
            ),
        )
        for r in held_records
    ]
    result = sweep.SweepResult(
        settings, tmp_path, records, 13_748_414, "pystdlib", prediction=prediction
    )
    result.report = report
    result.non_embedding_report = fit_all(
        sweep.runs_of(records, non_embedding=True), 2e13, bootstrap=0, refine=4
    )
    for key in ("approach2", "approach3"):
        assert result.report.laws[key].a == pytest.approx(law.a, abs=0.08), key
    result.plot = sweep.plot_sweep(result, tmp_path / "scaling.png")
    text = sweep.sweep_report(result)
    assert "4 of 4 budgets have their minimum inside the sizes tried." in text
    assert "(target ≤ 0.1)" in text and "With Kaplan's non-embedding N instead" in text
    assert f"| 2e+13 (held-out) | {held[0].shape.n_layer} × {held[0].shape.n_embd} |" in text
    last = records[-2]  # the largest held-out size, one seed
    error = abs(last["loss"] - last["predicted_loss"]) / last["loss"]
    assert f"{(last['loss'] - last['predicted_loss']) / last['loss']:+.2%} |" in text
    assert error < 0.02
    # the seeds: 13 pairs, one run's s.d. from their differences, and the held-out best as its seeds' mean
    pairs = sweep.seed_pairs(records)
    assert len(pairs) == 3 * 4 + 1
    sd = math.sqrt(sum((b - a) ** 2 for _, a, b in pairs) / (2 * len(pairs)))
    assert f"({len(pairs)} points)" in text and f"standard deviation of {sd:.3f} nats" in text
    assert (
        text.count("| 1 | ") == len(pairs) + 1
    )  # the seed column: the runs, and the held-out table's 2nd seed
    best = min(sweep.runs_of(records, heldout=True), key=lambda r: r.loss)
    seeds = [r["loss"] for r in records if r["heldout"] and r["parameters"] == best.params]
    assert best.loss == pytest.approx(sum(seeds) / len(seeds))
    assert (
        f"measured {best.loss:.4f}, the mean of its 2 seeds ({seeds[0]:.4f}, {seeds[1]:.4f})"
        if len(seeds) == 2
        else f"measured {best.loss:.4f}, one seed"
    ) in text
    assert (
        "epochs, so the longest runs repeat data." in text and "tokens here, " in text
    )  # epochs, WSD arithmetic
    assert (
        f"{len(records)} runs, {len(records)} run-seconds." in text
    )  # 1 s each: 20, 12 and 4 runs, 2 at a time
    assert sweep.wall_seconds(settings, records) == 10 + 6 + 2
    assert (tmp_path / "scaling.png").stat().st_size > 20_000


def test_load_runs_reads_a_sweeps_final_jsonl(tmp_path):
    settings = sweep.SweepSettings()
    records, record = _sweep_records(settings, scaling.ChinchillaFit(1.2, 40.0, 250.0, 0.33, 0.33))
    records.append(record(sweep.plan_heldout(settings, 5e4)[0]))
    runs = load_runs(_write_jsonl(tmp_path / "final.jsonl", records))
    assert len(runs) == len(records) - 1  # the held-out line is left out of fits
    assert sorted({r.budget for r in runs}) == sorted(
        settings.budgets
    )  # grouped by budget, not by 6·N·D


@pytest.mark.parametrize(
    "losses, verdict",
    [
        ((5.10, 5.12, 5.00, 5.01), "Deduplication helped beyond"),
        ((5.01, 5.03, 5.00, 5.02), "No effect beyond 3"),
        ((4.90, 4.91, 5.00, 5.01), "scored better, beyond"),
    ],
)
def test_dedup_effect_verdict_follows_the_numbers(losses, verdict):
    rows = [
        {
            "corpus": c,
            "seed": i % 2,
            "train_tokens": t,
            "tokens_trained": 600_000,
            "held_out_loss": loss,
            "held_out_bpb": loss / 1.5,
            "held_out_tokens": 40_000,
        }
        for i, (c, t, loss) in enumerate(
            zip(
                ["with_duplicates"] * 2 + ["deduplicated"] * 2,
                [900_000] * 2 + [600_000] * 2,
                losses,
            )
        )
    ]
    result = {
        "settings": {
            **dataclasses.asdict(sweep.DedupEffectSettings()),
            "shape": "L1-d32",
            "seeds": 2,
        },
        "train_documents": 300,
        "repeated_documents": 3,
        "copies": 150,
        "copies_removed": 150,
        "originals_dropped": 0,
        "held_out_documents": 33,
        "parameters": 29_792,
        "lr": 0.006,
        "rows": rows,
    }
    text = sweep.dedup_effect_report(result)
    assert verdict in text
    summary = sweep.dedup_effect_summary(rows)
    assert f"= {summary['sigmas']:.1f} seed standard deviations" in text
    assert "3 of 300 train documents (1.0%) were each repeated 50 times" in text
    assert ("the copies are 33% of the training tokens" in text.lower()) == (
        verdict == "Deduplication helped beyond"
    )


def test_sweep_cli_checks_the_design_before_training():
    r = cli("sweep", "--budgets", "1e10", "--out-dir", "out/never")
    assert r.returncode == 2 and "at least 2 different compute budgets" in r.stderr
    r = cli("sweep", "--sizes", "2", "--out-dir", "out/never")
    assert r.returncode == 2 and "--sizes" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("sweep", "--sizes", "3", "--second-seeds", "4", "--out-dir", "out/never")
    assert r.returncode == 2 and r.stderr.strip() == (
        "scaling.py: error: --second-seeds 4: give 0 (one seed) to 3 (every size of a budget)"
    ), r.stderr
    assert not (sweep.ROOT / "out" / "never").exists()


@pytest.mark.slow
@pytest.mark.long
def test_quick_sweep_and_dedup_effect_end_to_end(tmp_path):
    """Real train.py runs (tiny): final.jsonl keeps its contract, the report and plot are written, finished runs
    are reused; the dedup experiment finds the repeated copies and scores every seed."""
    args = ["sweep", "--quick", "--out-dir", str(tmp_path / "sw")]
    r = cli(*args, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    records = [
        json.loads(line) for line in (tmp_path / "sw" / "final.jsonl").read_text().splitlines()
    ]
    for record in records:
        assert {
            "parameters",
            "non_embedding_parameters",
            "tokens",
            "compute",
            "budget",
            "loss",
            "heldout",
        } <= set(record)
        assert record["compute"] == 6 * record["parameters"] * record["tokens"]
        assert record["command"].startswith("OMP_NUM_THREADS=1 python train.py ")
    held = sum(r["heldout"] for r in records)  # tiny runs may show no law to predict with
    assert (
        held in (0, 4) and len(records) == 6 + 2 + held
    )  # + each budget's best size, and the held-out's, again
    assert sorted(r["seed"] for r in records) == [0] * (6 + max(0, held - 1)) + [1] * (
        2 + min(1, held)
    )
    assert (tmp_path / "sw" / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    report = (tmp_path / "sw" / "REPORT.md").read_text()
    assert "## Prediction of the held-out budget" in report and (held or "No prediction:" in report)
    assert sweep.QUICK_NOTE in report and sweep.QUICK_NOTE in r.stderr  # issue 38
    assert "Regenerate: `python scaling.py sweep --quick` (reuses" in report
    again = cli(*args, timeout=900)
    assert again.returncode == 0 and again.stderr.count(" s, reused)") == 6 + 2 + held

    r = cli("dedup-effect", "--quick", "--out-dir", str(tmp_path / "dd"), timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads((tmp_path / "dd" / "result.json").read_text())
    assert result["copies_removed"] >= 0.9 * result["copies"]  # dedup.py finds the repeated copies
    assert sorted((row["corpus"], row["seed"]) for row in result["rows"]) == [
        ("deduplicated", 0),
        ("deduplicated", 1),
        ("with_duplicates", 0),
        ("with_duplicates", 1),
    ]
    assert all(math.isfinite(row["held_out_loss"]) for row in result["rows"])


def test_a_sweep_too_long_for_this_cpu_is_refused_up_front_with_the_flag_that_allows_it(tmp_path):
    """The issue's case: --quick with budgets 1e15 3e15 once ran for hours without a word. Now such budgets are a
    design the family cannot cover (one line), and a design too long for --max-hours names the flag that allows it."""
    r = cli("sweep", "--quick", "--budgets", "1e15", "3e15", "--out-dir", str(tmp_path / "never"))
    assert (
        r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--budgets" in r.stderr
    ), r.stderr
    r = cli("sweep", "--max-hours", "0.5", "--out-dir", str(tmp_path / "never"))
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "would take about 1.4 hours on this CPU" in r.stderr and "--max-hours 3" in r.stderr
    assert not (tmp_path / "never").exists()
    assert (
        0.5 < sweep.check_design(sweep.SweepSettings(), max_hours=2) <= 1.5
    )  # the default sweep passes
    with pytest.raises(ScalingError, match="hours on"):
        sweep.dedup_effect(
            dataclasses.replace(sweep.DedupEffectSettings(), tokens=10**9), tmp_path / "dd"
        )
    assert not (tmp_path / "dd").exists()


def test_a_short_estimate_is_said_in_minutes_not_about_0_hours(tmp_path):
    """Under an hour the refusal said "about 0 hours": minutes now (sweep.about's doctest has the rest)."""
    with pytest.raises(ScalingError, match=r"would take about \d+ minutes? on this CPU"):
        sweep.dedup_effect(sweep.DedupEffectSettings(), tmp_path / "dd", max_hours=0.01)
    assert not (tmp_path / "dd").exists()


def test_the_gpu_plan_is_refused_without_a_gpu_before_any_output(tmp_path):
    r = cli("sweep", "--device", "cuda", "--out-dir", str(tmp_path / "never"))
    assert r.returncode == 2 and r.stderr.strip() == (
        "scaling.py: error: --device cuda: no CUDA device here; use cpu (or auto)"
    ), r.stderr
    assert not (tmp_path / "never").exists()


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    import data
    from machinery import dataset

    root = tmp_path_factory.mktemp("sweep-data")
    corpus = root / "corpus.txt"
    words = "the parser reads a list of tokens and writes every item into the module while this loop counts".split()
    corpus.write_text(
        "\n\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(80)) for i in range(60))
    )
    return dataset.prepare(
        [str(corpus)],
        root / "data",
        vocab_size=300,
        val_fraction=0.2,
        clean_settings=data.CleanSettings(filters="none", near_dup_threshold=0, mask_pii=False),
    )


def _damage(kind, good, folder):
    """A copy of a prepared dataset with one kind of damage."""
    import shutil

    shutil.copytree(good, folder)
    shard = next(folder.glob("train_*.bin"))
    if kind == "no manifest":
        (folder / "manifest.json").unlink()
    elif kind == "manifest not JSON":
        (folder / "manifest.json").write_text('{"splits": ')
    elif kind == "manifest nested deep":
        (folder / "manifest.json").write_text("[" * 5000)
    elif kind == "truncated shard":
        shard.write_bytes(shard.read_bytes()[:100])
    elif kind == "ids beyond the vocabulary":
        raw = bytearray(shard.read_bytes())
        raw[-64:] = b"\xff" * 64  # same size, so only the token values are wrong
        shard.write_bytes(bytes(raw))
    return folder


@pytest.mark.parametrize(
    "kind",
    [
        "no manifest",
        "manifest not JSON",
        "manifest nested deep",
        "truncated shard",
        "ids beyond the vocabulary",
        "missing file",
    ],
)
def test_a_bad_dataset_is_one_line_naming_data_before_any_output(
    kind, tiny_dataset, tmp_path, capsys
):
    """Each was a traceback, or a failure after the out-dir (and runs' logs) had been written."""
    data_arg = (
        tmp_path / "nosuch.txt"
        if kind == "missing file"
        else _damage(kind, tiny_dataset, tmp_path / "ds")
    )
    code = command.main(
        ["sweep", "--quick", "--data", str(data_arg), "--out-dir", str(tmp_path / "out")]
    )
    out, err = capsys.readouterr()
    assert code == 2 and not out and len(err.strip().splitlines()) == 1, err
    assert f"--data {data_arg}" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(
    not pathlib.Path("/proc/self").is_dir(),
    reason="needs Linux's /proc (a folder no one can mkdir in)",
)
def test_an_out_dir_that_cannot_be_made_is_one_line(capsys):
    """Where os.access says yes (as root: /proc) the argparse check passes; making the folder is the real test."""
    try:
        code = command.main(["sweep", "--quick", "--out-dir", "/proc/sweep-test"])
    except SystemExit as e:  # argparse already refused it (not root)
        code = e.code
    err = capsys.readouterr().err
    assert (
        code == 2
        and len(err.strip().splitlines()) == 1
        and "--out-dir" in err
        and "Traceback" not in err
    )


def test_train_or_reuse_keeps_finished_runs_and_a_diverged_one_only_where_it_is_a_result(
    tmp_path, monkeypatch
):
    """The sweep's and the recipe's runs go through one function: a finished run of the same command
    is reused, a changed command retrains, and a run without a finite loss is kept only where that
    is a result (the recipe's stability runs), never as a sweep point."""
    calls = []

    def fake_train(cmd, log_path, threads=1):
        calls.append(cmd[-1])
        loss = float(cmd[-1])  # the stub's "command" ends with the loss it will log
        (log_path.parent / "metrics.jsonl").write_text(json.dumps({"step": 10, "val_loss": loss}))

    monkeypatch.setattr(sweep, "_run_train", fake_train)
    run_dir = tmp_path / "runs" / "a"
    assert sweep.train_or_reuse(["train.py", "4.5"], run_dir, 10, 1)[::2] == (4.5, False)
    assert sweep.train_or_reuse(["train.py", "4.5"], run_dir, 10, 1)[::2] == (4.5, True)
    assert sweep.train_or_reuse(["train.py", "4.25"], run_dir, 10, 1)[::2] == (4.25, False)
    assert calls == ["4.5", "4.25"]
    with pytest.raises(ScalingError, match="a: train.py wrote no final validation loss"):
        sweep.train_or_reuse(["train.py", "nan"], run_dir, 10, 1)
    assert not run_dir.exists()  # the diverged sweep point left nothing to reuse
    kept = sweep.train_or_reuse(["train.py", "nan"], run_dir, 10, 1, diverged_ok=True)
    assert kept[::2] == (None, False) and (run_dir / "command.json").is_file()
    again = sweep.train_or_reuse(["train.py", "nan"], run_dir, 10, 1, diverged_ok=True)
    assert again[::2] == (None, True) and calls == ["4.5", "4.25", "nan", "nan"]
    with pytest.raises(ScalingError, match="no final validation loss"):  # never a sweep point
        sweep.train_or_reuse(["train.py", "nan"], run_dir, 10, 1)
    assert calls[-1] == "nan" and len(calls) == 5 and not run_dir.exists()


@pytest.mark.parametrize("fail_at", [0, 2])
def test_a_failed_run_stops_the_sweep_and_leaves_only_finished_runs(
    fail_at, tiny_dataset, tmp_path, monkeypatch
):
    """train.py is replaced by a stub that writes the final evaluation, and fails at run `fail_at`: the queue
    stops there, the failed run's folder is removed, finished runs stay for a rerun, and an output folder the
    sweep made and that holds no finished run is removed."""
    calls = []

    def fake_train(cmd, log_path, threads=1):
        calls.append(log_path.parent.name)
        log_path.write_text("step 1\ntrain.py: error: something broke\n")
        if len(calls) - 1 == fail_at:
            raise ScalingError(
                f"train.py failed (exit 2) in {log_path.parent.name}: train.py: error: something broke"
            )
        steps = int(cmd[cmd.index("--max-steps") + 1])
        (log_path.parent / "metrics.jsonl").write_text(
            json.dumps({"step": steps, "val_loss": 5.0}) + "\n"
        )

    monkeypatch.setattr(sweep, "_run_train", fake_train)
    settings = dataclasses.replace(sweep.QUICK_SWEEP, data=str(tiny_dataset), workers=1)
    dataset = sweep.open_dataset(
        str(tiny_dataset)
    )  # the plan sweep() makes: this vocabulary, 2 epochs
    plan = sweep.plan_isoflop(
        dataclasses.replace(settings, vocab_size=300, max_run_tokens=sweep._two_epochs(dataset))
    )
    longest_first = sorted(
        plan, key=lambda r: -sweep.run_seconds(settings, r)
    )  # the order they start in
    assert longest_first != plan
    finished = sorted(r.name for r in longest_first[:fail_at])
    with pytest.raises(ScalingError, match="something broke"):
        sweep.sweep(settings, tmp_path / "out", log=lambda m: None)
    assert len(calls) == fail_at + 1  # nothing ran after the failure
    if finished:
        assert sorted(p.name for p in (tmp_path / "out" / "runs").iterdir()) == finished
        assert all(
            (tmp_path / "out" / "runs" / name / "command.json").is_file() for name in finished
        )
    else:
        assert not (tmp_path / "out").exists()


def test_cli_bad_input_is_one_line_exit_2():
    """As a script (flags judged alone are rows of tests/test_cli.py)."""
    r = cli("sweep", "--budgets", "1e15", "1e16", "--out-dir", "out/never")
    assert r.returncode == 2
    assert "choose other --budgets" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not (sweep.ROOT / "out" / "never").exists()


def tiny_settings(**changes) -> sweep.SweepSettings:
    """The quick design on the tiny dataset (a 300-token BPE): batches of 2 x 16 tokens, one run at
    a time."""
    tiny = dict(vocab_size=300, block_size=16, batch_sizes=(2,), min_steps=10, eval_windows=8)
    return dataclasses.replace(sweep.QUICK_SWEEP, workers=1, **tiny, **changes)


def test_a_recorded_point_reruns_alone_to_the_same_loss(tiny_dataset, tmp_path):
    """final.jsonl's `command` is the whole run: pasted into a shell (from the project folder) it trains the
    same model on the same batches and ends at the same loss, bit for bit, on a CPU."""
    settings = tiny_settings()
    shape = sweep.Shape(2, 32)
    run = sweep.plan_run(6.0 * shape.counts(300)[0] * 40 * 2 * 16, shape, settings)
    assert (run.steps, run.batch_size) == (40, 2)
    [record] = sweep.execute_runs(
        settings, [run], tiny_dataset, tmp_path / "sweep", log=lambda m: None
    )
    assert record["command"].startswith("OMP_NUM_THREADS=1 python train.py --data ")
    env = dict(
        os.environ, PATH=f"{pathlib.Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    )
    env.pop("OMP_NUM_THREADS", None)
    done = subprocess.run(
        ["bash", "-c", record["command"]],
        cwd=sweep.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    again = sweep.final_val_loss(
        tmp_path / "sweep" / "runs" / run.name / "metrics.jsonl", run.steps
    )
    assert again == record["loss"]


def test_output_folder_is_absolute_so_train_py_writes_where_the_sweep_reads(tmp_path, monkeypatch):
    """train.py runs with the project folder as its working directory: a relative --out-dir given
    from elsewhere must reach it as the same folder (a run from /tmp once found no validation loss)."""
    monkeypatch.chdir(tmp_path)
    with sweep.output_folder("rel") as out:
        assert out == tmp_path / "rel" and out.is_absolute()


def test_wsd_gives_a_size_one_batch_and_makes_each_point_a_branch_of_its_trunk(tmp_path):
    """--schedule wsd: a size keeps its smallest budget's batch at every budget, so all its points
    share one trunk; each point resumes the trunk's checkpoint at the step train.wsd_lr starts
    decaying, with the warmup the trunk had."""
    import train

    settings = dataclasses.replace(sweep.SweepSettings(), schedule="wsd")
    plan = sweep.plan_isoflop(settings)
    by_size: dict = {}
    for run in plan:
        by_size.setdefault(run.shape, set()).add(run.batch_size)
    assert all(len(batches) == 1 for batches in by_size.values())
    assert max(len([r for r in plan if r.shape == s]) for s in by_size) >= 3  # 3 budgets, 1 trunk
    warmups = set()
    for run in plan:
        cmd = sweep.train_command(settings, run, "/data/x", tmp_path / "runs" / run.name)
        value = lambda flag: cmd[cmd.index(flag) + 1]
        start = sweep.decay_start(settings, run.steps)
        trunk = tmp_path / "runs" / f"trunk-{run.shape.name}-s0"
        assert value("--resume") == str(trunk / f"ckpt_{start:07d}.pt")
        assert (value("--schedule"), value("--decay-fraction")) == ("wsd", "0.2")
        assert "--overwrite" not in cmd  # a resumed run starts in an emptied folder instead
        # the branch's first step, `start`, is the first the schedule decays at (its lr is still
        # the peak: the decay's progress is 0 there)
        w = int(value("--warmup-steps"))
        lr = [train.wsd_lr(t, 1.0, w, run.steps, 0.1, 0.2) for t in (start - 1, start, start + 1)]
        assert lr[0] == lr[1] == 1.0 > lr[2]
        warmups.add(w)
        stable = sweep.trunk_command(settings, run, start, "/data/x", trunk)
        trunk_value = lambda flag: stable[stable.index(flag) + 1]
        assert (trunk_value("--decay-fraction"), trunk_value("--max-steps")) == ("0", str(start))
        assert trunk_value("--warmup-steps") == str(w) and "--resume" not in stable
    assert warmups == {40}  # 5% of min_steps: the trunk's, whatever the branch's length
    trunk.mkdir(parents=True)
    (trunk / "ckpt_0000100.pt").write_bytes(b"")
    assert sweep.trunk_command(settings, run, start, "/data/x", trunk)[-1] == "--resume"


def test_a_wsd_branch_equals_one_straight_wsd_run_and_the_trunk_is_extended(tiny_dataset, tmp_path):
    """Two points of one size under --schedule wsd: the trunk trains to the first point's decay
    start, is resumed to the second's, and each branch ends at the loss of one uninterrupted WSD run
    of its length, bit for bit on a CPU (train.py's resume is exact). The report counts the tokens."""
    settings = tiny_settings(schedule="wsd", budgets=(1.0,))
    shape = sweep.Shape(2, 32)
    per_step = 6.0 * shape.counts(300)[0] * 2 * 16
    runs = [sweep.plan_run(per_step * steps, shape, settings) for steps in (20, 40)]
    assert [(r.steps, r.batch_size) for r in runs] == [(20, 2), (40, 2)]
    records = sweep.execute_runs(settings, runs, tiny_dataset, tmp_path / "sweep", lambda m: None)
    trunk = tmp_path / "sweep" / "runs" / "trunk-L2-d32-s0"
    assert sorted(p.name for p in trunk.glob("ckpt_*.pt")) == ["ckpt_0000016.pt", "ckpt_0000032.pt"]
    assert "resumed from" in (trunk / "train-32.log").read_text()
    # the longer point against one run of 40 steps with the same schedule, never interrupted
    straight = sweep._command(settings, runs[1], 40, tiny_dataset, tmp_path / "straight")
    sweep._run_train(straight + ["--schedule", "wsd", "--decay-fraction", "0.2"], tmp_path / "log")
    loss = sweep.final_val_loss(tmp_path / "straight" / "metrics.jsonl", 40)
    assert records[1]["loss"] == loss and records[1]["trunk"] == "trunk-L2-d32-s0"
    assert records[0]["loss"] > loss  # 20 steps: a branch of its own, not the longer run's
    result = sweep.SweepResult(settings, tmp_path / "sweep", records, 0, "tiny")
    line = sweep.annealing_line(result)
    # trunk: 32 steps x 2 x 16 = 1,024 tokens; branches 4 + 8 steps = 384; cosine 20 + 40 = 1,920
    assert "1 trunks of 1,024 tokens in all" in line and "(384 tokens): 1,408 tokens" in line
    assert "reads 1,920 (27% less)" in line
