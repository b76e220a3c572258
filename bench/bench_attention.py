"""Benchmark attention's memory: FlashAttention by hand (model.FlashAttention2) against the formula that builds
the T x T matrix, and against PyTorch's fused kernel (F.scaled_dot_product_attention), at growing length T.

Two figures per row, for one causal forward + backward over (batch 1, 8 heads, T, head 64) in fp32:
* saved: the bytes autograd keeps between forward and backward (counted exactly with saved-tensor hooks). The
  formula keeps the T x T probabilities (8 * T^2 * 4 bytes, quadrupling when T doubles); flash keeps q, k, v,
  the output and one log-sum-exp per query (doubling).
* peak: the process's peak resident memory above its baseline, measured in a fresh subprocess per row
  (resource.getrusage), so it includes every temporary of the backward too.
The CPU has no on-chip SRAM to keep the tiles in, so the hand-written flash is slower here (Python loops over
tiles); the lesson is its memory, the fused kernel is what the model uses by default.

    python bench/bench_attention.py                      # T = 512 .. 4096
    python bench/bench_attention.py --lengths 256 512    # quicker

Depends on: torch and model.py.
"""

from __future__ import annotations

import math
import pathlib
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchcli import Parser, in_range  # noqa: E402
from model import flash_attention  # noqa: E402

HEADS, HEAD_DIM = 8, 64
# The longest T a row may ask for. The formula keeps two (8, T, T) fp32 matrices for the backward
# (1,064 MB at T = 4,096, measured): ~4.1 GB at 8,192, and its row takes ~4x the 4,096 row's time
# (40 s on a busy 2-core CPU), so 8,192 still finishes; 100,000 would want ~640 GB and never end.
MAX_LENGTH = 8192


def naive(q, k, v, is_causal=True):
    """softmax(q k^T / sqrt(d) + causal mask) v, the T x T matrix materialised."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(s, -1) @ v


METHODS = {
    "flash (by hand)": flash_attention,
    "formula (T x T)": naive,
    "SDPA (fused)": lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c),
}


def run_once(method: str, T: int) -> tuple[int, float]:
    """(bytes saved for backward, seconds) of one forward + backward."""
    q, k, v = (torch.randn(1, HEADS, T, HEAD_DIM, requires_grad=True) for _ in range(3))
    saved = []
    start = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        out = METHODS[method](q, k, v, True)
    out.sum().backward()
    return sum(saved), time.perf_counter() - start


def peak_mb(method: str, T: int) -> float:
    """Peak RSS above the baseline of a fresh process that runs one forward + backward (MB)."""
    code = (
        f"import resource, sys; sys.argv = ['x']; import bench_attention as b; import torch; "
        f"torch.randn(1); base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; "
        f"b.run_once({method!r}, {T}); "
        f"print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=pathlib.Path(__file__).parent,
        capture_output=True,
        text=True,
        check=True,
        env={"OMP_NUM_THREADS": "1", "PATH": ""},
    )
    return float(out.stdout.split()[-1])


def main(argv=None) -> int:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--lengths",
        type=in_range(int, 1, MAX_LENGTH),
        nargs="+",
        default=[512, 1024, 2048, 4096],
        help=f"sequence lengths T, 1 to {MAX_LENGTH:,} (at {MAX_LENGTH:,} the "
        "formula keeps ~4 GB for its backward and runs minutes on a small CPU; "
        "longer would not finish)",
    )
    parser.add_argument(
        "--no-peak", action="store_true", help="skip the subprocess peak-memory column"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(
        f"causal attention, forward + backward, 1 x {HEADS} heads x T x {HEAD_DIM}, fp32, 1 thread"
    )
    print(
        f"{'method':<16} {'T':>6} {'saved MB':>9} {'x prev':>7} {'peak MB':>8} {'x prev':>7} {'time s':>7}"
    )
    for method in METHODS:
        previous = None
        for T in args.lengths:
            saved, seconds = run_once(method, T)
            peak = float("nan") if args.no_peak else peak_mb(method, T)
            saved_x = f"{saved / previous[0]:.2f}" if previous else ""
            peak_x = f"{peak / previous[1]:.2f}" if previous and previous[1] > 0 else ""
            print(
                f"{method:<16} {T:>6} {saved / 2**20:>9.1f} {saved_x:>7} {peak:>8.1f} {peak_x:>7} {seconds:>7.2f}"
            )
            previous = (saved, peak)
    print(
        "x prev: growth when T doubles (2: linear, 4: quadratic). saved: kept by autograd between forward and "
        "backward;\npeak: process peak RSS above baseline, fresh subprocess per row."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
