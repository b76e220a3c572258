"""Tests for scaling.py: every worked number of the lecture, the closed-form optimum against a numerical minimum,
the fitters against synthetic runs from known laws, and the bad-input messages."""

import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import scaling
from machinery import runs_file, scaling_reports
from machinery.commands import scaling as command
from machinery.runs_file import load_runs
from machinery.scaling_reports import fit_markdown
from scaling import (
    FITS,
    Run,
    ScalingError,
    activation_memory,
    chinchilla_loss,
    compute_optimal,
    fit_approach1,
    fit_approach2,
    fit_approach3,
    fit_all,
    isoflop_table,
    pipeline_bubble,
    plan_budget,
    synthetic_isoflop_runs,
    training_memory,
)

ROOT = pathlib.Path(scaling.__file__).resolve().parent


def cli(*args, timeout=120):
    return subprocess.run(
        [sys.executable, str(ROOT / "scaling.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_docstring_examples():
    import doctest

    for module in (scaling, runs_file, command):
        assert doctest.testmod(module).failed == 0, module.__name__


# --- the budget ----------------------------------------------------------------------------------------------------


def test_lecture_budget_chain():
    b = plan_budget(1.2e20)
    assert b.params == pytest.approx(1e9) and b.tokens == pytest.approx(2e10)
    assert b.steps == pytest.approx(40_000)
    assert b.seconds_one_gpu == pytest.approx(6e5)
    assert round(b.seconds_one_gpu / 3600) == 167 and round(b.seconds / 3600) == 21


def test_budgets_that_plan_less_than_one_parameter_token_or_step_are_refused():
    with pytest.raises(ScalingError, match="N = 0.408 parameters"):
        plan_budget(1e6, tokens_per_param=1e6)
    with pytest.raises(ScalingError, match="N = 9.13e-152 parameters"):
        plan_budget(1e-300)
    with pytest.raises(ScalingError, match="more than the whole run's D"):
        plan_budget(1e7)  # D = 5.8e3 tokens, one step of 5e5


@pytest.mark.parametrize(
    "compute, n, d", [(1e18, "9.1e+07", "1.8e+09"), (1.2e21, "3.2e+09", "6.3e+10")]
)
def test_lecture_exercises(compute, n, d):
    b = plan_budget(compute)
    assert (f"{b.params:.1e}", f"{b.tokens:.1e}") == (n, d)


def test_budget_cli_prints_the_chain_with_formulas():
    r = cli("budget", "1.2e20")
    assert r.returncode == 0, r.stderr
    for piece in (
        "C = 120·N²",
        "sqrt(1e+18) = 1e+09 parameters",
        "D = 20·N = 2e+10 tokens",
        "40,000 steps",
        "6e+05 s ≈ 167 h",
        "on 8 GPUs",
        "≈ 21 h",
    ):
        assert piece in r.stdout, piece


def test_budget_with_hardware_table_and_mfu():
    b = plan_budget(1.2e20, flops_per_gpu=scaling.GPUS["H100"].bf16_flops, mfu=0.4, gpus=8)
    assert b.achieved_flops == pytest.approx(989e12 * 0.4)
    assert b.seconds_one_gpu == pytest.approx(1.2e20 / (989e12 * 0.4))
    assert scaling.GPUS["A100"].bf16_flops == 312e12 and scaling.GPUS["H200"].memory_gb == 141


# --- the Chinchilla law ---------------------------------------------------------------------------------------------


def test_chinchilla_worked_point():
    h = FITS["hoffmann"]
    assert h.A / 1e9**h.alpha == pytest.approx(0.354, abs=5e-4)
    assert h.B / 2e10**h.beta == pytest.approx(0.536, abs=5e-4)
    assert round(chinchilla_loss(1e9, 2e10), 2) == 2.58


def test_isoflop_table_matches_lecture():
    rows = isoflop_table(1.2e20)
    assert [round(r.loss, 2) for r in rows] == [2.75, 2.62, 2.58, 2.64, 2.87]
    assert [round(r.tokens_per_param, 1) for r in rows] == [2000, 320, 20, 3.2, 0.2]
    assert all(6 * r.params * r.tokens == pytest.approx(1.2e20) for r in rows)


def test_optimum_and_optimal_losses():
    best = compute_optimal(1.2e20)
    assert f"{best.params:.0e}" == "7e+08" and 35 < best.tokens_per_param < 45
    assert [round(compute_optimal(c).loss, 2) for c in (1.2e19, 1.2e20, 1.2e21)] == [
        2.95,
        2.57,
        2.31,
    ]
    assert compute_optimal(1.2e20, tokens_per_param=20).params == pytest.approx(1e9)


@pytest.mark.parametrize("fit", ["hoffmann", "besiroglu"])
@pytest.mark.parametrize("compute", [1e18, 1.2e20, 5.76e23])
def test_closed_form_equals_numerical_minimum(fit, compute):
    n_grid = np.logspace(5, 14, 200_001)  # 9 decades, spacing 1e-4 decades
    losses = chinchilla_loss(n_grid, compute / (6 * n_grid), fit)
    numerical = n_grid[np.argmin(losses)]
    closed = compute_optimal(compute, fit=fit)
    assert closed.params == pytest.approx(numerical, rel=1e-3)
    assert closed.loss <= losses.min() + 1e-12


def test_besiroglu_replication_puts_chinchilla_at_its_real_size():
    # Chinchilla itself: 70B parameters on 1.4T tokens = 5.9e23 FLOPs (~5.76e23 as the paper counts).
    refit = compute_optimal(5.76e23, fit="besiroglu")
    rounded = compute_optimal(5.76e23, fit="hoffmann")
    assert 6e10 < refit.params < 8e10 and 15 < refit.tokens_per_param < 25
    assert rounded.params < 4e10  # the rounded constants miss it by half
    assert FITS["besiroglu"].a == pytest.approx(0.5126, abs=1e-4)


def test_kaplan_laws():
    assert scaling.KAPLAN["alpha_N"] == 0.076 and scaling.KAPLAN["alpha_D"] == 0.095
    assert scaling.KAPLAN["alpha_C"] == 0.050
    assert float(scaling.kaplan_optimal_params(scaling.PF_DAY)) == pytest.approx(1.3e9)
    ratio = float(scaling.kaplan_optimal_params(1e21) / scaling.kaplan_optimal_params(1e20))
    assert ratio == pytest.approx(10**0.73)
    assert float(scaling.kaplan_loss_params(8.8e13)) == pytest.approx(1.0)
    assert float(scaling.kaplan_loss_params(8.8e12)) == pytest.approx(10**0.076)
    assert float(scaling.kaplan_loss_data(5.4e13)) == pytest.approx(1.0)
    assert float(scaling.kaplan_loss_data(5.4e12)) == pytest.approx(10**0.095)
    assert float(scaling.kaplan_loss_compute(3.1e8 * scaling.PF_DAY)) == pytest.approx(1.0)
    assert float(scaling.kaplan_loss_compute(3.1e7 * scaling.PF_DAY)) == pytest.approx(10**0.050)


def test_tokens_per_param_verdicts():
    assert scaling.tokens_per_param_verdict(175e9, 300e9).startswith("under-trained (1.7:1")
    assert scaling.tokens_per_param_verdict(70e9, 1.4e12).startswith("compute-optimal range (20:1")
    assert "1875:1" in scaling.tokens_per_param_verdict(8e9, 15e12)
    assert "inference-optimal" in scaling.tokens_per_param_verdict(8e9, 15e12)


def test_trillion_exercise():
    text = scaling_reports.trillion_report()
    c = 6 * 1e12 * 2e13
    gpu_hours = c / (989e12 * 0.4) / 3600
    assert "C = 6·N·D = 1.2e+26 FLOPs" in text
    assert f"{gpu_hours:.3g} GPU-hours" in text
    assert f"{c / (6 * 1e12 * 37 / 671 * 2e13):.0f}× less" in text  # MoE: 671/37 ≈ 18×


# --- memory and pipelines ------------------------------------------------------------------------------------------


def test_zero_memory_matches_lecture():
    gb = [training_memory(7e9, 8, stage).total / 1e9 for stage in (0, 1, 2, 3)]
    assert gb == pytest.approx([112, 38.5, 26.25, 14])
    assert training_memory(7e9, 4, 3).total / 1e9 == pytest.approx(28)
    m = training_memory(7e9, 8, 1)
    assert (m.weights, m.grads, m.optimizer) == pytest.approx((14e9, 14e9, 10.5e9))
    with pytest.raises(ScalingError, match="ZeRO stage"):
        training_memory(7e9, 8, 4)


def test_activation_memory():
    shape = dict(n_layer=32, d_model=4096, n_head=32, seq_len=4096, micro_batch=1)
    plain = activation_memory(**shape)
    assert plain == 32 * 4096 * 4096 * 34
    assert activation_memory(**shape, flash_attention=False) == pytest.approx(
        32 * 4096 * 4096 * (34 + 5 * 32)
    )
    ckpt = activation_memory(**shape, checkpointing=True)
    assert ckpt == 32 * 2 * 4096 * 4096 + 4096 * 4096 * 34
    assert ckpt < plain / 10


def test_pipeline_bubble():
    assert round(pipeline_bubble(4, 16), 2) == 0.16
    assert pipeline_bubble(1, 8) == 0
    assert pipeline_bubble(8, 1) == pytest.approx(7 / 8)
    with pytest.raises(ScalingError, match="pipeline stages must be a whole number"):
        pipeline_bubble(0.5, 2)  # int(0.5) would be 0 stages and a bubble of -100%


# --- fitting -------------------------------------------------------------------------------------------------------


def test_approach3_recovers_a_noise_free_law_exactly():
    runs = synthetic_isoflop_runs("besiroglu", noise=0.0)
    fit = fit_approach3(runs, refine=8)
    truth = FITS["besiroglu"]
    assert (fit.E, fit.A, fit.B, fit.alpha, fit.beta) == pytest.approx(
        (truth.E, truth.A, truth.B, truth.alpha, truth.beta), rel=1e-3
    )


@pytest.mark.parametrize("law, seed", [("besiroglu", 0), ("hoffmann", 1)])
def test_fitters_recover_known_laws_from_noisy_runs(law, seed):
    runs = synthetic_isoflop_runs(law, noise=0.01, seed=seed)  # 1% multiplicative noise on the loss
    truth = FITS[law]
    fit = fit_approach3(runs, refine=8)
    assert fit.alpha == pytest.approx(truth.alpha, abs=0.05)
    assert fit.beta == pytest.approx(truth.beta, abs=0.05)
    assert fit.E == pytest.approx(truth.E, abs=0.15)
    assert fit.a == pytest.approx(truth.a, abs=0.03)
    assert fit_approach2(runs).a == pytest.approx(truth.a, abs=0.04)
    assert fit_approach1(runs).a == pytest.approx(truth.a, abs=0.1)
    n_opt = float(fit.optimal_params(1e22))
    assert n_opt == pytest.approx(float(truth.optimal_params(1e22)), rel=0.5)


def test_huber_shrugs_off_an_outlier():
    runs = synthetic_isoflop_runs("besiroglu", noise=0.0)
    bad = runs[3]
    runs[3] = Run(bad.params, bad.tokens, bad.loss * 1.5, bad.budget)  # one run diverged
    fit = fit_approach3(runs, refine=8)
    assert fit.alpha == pytest.approx(FITS["besiroglu"].alpha, abs=0.01)
    assert fit.beta == pytest.approx(FITS["besiroglu"].beta, abs=0.01)


def test_bootstrap_intervals_bracket_the_truth():
    runs = synthetic_isoflop_runs("besiroglu", noise=0.01, seed=2)
    report = fit_all(runs, 1e22, bootstrap=10, seed=0, refine=4)
    truth_a = FITS["besiroglu"].a
    for key in ("approach2", "approach3"):
        lo, hi = report.intervals[key]["a"]
        assert lo < hi
        assert lo - 0.03 < truth_a < hi + 0.03
    assert "3: parametric fit" in fit_markdown(report)


def _runs_of_log_law(theta, sizes=(1e5, 3e5, 1e6), tokens=np.linspace(2900, 3500, 4)):
    """Runs exactly on log L = logsumexp(a - α·log N, b - β·log D, e) for theta = (a, b, e, α, β)."""
    theta = np.asarray(theta, dtype=float)
    return [
        Run(
            n,
            d,
            float(np.exp(scaling._log_law(theta[None], np.log([n]), np.log([d])))[0, 0]),
            6 * n * d,
        )
        for n in sizes
        for d in tokens
    ]


def test_approach3_never_overflows_on_a_narrow_token_range():
    """Issue 14: `sweep --quick` died with OverflowError in fit_approach3. Loss that drops steeply over a narrow
    range of D is fitted best by B = e^800 (β = 100); the fit must pick a law with finite constants instead."""
    runs = _runs_of_log_law([1.0, 800.0, math.log(2.0), 0.3, 100.0])
    fit = fit_approach3(runs, refine=4)
    assert all(math.isfinite(v) for v in (fit.E, fit.A, fit.B, fit.alpha, fit.beta))
    assert "3: parametric fit" in fit_markdown(fit_all(runs, 1e12, bootstrap=3, refine=2))
    # Started at the e^800 law itself (where L-BFGS stays), no finite law is left: one clear line.
    with pytest.raises(
        ScalingError, match="no law with finite constants.*D \\(2.9e\\+03-3.5e\\+03\\)"
    ):
        fit_approach3(runs, refine=0, starts=np.array([1.0, 800.0, math.log(2.0), 0.3, 100.0]))


def test_allocation_line_no_float_holds_is_one_line():
    """The quick sweep's bootstrap also died in fit_approach1: two frontier runs 3% apart in compute, the larger
    model first, give N_opt ∝ C^-37 and a coefficient e^777."""
    runs = [Run(3e4, 1e9 / 1.8e5, 3.0, 1e9), Run(1e4, 1.03e9 / 6e4, 2.9, 1.03e9)]
    with pytest.raises(ScalingError, match="Approach 1: the optima give N_opt ∝ C\\^-37.2"):
        fit_approach1(runs)


def test_frontier_is_lowest_loss_at_each_compute():
    runs = [
        Run(1e6, 1e7, 5.0, 6e13),
        Run(4e6, 1e7, 5.5, 2.4e14),
        Run(1e6, 4e7, 4.6, 2.4e14),
        Run(4e6, 4e7, 4.0, 9.6e14),
        Run(1e6, 1.6e8, 4.3, 9.6e14),
    ]
    assert [r.loss for r in scaling.frontier(runs)] == [5.0, 4.6, 4.0]


def test_too_few_runs_say_how_many_are_needed():
    runs = synthetic_isoflop_runs("besiroglu", budgets=(1e19,), sizes_per_budget=4)
    with pytest.raises(ScalingError, match="at least 5 runs"):
        fit_approach3(runs[:3])
    with pytest.raises(ScalingError, match="at least 2 compute budgets"):
        fit_approach2(runs)
    report = fit_all(runs[:3], 1e20, bootstrap=0)
    assert all(isinstance(v, str) for v in report.laws.values())


def test_load_runs_formats_and_errors(tmp_path):
    good = tmp_path / "runs.jsonl"
    good.write_text(
        '{"parameters": 1e6, "tokens": 2e7, "loss": 4.0}\n\n{"params": 2e6, "compute": 1.2e14, '
        '"val_loss": 3.9}\n'
    )
    runs = load_runs(good)
    assert [r.tokens for r in runs] == pytest.approx([2e7, 1e7]) and runs[1].loss == 3.9
    as_list = tmp_path / "runs.json"
    as_list.write_text(json.dumps([{"parameters": 1e6, "compute_budget": 6e13, "final_loss": 4.0}]))
    assert load_runs(as_list)[0].tokens == pytest.approx(1e7)
    missing = tmp_path / "missing.jsonl"
    missing.write_text(
        '{"parameters": 1e6, "tokens": 2e7, "loss": 4.0}\n{"parameters": 1e6, "loss": 4.0}\n'
    )
    with pytest.raises(ScalingError, match=r"line 2: missing tokens or compute"):
        load_runs(missing)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"parameters": 1e6, "tokens": 2e7, "loss": 4.0}\n{"parameters": \n')
    with pytest.raises(ScalingError, match="line 2: not valid JSON"):
        load_runs(broken)
    one_object = tmp_path / "object.json"  # valid JSON, but not runs: say so, not "not valid JSON"
    one_object.write_text(
        json.dumps({"runs": [{"parameters": 1e6, "tokens": 2e7, "loss": 4.0}]}, indent=1)
    )
    with pytest.raises(
        ScalingError, match=r'object.json: a JSON object with keys "runs" \(its "runs" is a list'
    ):
        load_runs(one_object)
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 5000 + "]" * 5000)
    with pytest.raises(ScalingError, match="nested more than 1,000 levels deep"):
        load_runs(deep)
    negative = tmp_path / "neg.jsonl"
    negative.write_text('{"parameters": -1, "tokens": 2e7, "loss": 4.0}\n')
    with pytest.raises(ScalingError, match="line 1: parameters must be a positive"):
        load_runs(negative)


def test_fit_cli_draws_the_plot(tmp_path):
    runs = tmp_path / "runs.jsonl"
    runs.write_text(
        "".join(
            json.dumps({"parameters": r.params, "tokens": r.tokens, "loss": r.loss}) + "\n"
            for r in synthetic_isoflop_runs("besiroglu", noise=0.005)
        )
    )
    r = cli("fit", str(runs), "--bootstrap", "2", "--plot", str(tmp_path / "fit.png"))
    assert r.returncode == 0, r.stderr
    assert "2: IsoFLOP parabolas | 0.5" in r.stdout
    assert (tmp_path / "fit.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cs336_isoflop_runs_lie_on_a_chinchilla_law(shared_data):
    runs = load_runs(shared_data / "cs336" / "a3" / "data" / "isoflops_curves.json")
    assert len(runs) == 72
    fit = fit_approach3(runs, refine=8)
    pred = fit.loss(np.array([r.params for r in runs]), np.array([r.tokens for r in runs]))
    assert np.max(np.abs(np.log(pred) - np.log([r.loss for r in runs]))) < 1e-6
    assert (fit.E, fit.alpha, fit.beta) == pytest.approx((2.69, 0.34, 0.36), abs=1e-4)
    assert fit_approach2(runs).a == pytest.approx(fit.a, abs=0.01)


# --- bad input at the command line -------------------------------------------------------------------------------


def test_cli_fit_reports_missing_field_line(tmp_path):
    f = tmp_path / "runs.jsonl"
    f.write_text(
        '{"parameters": 1e6, "tokens": 2e7, "loss": 4.0}\n{"parameters": 1e6, "tokens": 2e7}\n'
    )
    r = cli("fit", str(f), "--bootstrap", "0")
    assert r.returncode == 2 and "line 2: missing loss" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_fit_binary_file_is_one_line(tmp_path):
    f = tmp_path / "runs.jsonl"
    f.write_bytes(b"\xff\xfe\x00binary")
    r = cli("fit", str(f))
    assert r.returncode == 2 and "cannot read runs file" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_fit_too_few_runs_says_how_many(tmp_path):
    f = tmp_path / "runs.jsonl"
    f.write_text(
        "".join(
            json.dumps({"parameters": n, "tokens": 1e9, "loss": 3.0}) + "\n"
            for n in (1e8, 2e8, 4e8)
        )
    )
    r = cli("fit", str(f), "--bootstrap", "0")
    assert r.returncode == 2 and "give at least 5 runs, got 3" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_cli_lesson_and_help():
    r = cli()
    assert r.returncode == 0
    for piece in (
        "40,000 steps",
        "| 1e+10 | 2e+09 | 0.2 | 2.87 |",
        "38.5",
        "26.25",
        "28 GB",
        "15.8%",
    ):
        assert piece in r.stdout, piece
    assert cli("--help").returncode == 0 and cli("fit", "--help").returncode == 0
