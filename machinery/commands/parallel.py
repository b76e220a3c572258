"""The command line of parallel.py and model_parallel.py: `demo`, `schedule`, `memory`, `mesh`.

python parallel.py demo              # each layout on 2 CPU processes vs one: weights, bytes
python parallel.py schedule --p 4 --m 16 [--measure]    # a pipeline schedule drawn, its bubble
python parallel.py memory --params 7e9 --world 8        # 112 / 38.5 / 26.25 / 14 GB per GPU
python parallel.py mesh --dp 2 --tp 2 --pp 2            # the rank grid and its groups
"""

from __future__ import annotations

import argparse

import model_parallel
from machinery import launch as launcher
import parallel
from machinery import parallel_demo
from machinery.cli import Parser, in_range, run

# Sizes the CLI draws or spawns: a rank grid wider than this does not fit a screen, and every
# pipeline stage or data-parallel rank of a demo is a CPU process of this machine.
MAX_DRAWN_RANKS, MAX_MICRO_BATCHES, MAX_PROCESSES = 512, 1024, 64


def cmd_demo(args) -> int:
    """Train a tiny GPT in every layout on --world processes; compare with one process."""
    fits = parallel_demo.demo_world_sizes()
    if args.world not in fits:
        cfg = parallel_demo.DEMO
        raise parallel.ParallelError(
            f"the demo model (n_head {cfg['n_head']}, n_kv_head {cfg['n_kv_head']}, n_layer "
            f"{cfg['n_layer']}, batch {parallel_demo.BATCH}) splits over "
            f"{' or '.join(map(str, fits))} ranks, not --world {args.world}"
        )
    parallel_demo.demo(args.world, args.steps)
    return 0


def cmd_schedule(args) -> int:
    """Draw a schedule, simulate its bubble, with --measure time a real pipeline."""
    parallel_demo.schedule(args.p, args.m, args.schedule, args.measure)
    return 0


def cmd_memory(args) -> int:
    """Bytes per rank under DP and ZeRO-1/2/3."""
    print(
        f"{args.params:.3g} parameters x 16 bytes (mixed-precision AdamW) = "
        f"{16 * args.params / 1e9:.2f} GB"
    )
    for stage in range(4):
        per = parallel.zero_memory_per_rank(args.params, args.world, stage)
        name = "DP" if stage == 0 else f"ZeRO-{stage}"
        print(f"  {name:<7} on {args.world} ranks: {per / 1e9:8.2f} GB per rank")
    return 0


def cmd_mesh(args) -> int:
    """The dp x tp x pp rank grid and its groups."""
    world = args.dp * args.tp * args.pp
    print(f"world {world} = dp {args.dp} x tp {args.tp} x pp {args.pp}")
    print("rank     " + " ".join(f"{r:>2}" for r in range(world)))
    coords = [parallel.rank_coords(r, args.dp, args.tp, args.pp) for r in range(world)]
    for i, axis in enumerate(("pp", "dp", "tp")):
        print(f"{axis}_rank  " + " ".join(f"{c[i]:>2}" for c in coords))
    for axis, groups in parallel.axis_groups(args.dp, args.tp, args.pp).items():
        print(f"{axis} groups: {groups}")
    return 0


def build_parser() -> Parser:
    parser = Parser(
        description="Training one model on many processes, by hand over torch.distributed: data "
        "parallel and ZeRO-1/2/3 (parallel.py), tensor and pipeline parallel (model_parallel.py).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    p = sub.add_parser(
        "demo", help="train a tiny GPT in every layout on N CPU processes; compare with one process"
    )
    p.add_argument(
        "--world", type=in_range(int, 1, MAX_PROCESSES), default=2, help="processes (gloo on CPU)"
    )
    p.add_argument("--steps", type=in_range(int, 1, 10_000), default=5, help="AdamW steps")
    p.set_defaults(run=cmd_demo)
    p = sub.add_parser("schedule", help="draw a pipeline schedule and its bubble")
    p.add_argument("--p", type=in_range(int, 1, MAX_PROCESSES), default=4, help="stages")
    p.add_argument("--m", type=in_range(int, 1, MAX_MICRO_BATCHES), default=8, help="micro-batches")
    p.add_argument("--schedule", choices=sorted(model_parallel.SCHEDULES), default="1f1b")
    p.add_argument(
        "--measure", action="store_true", help="also time a real pipeline on p CPU processes"
    )
    p.set_defaults(run=cmd_schedule)
    p = sub.add_parser(
        "memory", help="bytes per rank under DP and ZeRO-1/2/3 (the lecture's 7B on 8 GPUs)"
    )
    p.add_argument("--params", type=in_range(float, 0.0, 1e15, low_open=True), default=7e9)
    p.add_argument("--world", type=in_range(int, 1, 10**9), default=8)
    p.set_defaults(run=cmd_memory)
    p = sub.add_parser("mesh", help="print the dp x tp x pp rank grid and its groups")
    for axis in ("--dp", "--tp", "--pp"):
        p.add_argument(axis, type=in_range(int, 1, MAX_DRAWN_RANKS), default=2)
    p.set_defaults(run=cmd_mesh)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "mesh" and args.dp * args.tp * args.pp > MAX_DRAWN_RANKS:
        parser.error(
            f"argument --dp/--tp/--pp: a grid of {args.dp * args.tp * args.pp} ranks is too wide "
            f"to draw; keep dp x tp x pp <= {MAX_DRAWN_RANKS}"
        )
    if args.command == "schedule" and args.measure and args.p < 2:
        parser.error("argument --p: --measure needs --p >= 2 processes")
    return run(
        lambda: args.run(args), (parallel.ParallelError, launcher.WorkerError), "parallel.py"
    )
