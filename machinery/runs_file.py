"""Runs files: the JSON or JSONL records of measured runs that scaling.py's fits read (`python
scaling.py fit runs.jsonl`, a sweep's final.jsonl, CS336's isoflops_curves.json).

A record is {"parameters": N, "tokens": D (or "compute": C), "loss": L}, with an optional "budget"
(the IsoFLOP group) and "series" (a run name); CS336's compute_budget/final_loss names work too. A
record marked "heldout": true (a sweep's prediction check) is left out of the fit, and a point
trained with several seeds becomes one run at their mean loss (scaling.mean_over_seeds). Every
problem is one ScalingError line naming the record or line.

Depends on scaling.py (Run, ScalingError, positive, mean_over_seeds), fileio.py (parse_json) and the
standard library.
"""

from __future__ import annotations

import pathlib

from machinery import fileio
from scaling import Run, ScalingError, mean_over_seeds, positive

_KEYS = {
    "params": ("parameters", "params", "N"),
    "tokens": ("tokens", "D"),
    "compute": ("compute", "compute_budget", "C", "flops"),
    "loss": ("loss", "final_loss", "val_loss"),
}


def _field(record: dict, what: str):
    for key in _KEYS[what]:
        if key in record and record[key] is not None:
            return record[key]
    return None


def run_from_record(record: dict, where: str = "record") -> Run:
    """Build a Run from {parameters, tokens or compute, loss}; accepts CS336's
    compute_budget/final_loss names.

    >>> run_from_record({"parameters": 1e9, "compute_budget": 1.2e20, "final_loss": 2.6}).tokens
    20000000000.0
    """
    if not isinstance(record, dict):
        raise ScalingError(
            f"{where}: expected a JSON object with parameters, tokens or compute, and loss"
        )
    n, d, c, loss = (_field(record, k) for k in ("params", "tokens", "compute", "loss"))
    missing = [name for name, v in (("parameters", n), ("loss", loss)) if v is None]
    if d is None and c is None:
        missing.append("tokens or compute")
    if missing:
        raise ScalingError(
            f"{where}: missing {', '.join(missing)} (need parameters, tokens or compute, and loss)"
        )
    try:
        n = positive("parameters", n)
        loss = positive("loss", loss)
        d = positive("tokens", d) if d is not None else positive("compute", c) / (6.0 * n)
        if record.get("budget") is not None:
            budget = positive("budget", record["budget"])
        elif c is not None:
            budget = positive("compute", c)
        else:
            budget = 6.0 * n * d
    except ScalingError as e:
        raise ScalingError(f"{where}: {e}") from None
    for name, value in (("parameters", n), ("tokens", d), ("loss", loss), ("budget", budget)):
        # 1e300 tokens or a subnormal loss: no real run
        if not _RANGES[name][0] <= value <= _RANGES[name][1]:
            raise ScalingError(
                f"{where}: {name} {value:.3g} is outside {_RANGES[name]}, the range of a real "
                f"run; fix the record"
            )
    return Run(n, d, loss, budget, str(record.get("series", record.get("run", ""))))


# What a real run can hold: a fit's logs and powers stay finite inside these bounds (e^708 is
# float64's limit).
_RANGES = {
    "parameters": (1.0, 1e16),
    "tokens": (1.0, 1e20),
    "loss": (1e-6, 1e3),
    "budget": (1.0, 1e40),
}


def load_runs(path) -> list[Run]:
    """Read runs from a JSON list or a JSONL file (one object per line); errors name the line.

    The format: {"parameters": N, "tokens": D (or "compute": C), "loss": L, optional "budget": the
    IsoFLOP group, "series": a run name}. A record marked "heldout": true (a sweep's prediction
    check) is left out of the fit, and records of one point trained with several seeds become one
    run at their mean loss (mean_over_seeds).
    """
    p = pathlib.Path(path)
    if not p.is_file():
        raise ScalingError(f"runs file {str(p)!r} not found: give a JSON or JSONL file of runs")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ScalingError(
            f"cannot read runs file {str(p)!r} as UTF-8 text ({e.__class__.__name__}): "
            f"give a JSON or JSONL file of runs"
        ) from None
    fix = (
        "give a JSON list of runs, or JSONL: one {parameters, tokens or compute, loss} object "
        "per line"
    )
    try:
        document = fileio.parse_json(text, str(p), ScalingError, fix)
    except ScalingError:
        # not one JSON value: JSONL (or damaged), judged line by line below
        document = None
    if isinstance(document, list):
        records = [(f"{p} record {i + 1}", r) for i, r in enumerate(document)]
    elif isinstance(document, dict) and any(
        _field(document, k) is not None for k in ("params", "loss")
    ):
        # one-line JSONL, too
        records = [(f"{p} line 1" if "\n" not in text.strip() else str(p), document)]
    elif document is not None:
        raise ScalingError(f"{p}: {_describe(document)}, not a list of runs: {fix}")
    else:
        records = [
            (f"{p} line {n}", fileio.parse_json(line, f"{p} line {n}", ScalingError, fix))
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip()
        ]
    runs = []
    for where, record in records:
        if isinstance(record, dict) and not isinstance(record.get("heldout", False), bool):
            raise ScalingError(
                f"{where}: heldout is {record['heldout']!r}, not true or false; fix the record"
            )
        if not (isinstance(record, dict) and record.get("heldout")):
            runs.append(run_from_record(record, where))
    return mean_over_seeds(runs)


def _describe(value) -> str:
    """What a JSON value is, for an error: 'a JSON object with keys "runs", "meta" (its "runs" is a
    list)'.

    >>> _describe({"runs": [], "meta": 1})
    'a JSON object with keys "runs", "meta" (its "runs" is a list: give that list)'
    """
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__.replace('str', 'string').replace('NoneType', 'null')}"
    keys = ", ".join(f'"{k}"' for k in list(value)[:5]) + (", ..." if len(value) > 5 else "")
    lists = [k for k, v in value.items() if isinstance(v, list)]
    return (f"a JSON object with keys {keys}" if keys else "an empty JSON object") + (
        f' (its "{lists[0]}" is a list: give that list)' if lists else ""
    )
