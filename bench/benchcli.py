"""The benchmarks' command lines, checked like the chapters': a bad flag is one line naming it.

Every bench/*.py builds its parser with `Parser` and gives each number flag a range with
`in_range`, so `--steps 0`, `--batch-size -1` or `--docs nan` stop at once (exit code 2) with
`bench_x.py: error: argument --steps: must be an integer >= 1, got '0' (see --help)` instead of
a traceback minutes into the run.

    >>> in_range(int, 1)("0")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be an integer >= 1, got '0'
    >>> in_range(float, 0.01, 1e5)("0.5")
    0.5
"""

import argparse
import math


class Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit code 2), without the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def in_range(kind=int, low=None, high=None):
    """argparse type: a finite int or float in [low, high] (either end may be None: unbounded)."""

    def show(x):
        return f"{x:,}" if isinstance(x, int) else f"{x:g}"

    rule = ("an integer" if kind is int else "a number") + "".join(
        [
            f" >= {show(low)}" if low is not None else "",
            " and" if None not in (low, high) else "",
            f" <= {show(high)}" if high is not None else "",
        ]
    )

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (
            value is None
            or not math.isfinite(value)
            or (low is not None and value < low)
            or (high is not None and value > high)
        ):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value

    return parse
