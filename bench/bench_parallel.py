"""Benchmark: every layout of parallel.py and model_parallel.py on 2 CPU processes (gloo) against one process, and
our data parallel and ZeRO-3 against torch's own DistributedDataParallel and FSDP (`fully_shard`) on the same
model, data and optimizer.

For each mode it prints, per rank: the median step time (and its ratio to one process), the bytes this rank sent
in one step (our counters; torch's wrappers have none), the bytes of weights + gradients + optimizer state it
holds after a step (vs 16 bytes/param in one process: fp32 AdamW is 4 + 4 + 8), and the largest difference of the
final weights from the one-process run (ours) or between ours and torch's (the oracles).

    python bench/bench_parallel.py                       # 4-layer 128-wide GPT, 10 timed steps
    python bench/bench_parallel.py --steps 20 --layers 8
    python bench/bench_parallel.py --steps 1 --layers 2 --width 32 --micro-batches 2   # the tests'

On this shared 2-core machine the step times carry the load of other processes; the traffic and memory columns
are exact. Every process uses one thread (on a loaded 2-core machine more threads per process only fight).
"""

import dataclasses
import pathlib
import statistics
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import model_parallel as MP  # noqa: E402
from machinery import launch as launcher  # noqa: E402
from machinery import parallelize as wiring  # noqa: E402
import parallel as P  # noqa: E402
from benchcli import Parser, in_range  # noqa: E402
from machinery import parallel_demo  # noqa: E402
from model import GPT, ConfigError, GPTConfig  # noqa: E402

BATCH = 8  # sequences per step over all ranks


def make_data(cfg: GPTConfig, steps: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randint(0, cfg.vocab_size, (BATCH, cfg.block_size), generator=g),
            torch.randint(0, cfg.vocab_size, (BATCH, cfg.block_size), generator=g),
        )
        for _ in range(steps)
    ]


def local_bytes(tensors) -> int:
    """Bytes of distinct storages behind tensors (a DTensor counts its local shard)."""
    seen, total = set(), 0
    for t in tensors:
        if t is None or not torch.is_tensor(t):
            continue
        t = t.to_local() if hasattr(t, "to_local") else t
        storage = t.untyped_storage()
        if storage.nbytes() and storage.data_ptr() not in seen:
            seen.add(storage.data_ptr())
            total += storage.nbytes()
    return total


def state_bytes(params, optimizer) -> int:
    params = list(params)
    return (
        local_bytes(params)
        + local_bytes(p.grad for p in params)
        + local_bytes(v for s in optimizer.state.values() for v in s.values())
    )


def single_process(cfg: GPTConfig, data, threads: int) -> dict:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for x, y in data:
        t0 = time.perf_counter()
        model(x, y)[1].backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        memory = state_bytes(model.parameters(), opt)
        opt.zero_grad()
    return {"times": times, "memory": memory, "state": model.state_dict(), "n": model.num_params()}


def _ours(cfg, data, sizes, zero, micro_batches):
    torch.manual_seed(0)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mesh = P.Mesh.build(**sizes)
    wrapped, wopt = wiring.parallelize(model, opt, mesh, zero=zero)
    times = []
    for x, y in data:
        mesh.reset_counters()
        t0 = time.perf_counter()
        xs, ys = x.chunk(mesh.dp.size)[mesh.dp.rank], y.chunk(mesh.dp.size)[mesh.dp.rank]
        if wrapped.pipelined:
            wrapped.pipeline_step([(xs, ys)], micro_batches)
        else:
            wrapped(xs, ys)[1].backward()
            wrapped.finish_gradient_sync()
        wopt.step()
        times.append(time.perf_counter() - t0)
        sent = mesh.bytes_sent()
        memory = (
            sum(wiring.zero_memory_bytes(wrapped.zero).values())
            if wrapped.zero is not None
            else state_bytes(wrapped.model.parameters(), wopt.inner)
        )
        wopt.zero_grad()
    return {"times": times, "bytes": sent, "memory": memory, "state": wrapped.full_state_dict()}


def _train_local_shards(wrapped, model, data, rank, world):
    """AdamW steps of a torch-wrapped model on this rank's slice of each global batch: (step times, state bytes)."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    times = []
    for x, y in data:
        t0 = time.perf_counter()
        wrapped(x.chunk(world)[rank], y.chunk(world)[rank])[1].backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        memory = state_bytes(model.parameters(), opt)
        opt.zero_grad()
    return times, memory


def _torch_ddp(cfg, data, rank, world):
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = GPT(cfg)
    ddp = DistributedDataParallel(model)
    times, memory = _train_local_shards(ddp, model, data, rank, world)
    return {"times": times, "bytes": None, "memory": memory, "state": model.state_dict()}


def _torch_fsdp(cfg, data, rank, world):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = GPT(cfg)
    mesh = init_device_mesh("cpu", (world,))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    times, memory = _train_local_shards(model, model, data, rank, world)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {"times": times, "bytes": None, "memory": memory, "state": state}


def bench_worker(rank: int, world: int, cfg_dict: dict, steps: int, micro_batches: int) -> dict:
    cfg = GPTConfig.from_dict(cfg_dict)
    data = make_data(cfg, steps)
    runs = {
        "DP (ours)": lambda: _ours(cfg, data, dict(dp=world), 0, 1),
        "DDP (torch)": lambda: _torch_ddp(cfg, data, rank, world),
        "ZeRO-1": lambda: _ours(cfg, data, dict(dp=world), 1, 1),
        "ZeRO-2": lambda: _ours(cfg, data, dict(dp=world), 2, 1),
        "ZeRO-3 (ours)": lambda: _ours(cfg, data, dict(dp=world), 3, 1),
        "FSDP2 (torch)": lambda: _torch_fsdp(cfg, data, rank, world),
        f"TP{world}": lambda: _ours(cfg, data, dict(tp=world), 0, 1),
        f"PP{world} 1F1B m={micro_batches}": lambda: _ours(
            cfg, data, dict(pp=world), 0, micro_batches
        ),
    }
    out = {}
    for name, run in runs.items():
        result = run()
        if rank != 0:
            result["state"] = None  # rank 0's full copy is enough
        out[name] = result
    return out


def main(argv=None) -> int:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--steps",
        type=in_range(int, 1, 10_000),
        default=10,
        help="timed steps (after 2 warm-up steps)",
    )
    parser.add_argument("--layers", type=in_range(int, 1, 256), default=4)
    parser.add_argument("--width", type=in_range(int, 1, 8192), default=128)
    parser.add_argument(
        "--world", type=in_range(int, 1, 64), default=2, help="processes (CPU, gloo)"
    )
    parser.add_argument(
        "--micro-batches", type=in_range(int, 1, 1024), default=4, help="pipeline micro-batches"
    )
    args = parser.parse_args(argv)
    if args.layers < args.world:
        parser.error(
            f"argument --layers: {args.layers} layers cannot fill {args.world} pipeline "
            f"stages: give --layers >= --world"
        )
    try:
        cfg = GPTConfig(
            vocab_size=1024,
            block_size=64,
            n_layer=args.layers,
            n_head=4,
            n_kv_head=4,
            n_embd=args.width,
        )
        warm = 2
        single = single_process(cfg, make_data(cfg, args.steps + warm), threads=1)
        results = launcher.launch(
            bench_worker,
            args.world,
            dataclasses.asdict(cfg),
            args.steps + warm,
            args.micro_batches,
            timeout_s=1800,
        )
    except (
        ConfigError,
        launcher.WorkerError,
    ) as e:  # a size that does not divide: one line, not a traceback
        parser.exit(2, f"bench_parallel.py: error: {e}\n")
    n = single["n"]
    base_time = statistics.median(single["times"][warm:])
    print(
        f"GPT {args.layers} layers x {args.width} wide, {n:,} parameters; {BATCH} x {cfg.block_size} tokens/step; "
        f"fp32 AdamW; {args.world} gloo ranks vs 1 process, 1 thread each"
    )
    dp_bytes = max(r["DP (ours)"]["bytes"] for r in results)
    print(
        f"DP theory: all-reduce 2(n-1)/n x 4 bytes x N = {2 * (args.world - 1) / args.world * 4 * n:,.0f} bytes; "
        f"ZeRO-3 at most 1.5x DP (the root unit, embedding and head, is not gathered again for backward)"
    )
    print(
        f"{'mode':<18} {'ms/step':>8} {'vs 1 proc':>9} {'bytes sent/step/rank':>21} {'x DP':>6} "
        f"{'state bytes/rank':>17} {'/ 16N':>6} {'max |w diff|':>13}"
    )
    print(
        f"{'1 process':<18} {1e3 * base_time:>8.1f} {1.0:>8.2f}x {'-':>21} {'':>6} {single['memory']:>17,} "
        f"{single['memory'] / (16 * n):>6.2f} {'-':>13}"
    )
    oracle = {"DDP (torch)": "DP (ours)", "FSDP2 (torch)": "ZeRO-3 (ours)"}
    for name in results[0]:
        step = max(statistics.median(r[name]["times"][warm:]) for r in results)
        sent = (
            max(r[name]["bytes"] for r in results)
            if results[0][name]["bytes"] is not None
            else None
        )
        memory = max(r[name]["memory"] for r in results)
        state = results[0][name]["state"]
        against = results[0][oracle[name]]["state"] if name in oracle else single["state"]
        diff = max(float((state[k] - against[k]).abs().max()) for k in against)
        print(
            f"{name:<18} {1e3 * step:>8.1f} {step / base_time:>8.2f}x "
            f"{'-' if sent is None else f'{sent:,.0f}':>21} "
            f"{'' if sent is None else f'{sent / dp_bytes:.2f}':>6} {memory:>17,} {memory / (16 * n):>6.2f} "
            f"{diff:>13.1e}" + (f"  (vs {oracle[name]})" if name in oracle else "")
        )
    sim = MP.simulate(MP.one_f_one_b_schedule(args.world, args.micro_batches))["bubble"]
    measured = launcher.launch(
        parallel_demo.measure_pipeline_bubble, args.world, "1f1b", args.micro_batches, timeout_s=600
    )
    print(
        f"pipeline bubble, {args.world} stages x {args.micro_batches} micro-batches: formula "
        f"{MP.bubble_fraction(args.world, args.micro_batches):.3f}, simulated {sim:.3f}, measured (idle share of "
        f"each stage's wall time) " + ", ".join(f"{r['bubble']:.3f}" for r in measured)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
