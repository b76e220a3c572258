"""Tests for machinery/recipe.py: the plan's train.py commands (shared runs, WSD branches that resume
from checkpoints the stable run writes), the report's arithmetic from a known result, and (marked long)
`python scaling.py recipe --quick` end to end."""

import dataclasses
import json
import math
import pathlib
import subprocess
import sys

import pytest

from machinery import recipe, sweep

SETTINGS = recipe.RecipeSettings()


def test_docstring_examples():
    import doctest

    assert doctest.testmod(recipe).failed == 0


def flag(job, name):
    """The value a job's flags give `name` (the last one: argparse keeps the last)."""
    flags = list(job.flags)
    return [flags[i + 1] for i, f in enumerate(flags) if f == name][-1]


def test_every_comparison_shares_its_baseline_run_and_every_name_is_one_command(tmp_path):
    best, best_default = {"adamw": 4e-3, "muon": 8e-3}, {"adamw": 2e-3, "muon": 1.6e-2}
    first = recipe.grid_jobs(SETTINGS)
    second = recipe.second_jobs(SETTINGS, best, best_default)
    third = recipe.branch_jobs(SETTINGS, best["adamw"], tmp_path)
    jobs = list(first["width"].values()) + second["stable"]
    for group in ("optimizer", "default"):
        jobs += [j for runs in first[group].values() for j in runs.values()]
    for group in ("optimizer", "default", "stability", "cosine"):
        jobs += [j for runs in second[group].values() for j in runs]
    jobs += [j for runs in third.values() for j in runs]
    commands = {}
    for job in jobs:
        cmd = recipe.command(SETTINGS, job, "data", tmp_path / job.name) + list(job.flags)
        assert commands.setdefault(job.name, cmd) == cmd, job.name  # one name, one run
    # The plain run at the best rate, seed k, is the optimizer experiment's run and the cosine run
    # of the full length: trained once, compared three times.
    plain = second["stability"][("plain", 4e-3)]
    assert plain == second["optimizer"]["adamw"] == second["cosine"][SETTINGS.steps]
    assert plain[0] == first["optimizer"]["adamw"][4e-3]
    too_high = second["stability"][("QK-norm", 4e-3 * SETTINGS.high_lr_factor)]
    assert [j.model_args for j in too_high] == ["qk_norm=True"] * SETTINGS.seeds
    assert [flag(j, "--lr") for j in too_high] == ["0.032"] * SETTINGS.seeds
    # At width 64 the rule multiplies by 64 / 64: both rules' runs are the grid's (1e-3 is new).
    assert first["width"][(64, "rule", 4e-3)] == first["width"][(64, "plain", 4e-3)] == plain[0]
    assert flag(first["width"][(256, "rule", 4e-3)], "--lr-base-width") == "64"
    # The default model's runs are `python train.py` with the optimizer, rate and seed changed: no
    # model, data-shape or schedule flag but the ones every run sets to train.py's own defaults.
    default = second["default"]["muon"][1]
    cmd = recipe.command(SETTINGS, default, "data", tmp_path) + list(default.flags)
    assert "--model" not in cmd and "--model-args" not in cmd and "--warmup-steps" not in cmd
    assert flag(default, "--optimizer") == "muon" and flag(default, "--lr") == "0.016"
    assert cmd[cmd.index("--batch-size") + 1] == "16" and cmd[cmd.index("--max-steps") + 1] == "600"
    # the grid 10, widths 1 + 2 x 8, stable runs 3, two more seeds of each optimizer 4, stability
    # 24 less the 3 at the best rate and the seed 0 at 8 x 4e-3 = 0.032 (on the grid), the shorter
    # cosine runs 6, branches 12; the default model's grids 4 + 5 and its other seeds 4
    assert len({j.name for j in jobs}) == 10 + 17 + 3 + 4 + 20 + 6 + 12 + 9 + 4


def test_the_default_models_runs_are_train_pys_defaults():
    """The recipe's idea of train.py's default (steps, batch) is train.py's, and the AdamW grid
    holds train.py's default rate, so the tuned baseline is at least the default run."""
    import train

    defaults = train.TrainConfig()
    assert SETTINGS.default_steps == defaults.max_steps
    assert SETTINGS.default_batch_size == defaults.batch_size
    assert SETTINGS.default_data == defaults.data and defaults.model == "tiny"
    assert defaults.lr in dict(SETTINGS.default_lrs)["adamw"]


def test_each_wsd_branch_resumes_a_checkpoint_the_stable_run_keeps_and_decays_from_there(tmp_path):
    import train

    second = recipe.second_jobs(SETTINGS, {"adamw": 4e-3, "muon": 4e-3}, {})
    stable = second["stable"][1]
    interval, keep = int(flag(stable, "--ckpt-interval")), int(flag(stable, "--keep-checkpoints"))
    kept = set(range(stable.steps, stable.steps - interval * keep, -interval))
    assert flag(stable, "--decay-fraction") == "0" and flag(stable, "--schedule") == "wsd"
    for (length, floor), jobs in recipe.branch_jobs(SETTINGS, 4e-3, tmp_path).items():
        branch = jobs[1]
        resumed = pathlib.Path(flag(branch, "--resume"))
        step = int(resumed.stem.split("_")[1])
        assert resumed.parent.name == stable.name and step in kept
        cfg = train.TrainConfig(
            lr=4e-3,
            warmup_steps=SETTINGS.warmup_steps,
            max_steps=length,
            schedule="wsd",
            decay_fraction=float(flag(branch, "--decay-fraction")),
            min_lr_ratio=float(flag(branch, "--min-lr-ratio")),
        )
        # the stable run's rate up to the branch point, then down to the floor at the end
        assert train.lr_at(step - 1, cfg) == train.lr_at(step, cfg) == 4e-3
        assert train.lr_at(step + 1, cfg) < 4e-3
        assert math.isclose(train.lr_at(length, cfg), 4e-3 * floor)


def test_guard_events_count_skips_and_rollbacks(tmp_path):
    lines = [{"step": 1, "loss": 3.0}, {"event": "skipped_batch"}, {"event": "rollback"}, {"x": 1}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert recipe.guard_events(tmp_path) == 2 and recipe.guard_events(tmp_path / "none") == 0


def test_a_run_that_fails_stops_the_experiment_and_leaves_no_folder(tmp_path):
    s = dataclasses.replace(recipe.QUICK_RECIPE, workers=1)
    bad = recipe.Job("bad", ("--no-such-flag",), 2)
    with pytest.raises(recipe.ScalingError, match="train.py failed .* in bad: .*no-such-flag"):
        recipe.run_jobs(s, [bad], {"recipe": tmp_path / "data"}, tmp_path, log=print)
    assert not (tmp_path / "runs" / "bad").exists()


def test_a_diverged_run_is_a_result_kept_and_reused(tmp_path, monkeypatch):
    """A run whose loss is not finite (the stability section's 8x rates) is a result, not a failure:
    logged as diverged, kept, and reused by a rerun."""
    calls, logged = [], []

    def diverging_train(cmd, log_path, threads=1):
        calls.append(log_path.parent.name)
        steps = int(cmd[cmd.index("--max-steps") + 1])
        (log_path.parent / "metrics.jsonl").write_text(
            json.dumps({"step": steps, "val_loss": None})
        )

    monkeypatch.setattr(recipe.sweep, "_run_train", diverging_train)
    s = dataclasses.replace(recipe.QUICK_RECIPE, workers=1)
    job = recipe.Job("hot", (), 2)
    for _ in range(2):
        losses = recipe.run_jobs(s, [job], {"recipe": tmp_path / "data"}, tmp_path, logged.append)
        assert losses == {"hot": None}
    assert calls == ["hot"] and logged == ["hot: loss diverged (0 s)"]


def known_result():
    """A result.json with round numbers: Muon 0.1 nats lower with seed SDs 0.01 and 0.02."""
    s = dataclasses.asdict(dataclasses.replace(SETTINGS, lrs=(2e-3, 4e-3), widths=(64, 256)))
    stability = []
    # penalties: plain 0.45, 0.5, 0.55 (SD 0.05); QK-norm 0.1 each
    for tool, high in (("plain", [3.45, 3.6, 3.75]), ("QK-norm", [3.1, 3.2, 3.3])):
        stability.append(
            {
                "tool": tool,
                "lr": 4e-3,
                "losses": [3.0, 3.1, 3.2],
                "logits": [9, 11, 10],
                "guard": [0, 0, 0],
            }
        )
        stability.append(
            {
                "tool": tool,
                "lr": 3.2e-2,
                "losses": high,
                "logits": [30, None, 20],
                "guard": [2, 0, 1],
            }
        )
    return {
        "settings": s,
        "runs": 30,
        "train_minutes": 41.5,
        "minutes": 21.0,
        "best_lr": {"adamw": 4e-3, "muon": 2e-3},
        "grid": {"adamw": {"0.002": 3.3, "0.004": 3.2}, "muon": {"0.002": 3.1, "0.004": None}},
        "seeds": {"adamw": [3.19, 3.2, 3.21], "muon": [3.08, 3.1, 3.12]},
        "default": {
            "best_lr": {"adamw": 2e-3, "muon": 8e-3},
            "grid": {"adamw": {"0.001": 4.4, "0.002": 4.3}, "muon": {"0.004": 4.2, "0.008": 4.0}},
            "seeds": {"adamw": [4.29, 4.3, 4.31], "muon": [4.0, 4.0, 4.0]},
        },
        "stability": stability,
        "wsd": {
            "200": {"cosine": [3.49, 3.5, 3.51], "branch": [3.51, 3.52, 3.53]},
            "400": {"cosine": [3.2, 3.2, 3.2], "branch": [3.2, 3.21, 3.22]},
        },
        "wsd_to_zero": [3.17, 3.18, 3.19],
        "wsd_stable": [3.4, 3.4, 3.4],
        "width": [
            {"width": w, "rule": rule, "lr": lr, "loss": loss}
            for w, rule, lr, loss in [
                (64, "plain", 2e-3, 3.3),
                (64, "plain", 4e-3, 3.2),
                (256, "plain", 2e-3, 3.0),
                (256, "plain", 4e-3, 3.25),
                (64, "rule", 2e-3, 3.3),
                (64, "rule", 4e-3, 3.2),
                (256, "rule", 2e-3, 3.1),
                (256, "rule", 4e-3, 2.9),
            ]
        ],
    }


def test_report_computes_each_effect_from_the_runs():
    report = recipe.recipe_report(known_result())
    assert (
        "30 runs, 41.5 minutes of training, 2 side by side: about 21 minutes from scratch" in report
    )
    # gap 3.2 - 3.1 = 0.1 over the larger SD 0.02: 5 sigma, a win
    assert "**Muon is 0.1000 nats lower = 5.0 seed standard deviations**" in report
    assert "Muon trains this model lower than the tuned AdamW, beyond the seed noise." in report
    assert "| 0.004 | 3.2000 | diverged |" in report
    # the default model: each optimizer its own grid (a dash where the other has no such rate);
    # 4.3 - 4.0 over the larger SD 0.01 = 30 sigma; both best rates sit at their grid's edge
    default = report[: report.index("### The recipe's model")]
    assert "| 0.001 | 4.4000 | - |" in default and "| 0.004 | - | 4.2000 |" in default
    assert "**Muon is 0.3000 nats lower = 30.0 seed standard deviations**" in default
    assert "AdamW's best rate is its grid's edge" in default
    assert "Muon's best rate is its grid's edge" in default
    recipe_model = report[report.index("### The recipe's model") : report.index("## 2.")]
    assert "AdamW's best rate is its grid's edge" in recipe_model  # 0.004 of 0.002, 0.004
    assert "Muon's best rate" in recipe_model  # 0.002, also an edge
    assert (
        "| plain | 3.1000 ± 0.1000 | 3.6000 ± 0.1500 | 0.5000 ± 0.0500 | 10.0 | 25.0 | 3 |"
        in report
    )
    assert (
        "- QK-norm: the penalty changes by -0.4000 nats (-8.0 seed SDs); the loss at the best rate "
        "by +0.0000 nats (+0.0 seed SDs)."
    ) in report
    assert "| 200 | 3.5000 ± 0.0100 | 3.5200 ± 0.0100 | 0.0200 ± 0.0000 | 0 of 3 |" in report
    # cosine 200 + 400 = 600 steps; WSD: stable to 320, branches 40 + 80
    assert "the stable run and its branches 440 (320 + 120), 27% fewer" in report
    assert "trade places from seed to seed" in report  # the full length's first seed ties
    lower = known_result()
    for row in lower["wsd"].values():
        row["branch"] = [x - 0.05 for x in row["cosine"]]
    assert "Every branch ends below" in recipe.recipe_report(lower)
    assert "3.1800 ± 0.0100, a change of -0.0300 nats (-3.0 seed SDs)" in report
    assert "| 256 | 0.002 | 3.0000 | 0.004 | 2.9000 |" in report
    assert "plain: width 64's best rate 0.004 used at width 256 costs +0.2500 nats" in report
    assert "rule: width 64's best rate 0.004 used at width 256 costs +0.0000 nats" in report
    tied = known_result()
    tied["seeds"]["muon"] = [3.17, 3.19, 3.21]
    assert "within 3 seed standard deviations" in recipe.recipe_report(tied)


def test_plot_draws_both_panels(tmp_path):
    pytest.importorskip("matplotlib")
    path = recipe.plot_recipe(known_result(), tmp_path / "recipe.png")
    assert path.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.long
def test_quick_recipe_end_to_end(tmp_path):
    """Real train.py runs (tiny): every run finishes, the branches resume their stable run, the
    stability runs are probed, the report and the plot are written; a rerun reuses every run."""
    out = tmp_path / "recipe"
    cmd = [
        sys.executable,
        str(sweep.ROOT / "scaling.py"),
        "recipe",
        "--quick",
        "--out-dir",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert None not in result["seeds"]["adamw"] + result["seeds"]["muon"] + result["wsd_stable"]
    for branch in (out / "runs").glob("wsd*-to*-s*"):
        assert "resumed from" in (branch / "train.log").read_text()
    assert all(len(row["logits"]) == 2 and row["logits"][0] > 0 for row in result["stability"])
    assert {row["rule"] for row in result["width"] if row["loss"] is not None} == {"plain", "rule"}
    report = (out / "REPORT.md").read_text()
    assert report.count("\n## ") == 4 and (out / "recipe.png").read_bytes()[:4] == b"\x89PNG"
    assert None not in result["default"]["seeds"]["adamw"] + result["default"]["seeds"]["muon"]
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "loss" not in again.stderr, again.stderr[-2000:]
