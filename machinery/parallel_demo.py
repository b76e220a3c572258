"""The demos of parallel.py and model_parallel.py: a tiny GPT trained in every layout on a few CPU
processes against one process, and a real pipeline's bubble. `python parallel.py demo|schedule`
runs them (machinery/commands/parallel.py); bench/bench_parallel.py times the pipeline."""

from __future__ import annotations

import torch

import model_parallel as MP
from machinery import parallelize as wiring
from machinery.launch import launch
from model import GPT, GPTConfig
from parallel import Mesh

DEMO = dict(
    vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64
)
DEMO_MOE = dict(n_expert=4, expert_top_k=2, moe_capacity_factor=0.0)  # EP over 1, 2 or 4 ranks
BATCH = 8  # sequences per step, split over the data-parallel ranks


def demo_world_sizes() -> list[int]:
    """The process counts every layout of the demo model splits over: TP splits the heads, PP the
    layers, DP the batch, each over all ranks."""
    cfg = GPTConfig(**DEMO)
    sizes = (cfg.n_head, cfg.n_kv_head, cfg.n_layer, BATCH)
    return [w for w in range(1, 9) if all(d % w == 0 for d in sizes)]


def measure_pipeline_bubble(
    rank: int, world: int, schedule: str, micro_batches: int, steps: int = 3
) -> dict:
    """(launch target) Time a real pipeline of `world` stages on a small GPT: busy vs wall time per
    stage."""
    torch.manual_seed(0)
    cfg = GPTConfig(
        vocab_size=256, block_size=64, n_layer=2 * world, n_head=4, n_kv_head=4, n_embd=128
    )
    pipe = MP.PipelineParallel(GPT(cfg), Mesh.build(pp=world), schedule)
    x = torch.randint(0, cfg.vocab_size, (2 * micro_batches, cfg.block_size))
    bubbles = []
    for _ in range(steps):
        pipe.step(x, x, micro_batches)
        bubbles.append(pipe.stats["bubble"])
    return {"bubble": min(bubbles)}


def _random_batches(steps: int, generator: torch.Generator) -> list:
    """`steps` (inputs, targets) pairs of (BATCH, 16) random ids of the demo vocabulary."""
    return [
        tuple(torch.randint(0, 64, (BATCH, 16), generator=generator) for _ in range(2))
        for _ in range(steps)
    ]


def _train_layout(wrapped, wopt, mesh: Mesh, data: list) -> dict:
    """Train through one layout; the last step's bytes sent and training-state bytes held."""
    for x, y in data:
        mesh.reset_counters()
        xs, ys = x.chunk(mesh.dp.size)[mesh.dp.rank], y.chunk(mesh.dp.size)[mesh.dp.rank]
        if wrapped.pipe is not None:
            wrapped.pipeline_step(list(zip(xs.chunk(4), ys.chunk(4))))
        else:
            wrapped(xs, ys)[1].backward()
            wrapped.finish_gradient_sync()
        wopt.step()
        sent = mesh.bytes_sent()  # before the state dict's gathers
        if wrapped.zero is not None:  # measured before zero_grad: the gradients are still held
            mem = wiring.zero_memory_bytes(wrapped.zero)
        else:
            mem = wiring.training_state_bytes(wrapped.model.parameters(), wopt.inner)
        wopt.zero_grad()
    return {"state": wrapped.full_state_dict(), "bytes": sent, "memory": sum(mem.values())}


def demo_worker(rank: int, world: int, steps: int) -> dict:
    """(launch target) Train a tiny GPT `steps` AdamW steps in each layout; return its full
    weights, traffic and memory."""
    data = _random_batches(steps, torch.Generator().manual_seed(1))
    out = {}
    for name, sizes, zero in [
        ("DP", dict(dp=world), 0),
        ("ZeRO-1", dict(dp=world), 1),
        ("ZeRO-2", dict(dp=world), 2),
        ("ZeRO-3", dict(dp=world), 3),
        (f"TP{world}", dict(tp=world), 0),
        (f"PP{world} 1F1B", dict(pp=world), 0),
    ]:
        torch.manual_seed(0)
        model = GPT(GPTConfig(**DEMO))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        mesh = Mesh.build(**sizes)
        wrapped, wopt = wiring.parallelize(model, opt, mesh, zero=zero)
        out[name] = _train_layout(wrapped, wopt, mesh, data)
    return out


def ep_cp_demo_worker(rank: int, world: int, batch: tuple) -> dict:
    """(launch target) One forward + backward of a MoE GPT under EP and a dense one under CP over
    `world` ranks: the loss, the bytes the all-to-all / the K/V ring sent, and their formula."""
    out = {}
    for name, extra, ep, cp in [(f"EP{world}", DEMO_MOE, world, 1), (f"CP{world}", {}, 1, world)]:
        torch.manual_seed(0)
        cfg = GPTConfig(**DEMO, **extra)
        model, mesh = GPT(cfg), Mesh.build(cp=cp)
        wrapped, _ = wiring.parallelize(model, torch.optim.SGD(model.parameters()), mesh, ep=ep)
        x, y = (t.chunk(mesh.dp.size)[mesh.dp.rank] for t in batch)
        B, T = x.shape
        if ep > 1:
            comm, op = wrapped.module.ep, "all_to_all"
            want = MP.all_to_all_bytes(cfg.n_expert, B * T, cfg.n_embd, ep)  # capacity = B T
        else:
            comm, op = mesh.cp, "send"  # the ring's sends, not the loss's sum
            want = MP.ring_bytes(B, T, cfg.n_kv_head, cfg.head_dim, cp)
        comm.reset_counters()
        loss = wrapped(x, y)[1]
        loss.backward()
        out[name] = (float(loss.detach()), comm.bytes_by_op.get(op, 0), cfg.n_layer * want)
    return out


def demo(world: int, steps: int) -> None:
    """Train a tiny GPT in every layout on `world` processes; print each against one process."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**DEMO))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for x, y in _random_batches(steps, g):
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    want, n = model.state_dict(), model.num_params()
    results = launch(demo_worker, world, steps, timeout_s=300)
    print(
        f"{n:,} parameters, {steps} AdamW steps on {world} ranks vs one process (fp32, "
        f"16 bytes/param = {16 * n:,} bytes in one process)"
    )
    print(
        f"{'mode':<12} {'max |diff|':>11} {'bytes sent/step/rank':>21} {'state bytes/rank':>17} "
        f"{'vs 1 process':>13}"
    )
    for mode in results[0]:
        diffs = [(r[mode]["state"][k] - want[k]).abs().max() for r in results for k in want]
        sent = max(r[mode]["bytes"] for r in results)
        memory = max(r[mode]["memory"] for r in results)
        diff = float(max(diffs))
        print(f"{mode:<12} {diff:>11.2e} {sent:>21,.0f} {memory:>17,} {memory / (16 * n):>12.2f}x")
    batch = _random_batches(1, g)[0]
    results = launch(ep_cp_demo_worker, world, batch, timeout_s=300)
    print(
        f"\none forward + backward: EP (MoE, {DEMO_MOE['n_expert']} experts, capacity factor 0)"
        " and CP (ring attention) vs one process"
    )
    print(f"{'mode':<12} {'|loss diff|':>11} {'bytes sent/rank':>16} {'by the formula':>15}")
    for (mode, (_, sent, want)), extra in zip(results[0].items(), (DEMO_MOE, {})):
        torch.manual_seed(0)
        with torch.no_grad():
            one = float(GPT(GPTConfig(**DEMO, **extra))(*batch)[1])
        loss = sum(r[mode][0] for r in results) / len(results)
        print(f"{mode:<12} {abs(loss - one):>11.2e} {sent:>16,.0f} {want:>15,.0f}")


def render_schedule(schedule: list[list[MP.Action]]) -> str:
    """The schedule as a time grid (forward and backward one slot each), as drawn in the lesson.
    >>> print(render_schedule(MP.afab_schedule(2, 2)))
    stage 0: F0 F1 .  .  B0 B1
    stage 1: .  F0 F1 B0 B1 .
    """
    timeline = MP.simulate(schedule, 1.0, 1.0)["timeline"]
    width = int(max(t for line in timeline for t, _ in line)) + 1
    cell = max(len(f"{a.op}{a.mb}") for line in timeline for _, a in line) + 1
    rows = []
    for s, line in enumerate(timeline):
        cells = [".".ljust(cell)] * width
        for t, a in line:
            cells[int(t)] = f"{a.op}{a.mb}".ljust(cell)
        rows.append(f"stage {s}: " + "".join(cells).rstrip())
    return "\n".join(rows)


def schedule(p: int, m: int, name: str, measure: bool) -> None:
    """Draw a pipeline schedule, simulate its bubble, and with `measure` time a real pipeline."""
    actions = MP.SCHEDULES[name](p, m)
    print(render_schedule(actions))
    sim = MP.simulate(actions)
    print(
        f"bubble: simulated {sim['bubble']:.3f}, formula (p-1)/(m+p-1) = "
        f"{MP.bubble_fraction(p, m):.3f}; "
        f"peak micro-batches in flight per stage: {sim['peak_in_flight']}"
    )
    if measure:
        measured = launch(measure_pipeline_bubble, p, name, m, timeout_s=300)
        print(
            f"measured on {p} processes (busy vs wall time per stage): "
            + ", ".join(f"{r['bubble']:.3f}" for r in measured)
        )
