"""Benchmark model.py: forward+backward tokens/s, achieved FLOP/s and MFU, eager vs torch.compile, in one run.

MFU (model FLOPs utilisation) = tokens/s * FLOPs per token / peak FLOP/s. The peak is not a datasheet number
but measured here, in the same run, as the best fp32 matrix multiply this machine does (2 n^3 FLOPs for an
n x n product), so the ratio says how close the model gets to what the hardware does on the easiest possible
workload. The peak is measured again before every row and the best of the run is the denominator, so a
moment of load on a shared machine cannot inflate an MFU. There, `--threads 1 --clock cpu` also times with the
process's CPU clock instead of the wall clock: it counts only the time this process ran, so the figures
describe the code on one core rather than how busy the neighbours were.

Side by side: the same model eager, with activation checkpointing (recomputes each block in backward: expect
about 4/3 of the time) and under torch.compile (inductor; the compile's wall time is reported separately).

    python bench/bench_model.py                        # tiny and 10m presets
    python bench/bench_model.py --presets tiny --no-compile
    python bench/bench_model.py --threads 1 --clock cpu   # on a busy shared machine
    python bench/bench_model.py --presets tiny --no-compile --batch-size 1 --warmup 0 --steps 1

Depends on: torch and model.py.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from model import GPT, ConfigError  # noqa: E402
from machinery.presets import PRESETS  # noqa: E402
from scaling import count_flops_per_token, count_params  # noqa: E402
from benchcli import Parser, in_range  # noqa: E402


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def matmul_peak(
    clock=time.perf_counter, sizes=(512, 1024, 2048), repeats: int = 3
) -> tuple[float, int]:
    """Best fp32 FLOP/s over square matmuls of the given sizes -> (FLOP/s, n that achieved it)."""
    best, best_n = 0.0, 0
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b  # warm-up: thread pool, caches
        for _ in range(repeats):
            start = clock()
            a @ b
            rate = 2 * n**3 / (clock() - start)
            if rate > best:
                best, best_n = rate, n
    return best, best_n


def time_train_step(
    model: torch.nn.Module, x: torch.Tensor, warmup: int, steps: int, clock=time.perf_counter
) -> float:
    """Median seconds of one forward + backward (gradients zeroed in between; no optimizer step)."""
    times = []
    for i in range(warmup + steps):
        start = clock()
        _, loss = model(x, x)
        loss.backward()
        elapsed = clock() - start
        for p in model.parameters():
            p.grad = None
        if i >= warmup:
            times.append(elapsed)
    return sorted(times)[len(times) // 2]


def bench_preset(
    name: str, batch_size: int, warmup: int, steps: int, compile_too: bool, clock=time.perf_counter
) -> list[dict]:
    """Rows for one preset: eager, eager + activation checkpointing, compiled."""
    config = PRESETS[name]
    torch.manual_seed(0)
    x = torch.randint(0, config.vocab_size, (batch_size, config.block_size))
    variants = [
        ("eager", config, False),
        ("eager+ckpt", dataclasses.replace(config, activation_checkpointing=True), False),
    ]
    if compile_too:
        variants.append(("compiled", config, True))
    rows = []
    for label, cfg, use_compile in variants:
        torch.manual_seed(0)
        model = GPT(cfg)
        compile_s = 0.0
        if use_compile:
            model = torch.compile(model, fullgraph=True)
            start = time.perf_counter()  # wall clock: compile workers are
            model(x, x)[1].backward()  # other processes; it happens here
            compile_s = time.perf_counter() - start
        peak, n = matmul_peak(clock)
        seconds = time_train_step(model, x, warmup, steps, clock)
        tokens_per_s = x.numel() / seconds
        flops = tokens_per_s * count_flops_per_token(cfg)
        rows.append(
            dict(
                preset=name,
                variant=label,
                params=count_params(cfg),
                tokens=x.numel(),
                step_ms=seconds * 1e3,
                tokens_per_s=tokens_per_s,
                gflops=flops / 1e9,
                flops=flops,
                peak=peak,
                peak_n=n,
                compile_s=compile_s,
            )
        )
        torch._dynamo.reset()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--presets",
        nargs="+",
        choices=list(PRESETS),
        default=["tiny", "10m"],
        help="presets from machinery/presets.py",
    )
    parser.add_argument(
        "--batch-size",
        type=in_range(int, 1, 4096),
        default=8,
        help="sequences per step (each block_size long)",
    )
    parser.add_argument("--warmup", type=in_range(int, 0, 1000), default=2)
    parser.add_argument(
        "--steps",
        type=in_range(int, 1, 10_000),
        default=5,
        help="timed steps (the median is reported)",
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile rows")
    parser.add_argument(
        "--threads",
        type=in_range(int, 1, 1024),
        default=torch.get_num_threads(),
        help="intra-op threads for the peak and the model alike (default: torch's)",
    )
    parser.add_argument(
        "--clock",
        choices=list(CLOCKS),
        default="wall",
        help="wall: elapsed time; cpu: this process's CPU time (with --threads 1 on a busy machine)",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = CLOCKS[args.clock]
    rows = []
    try:
        for name in args.presets:
            rows += bench_preset(
                name, args.batch_size, args.warmup, args.steps, not args.no_compile, clock
            )
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    best = max(rows, key=lambda r: r["peak"])
    peak, n = best["peak"], best["peak_n"]
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.clock} clock, "
        f"load average at the end {os.getloadavg()[0]:.1f}"
    )
    print(
        f"measured fp32 matmul peak: {peak / 1e9:.1f} GFLOP/s (best {n}x{n} product of the run; "
        f"lowest re-measurement {min(r['peak'] for r in rows) / 1e9:.1f})\n"
    )
    header = (
        f"{'preset':<7} {'variant':<11} {'params':>7} {'tok/step':>8} {'ms/step':>8} {'tok/s':>8} "
        f"{'GFLOP/s':>8} {'MFU':>6} {'vs eager':>8} {'compile':>8}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        eager = next(e for e in rows if e["preset"] == r["preset"] and e["variant"] == "eager")
        compiled = f"{r['compile_s']:.0f}s" if r["compile_s"] else ""
        print(
            f"{r['preset']:<7} {r['variant']:<11} {r['params'] / 1e6:>6.2f}M {r['tokens']:>8} "
            f"{r['step_ms']:>8.0f} {r['tokens_per_s']:>8.0f} {r['flops'] / 1e9:>8.1f} {r['flops'] / peak:>6.1%} "
            f"{r['tokens_per_s'] / eager['tokens_per_s']:>7.2f}x {compiled:>8}"
        )
    print(
        "\nforward+backward only (no optimizer step); FLOPs/token = 6N + 12 L T C (model.py, PaLM's full-T "
        "attention term);\nMFU = achieved FLOP/s / measured peak."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
