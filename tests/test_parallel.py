"""Tests for parallel.py: pure tests of the grid, layouts and schedules, then multi-process runs (gloo, CPU)
whose parameters after several AdamW steps must equal a single-process run that sees the whole batch.

Each launch forks its workers (about 0.1 s on Linux) and runs many checks; results come back to the parent,
which compares them with the single-process oracle, so a failure names the mode and the tensor.
"""
import math

import pytest
import torch

import parallel as P
from model import GPT, GPTConfig

# A tiny GQA model: 4 query heads, 2 kv heads, 2 layers; vocab 62 does not divide by 4 (padding is exercised).
CFG = GPTConfig(vocab_size=62, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64)
LR, STEPS, BATCH, SEQ = 1e-2, 5, 8, 16
CLIP = 0.25 # below the gradient norm of these steps, so every mode must compute the global norm right
# fp32 sums in another order differ by ~1e-7; Adam divides by sqrt(v), which can amplify that on a near-zero
# gradient. 5e-5 is still 200x below one step's update (lr = 1e-2), so any real mistake fails.
TOL = dict(rtol=1e-4, atol=5e-5)


def batches(steps=STEPS, batch=BATCH, seq=SEQ, vocab=CFG.vocab_size, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))
            for _ in range(steps)]


def param_groups(model):
    """Weight decay on matrices only, as train.py does: exercises several optimizer groups."""
    return [{"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]


def make_model(cfg=CFG, seed=0):
    torch.manual_seed(seed)
    return GPT(cfg)


def reference(cfg=CFG, steps=STEPS, data=None):
    """The oracle: one process, the whole batch, plain AdamW."""
    model = make_model(cfg)
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    for x, y in data or batches(steps, vocab=cfg.vocab_size):
        model(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return model, opt


def state(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def assert_same(got: dict, want: dict, what: str):
    assert got.keys() == want.keys(), what
    for k in want:
        torch.testing.assert_close(got[k], want[k], **TOL, msg=lambda m: f"{what}: {k}: {m}")


# ------------------------------------------------------------------------------------------------------------------
# Pure tests: grid, buckets, shards
# ------------------------------------------------------------------------------------------------------------------

def test_rank_grid_tp_innermost_pp_outermost():
    dp, tp, pp = 2, 2, 2
    coords = [P.rank_coords(r, dp, tp, pp) for r in range(8)]
    assert coords == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1), (1, 0, 0), (1, 0, 1), (1, 1, 0), (1, 1, 1)]
    assert all(P.coords_rank(*c, dp=dp, tp=tp) == r for r, c in enumerate(coords))
    groups = P.axis_groups(dp, tp, pp)
    assert groups["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert groups["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert groups["pp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert groups["embed"] == groups["pp"]


@pytest.mark.parametrize("dp,tp,pp", [(1, 1, 1), (4, 1, 1), (1, 2, 3), (3, 2, 2), (2, 1, 4)])
def test_every_axis_partitions_the_world(dp, tp, pp):
    world = dp * tp * pp
    for axis, size in [("dp", dp), ("tp", tp), ("pp", pp)]:
        groups = P.axis_groups(dp, tp, pp)[axis]
        assert sorted(r for g in groups for r in g) == list(range(world))
        assert all(len(g) == size for g in groups)
        # Members of a group differ only in that axis's coordinate.
        index = {"pp": 0, "dp": 1, "tp": 2}[axis]
        for g in groups:
            others = {tuple(c for i, c in enumerate(P.rank_coords(r, dp, tp, pp)) if i != index) for r in g}
            assert len(others) == 1


def test_mesh_sizes_must_multiply_to_world():
    with pytest.raises(P.ParallelError, match="world size 4 != dp\\*tp\\*pp"):
        P.check_mesh_sizes(4, 1, 3, 1)
    with pytest.raises(P.ParallelError, match=">= 1"):
        P.check_mesh_sizes(4, 4, 0, 1)


def test_bucket_layout_reverse_order_and_caps():
    assert P.bucket_layout([4, 4, 4, 12, 4], 8) == [[0, 1], [2, 3], [4]]
    assert P.bucket_layout([100], 8) == [[0]]
    assert P.bucket_layout([1] * 5, 10**9) == [[0, 1, 2, 3, 4]]
    layout = P.bucket_layout([3, 5, 7, 1, 9, 2], 6)
    assert [i for b in layout for i in b] == list(range(6))  # every tensor exactly once, order kept


def test_shard_layout_pads_to_divide():
    assert P.shard_layout([3, 4], 4) == ([0, 3, 7], 8, 2)
    offsets, padded, shard = P.shard_layout([5, 6, 7], 3)
    assert offsets == [0, 5, 11, 18] and padded == 18 and shard == 6
    offsets, padded, shard = P.shard_layout([10], 4)
    assert padded == 12 and shard * 4 == padded


def test_zero_memory_formula_reproduces_the_lecture():
    gb = 1e9
    assert P.zero_memory_per_rank(7e9, 8, 0) / gb == pytest.approx(112)
    assert P.zero_memory_per_rank(7e9, 8, 1) / gb == pytest.approx(38.5)
    assert P.zero_memory_per_rank(7e9, 8, 2) / gb == pytest.approx(26.25)
    assert P.zero_memory_per_rank(7e9, 8, 3) / gb == pytest.approx(14)
    assert P.zero_memory_per_rank(7e9, 4, 3) / gb == pytest.approx(28)


def test_clipping_is_active_in_these_runs():
    model = make_model()
    x, y = batches(1)[0]
    model(x, y)[1].backward()
    assert torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP) > 2 * CLIP


def test_named_optimizer_state_round_trip():
    model, opt = reference(steps=2)
    saved = P.named_optimizer_state(opt, model)
    assert "blocks.0.attn.wq.weight" in saved["state"]
    fresh = make_model()
    fresh.load_state_dict(model.state_dict())
    opt2 = torch.optim.AdamW(param_groups(fresh), lr=LR)
    P.load_named_optimizer_state(opt2, fresh, saved)
    x, y = batches(1, seed=9)[0]
    for m, o in [(model, opt), (fresh, opt2)]:
        m(x, y)[1].backward()
        o.step()
    assert_same(state(fresh), state(model), "resumed from named optimizer state")


# ------------------------------------------------------------------------------------------------------------------
# World 2: data parallel and ZeRO-1/2/3 in one launch
# ------------------------------------------------------------------------------------------------------------------

def _dp_and_zero_worker(rank, world):
    torch.manual_seed(100 + rank)  # different on purpose: the start broadcast must fix it
    mesh = P.Mesh.build()
    out = {}
    data = batches()
    # DP with tiny buckets (many all-reduces in flight) and 2 micro-batches, the first under no_sync.
    model = make_model(seed=rank)
    dp = P.DataParallel(model, mesh.dp, bucket_bytes=1024)
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    out["dp_buckets"] = len(dp.buckets)
    for x, y in data:
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        with dp.no_sync():
            (dp(xs[:2], ys[:2])[1] / 2).backward()
        (dp(xs[2:], ys[2:])[1] / 2).backward()
        dp.finish_gradient_sync()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)  # gradients are full and equal on every rank
        if x is data[0][0]:
            mesh.reset_counters()
        if x is data[1][0]:
            out["dp_step_bytes"] = mesh.dp.bytes_sent
        opt.step()
        out["dp_mem"] = P.training_state_bytes(model.parameters(), opt)
        opt.zero_grad()
    out["dp"] = state(model)
    for stage in (1, 2, 3):
        model = make_model(seed=rank)
        zero = P.Zero(model, mesh.dp, stage, torch.optim.AdamW, param_groups=param_groups(model), lr=LR)
        for i, (x, y) in enumerate(data):
            mesh.reset_counters()
            xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
            model(xs, ys)[1].backward()
            zero.finish_gradient_sync()
            zero.clip_grad_norm_(CLIP)
            zero.step()
            ops = dict(mesh.dp.bytes_by_op)
            assert ops.pop("all_reduce") == 8  # the two squared norms of clipping
            out[f"zero{stage}_step_bytes"] = sum(ops.values())
            if i == len(data) - 1:
                out[f"zero{stage}_mem"] = zero.memory_bytes()  # before zero_grad: gradients still held
            zero.zero_grad()
        out[f"zero{stage}"] = zero.full_state_dict()
        out[f"zero{stage}_opt"] = zero.optimizer_state_dict()
        out[f"zero{stage}_padded"] = [(u.padded, u in zero._units_of_module.get(id(model), [])) for u in zero.units]
    # Load the single-process state after 5 steps into ZeRO-3 on 2 ranks (1 -> 2 ranks), take a 6th step.
    ref_model, ref_opt = reference()
    model = make_model(seed=rank)
    zero = P.Zero(model, mesh.dp, 3, torch.optim.AdamW, param_groups=param_groups(model), lr=LR)
    zero.load_full_state_dict(state(ref_model))
    zero.load_optimizer_state_dict(P.named_optimizer_state(ref_opt, ref_model))
    x, y = batches(1, seed=9)[0]
    model(x.chunk(world)[rank], y.chunk(world)[rank])[1].backward()
    zero.clip_grad_norm_(CLIP)
    zero.step()
    out["resumed_on_2"] = zero.full_state_dict()
    with torch.no_grad():  # stage 3 evaluation: gathers and frees, no backward
        out["eval_loss"] = model(x, y)[1]
    return out


@pytest.fixture(scope="module")
def dp_zero_results():
    return P.launch(_dp_and_zero_worker, 2, timeout_s=120)


def test_data_parallel_equals_single_process(dp_zero_results):
    ref = state(reference()[0])
    assert dp_zero_results[0]["dp_buckets"] > 3
    for rank, res in enumerate(dp_zero_results):
        assert_same(res["dp"], ref, f"DP rank {rank}")


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_equals_single_process(dp_zero_results, stage):
    ref_model, ref_opt = reference()
    ref_opt_state = P.named_optimizer_state(ref_opt, ref_model)
    for rank, res in enumerate(dp_zero_results):
        assert_same(res[f"zero{stage}"], state(ref_model), f"ZeRO-{stage} rank {rank}")
        got = res[f"zero{stage}_opt"]
        for name, s in ref_opt_state["state"].items():
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(got["state"][name][key], s[key], **TOL)
        assert [g["weight_decay"] for g in got["param_groups"]] == [0.1, 0.0]


def test_zero_checkpoint_moves_between_layouts(dp_zero_results):
    """Saved on 2 ranks (ZeRO-3) -> resumed on 1 process, and 1 process -> 2 ranks: both equal 6 plain steps."""
    x, y = batches(1, seed=9)[0]
    ref_model, ref_opt = reference()
    ref_model(x, y)[1].backward()
    torch.nn.utils.clip_grad_norm_(ref_model.parameters(), CLIP)
    ref_opt.step()
    want = state(ref_model)
    for res in dp_zero_results:
        assert_same(res["resumed_on_2"], want, "1 process -> ZeRO-3 on 2 ranks")
    saved = dp_zero_results[0]
    model = make_model(seed=5)
    model.load_state_dict(saved["zero3"])
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    P.load_named_optimizer_state(opt, model, saved["zero3_opt"])
    model(x, y)[1].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    assert_same(state(model), want, "ZeRO-3 on 2 ranks -> 1 process")
    with torch.no_grad():
        torch.testing.assert_close(saved["eval_loss"], ref_model(x, y)[1], **TOL)  # ZeRO-3 forward under no_grad


def test_memory_per_rank_matches_formula(dp_zero_results):
    """fp32 AdamW: 4 bytes weights + 4 gradients + 8 optimizer = 16 bytes/param, sharded as ZeRO says."""
    n_params = make_model().num_params()
    world = 2
    shares = {0: (4, 4, 8), 1: (4, 4, 8 / world), 2: (4, 4 / world, 8 / world), 3: (4 / world, 4 / world, 8 / world)}
    for rank, res in enumerate(dp_zero_results):
        for stage in (0, 1, 2, 3):
            got = res["dp_mem" if stage == 0 else f"zero{stage}_mem"]
            measured = got["params"] + got["grads"] + got["optimizer"]
            formula = P.zero_memory_per_rank(n_params, world, stage, 4, 4, 8)
            assert sum(shares[stage]) * n_params == pytest.approx(formula)
            assert measured == pytest.approx(formula, rel=0.05), (stage, rank, got)
            assert got["params"] == pytest.approx(shares[stage][0] * n_params, rel=0.05)
            assert got["optimizer"] == pytest.approx(shares[stage][2] * n_params, rel=0.05)


def test_bytes_communicated_match_theory(dp_zero_results):
    """DP all-reduce: 2(n-1)/n of the gradient bytes; ZeRO-1/2 the same; ZeRO-3 about 1.5x."""
    n = 2
    grad_bytes = 4 * make_model().num_params()
    res = dp_zero_results[0]
    assert res["dp_step_bytes"] == pytest.approx(2 * (n - 1) / n * grad_bytes)
    padded = sum(p for p, _ in res["zero1_padded"])
    assert res["zero1_step_bytes"] == pytest.approx(2 * (n - 1) / n * 4 * padded)
    assert res["zero2_step_bytes"] == res["zero1_step_bytes"]
    # Stage 3 gathers every unit for forward, the blocks again for backward (the root stays), reduce-scatters all.
    blocks = sum(p for p, is_root in res["zero3_padded"] if not is_root)
    assert res["zero3_step_bytes"] == pytest.approx((n - 1) / n * 4 * (3 * padded - (padded - blocks)))
    assert 1.2 < res["zero3_step_bytes"] / res["dp_step_bytes"] <= 1.5 + 1e-3


# ------------------------------------------------------------------------------------------------------------------
# Failures
# ------------------------------------------------------------------------------------------------------------------

def _one_rank_dies(rank, world):
    if rank == 1:
        raise ValueError("simulated crash")
    t = torch.ones(4)
    torch.distributed.all_reduce(t)  # rank 0 would wait forever without the launcher's watch
    return t


def test_a_dying_rank_stops_the_run_with_a_clear_error():
    with pytest.raises(P.WorkerError, match="rank 1 failed: ValueError: simulated crash"):
        P.launch(_one_rank_dies, 2, timeout_s=60)


def _build_bad_mesh(rank, world):
    P.Mesh.build(dp=1, tp=3, pp=1)


def test_bad_mesh_is_one_clear_line():
    with pytest.raises(P.WorkerError, match="ParallelError: world size 2 != dp\\*tp\\*pp"):
        P.launch(_build_bad_mesh, 2, timeout_s=60)
