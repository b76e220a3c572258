"""Benchmark: tokens/s and MFU of train.py's loop against a minimal reference loop, same model, data and optimizer.

The reference is the smallest correct loop (next batch, forward, backward, clip, AdamW step, zero grads). train.py's
loop adds the schedule, the spike guard (one .item() per step), the metrics line, the progress line and the
step counter; with eval and checkpoints out of the way (their cost is set by --eval-interval / --ckpt-interval),
the difference is the loop's overhead, which should stay under 5%.

Both loops get identical fresh models (same seed), the same AdamW (fused, betas 0.9/0.95, decay on matrices) and
batches from the same data.py iterator. Runs alternate (ours, reference, ours, ...) so that load from other
processes hits both alike; the figure is the median step time over all timed steps.

The same run times the reference loop once more with model.fused_linear switched off (q/k/v and w1/w3 as one
matmul per layer, the code before the fusion): "fused x" is that loop's median CPU time per step over the fused
one's (CPU time, so that other processes' load does not count; > 1: the fused matmuls are faster).

    python bench/bench_train.py                    # tiny and 10m on the pydocs corpus, CPU fp32
    python bench/bench_train.py --presets tiny --steps 30 --threads 2
    python bench/bench_train.py --presets tiny --data corpus.txt --rounds 1 --warmup 0 --steps 1
"""

import argparse
import pathlib
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import data as data_lib  # noqa: E402
import model as model_lib  # noqa: E402
from machinery.presets import PRESETS  # noqa: E402
import train  # noqa: E402
from machinery import run as train_run  # noqa: E402
from machinery.commands import train as train_command  # noqa: E402
from benchcli import Parser, in_range  # noqa: E402
from bench_gpu import ablated  # noqa: E402


def reference_loop(
    trainer: train_run.Trainer, steps: int, fused: bool = True
) -> list[tuple[float, float]]:
    """The minimal loop over a fresh copy of the trainer's starting point: (wall, CPU) seconds of each step, with
    q/k/v and w1/w3 fused (model.py as it is) or as separate matmuls (bench_gpu's switch)."""
    with ablated(fused, sdpa=None):
        return _reference_steps(trainer, steps)


def _reference_steps(trainer: train_run.Trainer, steps: int) -> list[tuple[float, float]]:
    torch.manual_seed(trainer.cfg.seed)
    gpt = model_lib.GPT(trainer.model_config)
    opt = torch.optim.AdamW(
        train.param_groups(gpt, 0.1), lr=trainer.cfg.lr, betas=(0.9, 0.95), fused=True
    )
    loader = trainer.data.iterator(
        "train", trainer.cfg.batch_size, trainer.block_size, seed=trainer.cfg.seed
    )
    times = []
    for _ in range(steps):
        t0, cpu0 = time.perf_counter(), time.process_time()
        x, y = loader.next()
        _, loss = gpt(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - t0, time.process_time() - cpu0))
    return times


def train_loop(trainer: train_run.Trainer, steps: int) -> list[float]:
    """train.py's own loop iteration (train.train_loop, one step), timed the same way."""
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        train.train_loop(trainer, steps=1)
        times.append(time.perf_counter() - t0)
    return times


def bench_preset(
    preset: str,
    data: str,
    batch_size: int,
    steps: int,
    rounds: int,
    warmup: int,
    out_root: pathlib.Path,
) -> dict:
    ours, ref, fused_cpu, separate_cpu = [], [], [], []
    trainer = None
    for r in range(rounds):
        cfg = train_command.parse_config(
            [
                "--model",
                preset,
                "--data",
                data,
                "--out-dir",
                str(out_root / f"{preset}-{r}"),
                "--batch-size",
                str(batch_size),
                "--max-steps",
                "100000",
                "--eval-interval",
                "100000",
                "--ckpt-interval",
                "100000",
                "--log-interval",
                "100000",
                "--num-samples",
                "0",
                "--overwrite",
            ]
        )
        trainer = train_run.Trainer(cfg, log=lambda *a, **k: None)
        ours += train_loop(trainer, warmup + steps)[warmup:]
        fused = reference_loop(trainer, warmup + steps)[warmup:]
        ref += [wall for wall, _ in fused]
        fused_cpu += [cpu for _, cpu in fused]
        separate_cpu += [cpu for _, cpu in reference_loop(trainer, warmup + steps, False)[warmup:]]
    t_ours, t_ref = statistics.median(ours), statistics.median(ref)
    tokens = trainer.tokens_per_step
    return {
        "preset": preset,
        "params": trainer.raw_model.num_params(),
        "tokens_per_step": tokens,
        "ours_tok_s": tokens / t_ours,
        "ref_tok_s": tokens / t_ref,
        "ours_mfu": tokens / t_ours * trainer._flops_per_token / trainer._peak,
        "ref_mfu": tokens / t_ref * trainer._flops_per_token / trainer._peak,
        "overhead": t_ours / t_ref - 1,
        "fused_speedup": statistics.median(separate_cpu) / statistics.median(fused_cpu),
        "peak": trainer._peak,
    }


def main(argv=None) -> None:
    parser = Parser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--presets", default="tiny,10m", help="comma-separated model presets")
    parser.add_argument("--data", default="pydocs", help="train.py --data")
    parser.add_argument(
        "--batch-size",
        type=in_range(int, 1, 4096),
        default=4,
        help="sequences per step (at the preset's length)",
    )
    parser.add_argument(
        "--threads",
        type=in_range(int, 1, 1024),
        default=1,
        help="torch threads (1: least noise on a shared machine)",
    )
    parser.add_argument(
        "--steps", type=in_range(int, 1, 10_000), default=6, help="timed steps per loop per round"
    )
    parser.add_argument(
        "--warmup", type=in_range(int, 0, 1000), default=1, help="untimed steps per loop per round"
    )
    parser.add_argument(
        "--rounds",
        type=in_range(int, 1, 100),
        default=3,
        help="alternating rounds (ours, reference)",
    )
    args = parser.parse_args(argv)
    unknown = [p for p in args.presets.split(",") if p not in PRESETS]
    if unknown:
        parser.error(
            f"argument --presets: unknown preset(s) {', '.join(unknown)}; choose from "
            f"{', '.join(PRESETS)}"
        )
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, CPU fp32; median step time over "
        f"{args.rounds} x {args.steps} steps per loop"
    )
    print(
        f"{'preset':<7} {'params':>10} {'tokens/step':>11} {'train.py tok/s':>15} {'reference tok/s':>16} "
        f"{'MFU ours':>9} {'MFU ref':>8} {'overhead':>9} {'fused x':>8}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets.split(","):
            try:  # --data or --batch-size that train.py refuses: one line
                r = bench_preset(
                    preset,
                    args.data,
                    args.batch_size,
                    args.steps,
                    args.rounds,
                    args.warmup,
                    pathlib.Path(tmp),
                )
            except (train.TrainError, data_lib.DataError) as e:
                parser.error(str(e))
            print(
                f"{r['preset']:<7} {r['params']:>10,} {r['tokens_per_step']:>11,} {r['ours_tok_s']:>15,.0f} "
                f"{r['ref_tok_s']:>16,.0f} {100 * r['ours_mfu']:>8.1f}% {100 * r['ref_mfu']:>7.1f}% "
                f"{100 * r['overhead']:>+8.1f}% {r['fused_speedup']:>7.2f}x"
            )
    print(
        f"MFU against a measured 1024^3 fp32 matmul peak of {r['peak'] / 1e9:.0f} GFLOP/s on this CPU"
    )


if __name__ == "__main__":
    main()
