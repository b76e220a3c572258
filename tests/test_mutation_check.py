"""Tests of tests/mutation_check.py: every mutant still applies to today's sources and names tests that exist
(fast, so an edit that moves a pattern is noticed at once), and the machinery kills two cheap mutants while a
harmless edit survives (slow). The full check runs in CI after pytest: `python tests/mutation_check.py`."""

import pathlib

import pytest

import mutation_check as M

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_mutant_applies_once_and_names_existing_tests():
    M.check_patterns(M.MUTANTS)
    names = [m.name for m in M.MUTANTS]
    assert len(set(names)) == len(names)
    assert len({m.file for m in M.MUTANTS}) >= 6  # spread over the chapters
    for m in M.MUTANTS:
        for node in m.tests:
            path, _, test = node.partition("::")
            test = test.partition("[")[0]  # a parametrized node: its function
            assert (ROOT / path).is_file(), (m.name, node)
            assert not test or f"def {test}(" in (ROOT / path).read_text(), (m.name, node)


def test_a_pattern_gone_from_the_source_is_an_error():
    gone = M.Mutant(
        "gone", "train.py", "text that is not in train.py", "x", ("tests/test_train.py",), "nothing"
    )
    with pytest.raises(
        M.MutantError, match="'gone' in train.py: pattern found 0 times.*update MUTANTS"
    ):
        M.check_patterns([gone])


def test_a_failing_baseline_stops_the_check_and_no_baseline_skips_it(monkeypatch):
    """The unmutated run comes first and a failure there is an error; --no-baseline (CI) runs mutants only."""
    mutant = next(m for m in M.MUTANTS if m.name == "warmup-shifted-by-one")
    runs = []
    monkeypatch.setattr(
        M,
        "run_mutant",
        lambda m, tests, timeout_s: (
            runs.append(m)
            or {
                "name": m.name if m else "baseline",
                "file": m.file if m else "-",
                "code": 1 if m else 2,
                "result": "killed",
                "seconds": 0.0,
                "tail": "boom",
            }
        ),
    )
    with pytest.raises(M.MutantError, match="fail without any mutant.*\n.*boom"):
        M.run_all([mutant], jobs=1, timeout_s=1, log=lambda *a: None)
    assert runs == [None]
    assert M.main(["--only", mutant.name, "--no-baseline"]) == 0 and runs == [None, mutant]


@pytest.mark.slow
def test_cheap_mutants_are_killed_and_a_harmless_edit_survives():
    cheap = [
        m for m in M.MUTANTS if m.name in ("warmup-shifted-by-one", "pipeline-bubble-off-by-one")
    ]
    harmless = M.Mutant(
        "comment-only",
        "train.py",
        "# 4. Gradient clipping",
        "# 4. Gradient clipping (edited)",
        cheap[0].tests,
        "a comment changes: nothing can catch it",
    )
    # no baseline: the harmless edit is the unmutated run (it must survive)
    rows = M.run_all([*cheap, harmless], jobs=1, timeout_s=300, log=lambda *a: None, baseline=False)
    assert {r["name"]: r["result"] for r in rows} == {
        "warmup-shifted-by-one": "killed",
        "pipeline-bubble-off-by-one": "killed",
        "comment-only": "SURVIVED",
    }
    assert "killed 2 of 3 mutants" in M.kill_table([*cheap, harmless], rows)
