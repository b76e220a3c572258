"""Tests for parallel.py and model_parallel.py: pure tests of the grid, layouts and schedules, then multi-process
runs (gloo, CPU) whose parameters after several AdamW steps must equal a single-process run that sees the whole
batch.

Clipped AdamW hides the gradient's scale: clipping rescales to a fixed norm and Adam divides by sqrt(v), so ranks
that summed their gradients instead of averaging them would end with the same weights. So every layout is also
compared on what sees the scale: the pre-clip global gradient norm at every step, and two steps of plain SGD
without clipping (a gradient twice too large moves every weight twice as far).

Each launch forks its workers (about 0.1 s on Linux) and runs many checks; results come back to the parent,
which compares them with the single-process oracle, so a failure names the mode and the tensor.
"""

import contextlib
import dataclasses
import copy

import pytest
import torch

import model_parallel as MP
from machinery import launch as launcher
from machinery import parallelize as wiring
import parallel as P
from machinery.commands import parallel as command
from model import GPT, GPTConfig

# A tiny GQA model: 4 query heads, 2 kv heads, 2 layers; vocab 62 does not divide by 4 (padding is exercised).
CFG = GPTConfig(
    vocab_size=62, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64
)
LR, STEPS, BATCH, SEQ = 1e-2, 5, 8, 16
CLIP = (
    0.25  # below the gradient norm of these steps, so every mode must compute the global norm right
)
# fp32 sums in another order differ by ~1e-7; Adam divides by sqrt(v), which can amplify that on a near-zero
# gradient. 1e-4 is still 100x below one step's update (lr = 1e-2), so any real mistake fails.
TOL = dict(rtol=1e-4, atol=1e-4)
SGD_LR, SGD_STEPS = (
    0.1,
    2,
)  # plain SGD, no clipping: an update of lr * g, so g's scale shows in the weights


def batches(steps=STEPS, batch=BATCH, seq=SEQ, vocab=CFG.vocab_size, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randint(0, vocab, (batch, seq), generator=g),
            torch.randint(0, vocab, (batch, seq), generator=g),
        )
        for _ in range(steps)
    ]


def param_groups(model):
    """Weight decay on matrices only, as train.py does: exercises several optimizer groups."""
    return [
        {"params": [p for p in model.parameters() if p.dim() >= 2], "weight_decay": 0.1},
        {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0},
    ]


def make_model(cfg=CFG, seed=0):
    torch.manual_seed(seed)
    return GPT(cfg)


_REFERENCE_CACHE: dict = {}


def reference(cfg=CFG, steps=STEPS, data=None):
    """The oracle: one process, the whole batch, plain AdamW (computed once per setting; callers get copies)."""
    return copy.deepcopy(_reference_with_norms(cfg, steps, data)[:2])


def reference_norms(cfg=CFG, steps=STEPS, data=None) -> torch.Tensor:
    """The oracle's global gradient norm before clipping, one per step (steps,)."""
    return _reference_with_norms(cfg, steps, data)[2].clone()


def _reference_with_norms(cfg, steps, data):
    key = (repr(cfg), steps, None if data is None else tuple(int(x.sum()) for x, _ in data))
    if key not in _REFERENCE_CACHE:
        _REFERENCE_CACHE[key] = _reference_uncached(cfg, steps, data)
    return _REFERENCE_CACHE[key]


def _reference_uncached(cfg, steps, data):
    model = make_model(cfg)
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    norms = []
    for x, y in data or batches(steps, vocab=cfg.vocab_size):
        model(x, y)[1].backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        opt.step()
        opt.zero_grad()
    return model, opt, torch.stack(norms) if norms else torch.zeros(0)


def reference_sgd(cfg=CFG, data=None) -> dict:
    """The scale oracle: one process, the whole batch, SGD_STEPS steps of plain SGD without clipping."""
    model = make_model(cfg)
    opt = torch.optim.SGD(param_groups(model), lr=SGD_LR)
    for x, y in (data or batches(vocab=cfg.vocab_size))[:SGD_STEPS]:
        model(x, y)[1].backward()
        opt.step()
        opt.zero_grad()
    return state(model)


def assert_norms(got: torch.Tensor, want: torch.Tensor, what: str):
    """Pre-clip gradient norms, step by step: ranks that sum instead of average show a factor of the world size."""
    torch.testing.assert_close(
        torch.as_tensor(got, dtype=want.dtype),
        want,
        rtol=1e-4,
        atol=0,
        msg=lambda m: f"{what}: pre-clip grad norms {got} != {want}: {m}",
    )


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
    assert coords == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
        (1, 0, 0),
        (1, 0, 1),
        (1, 1, 0),
        (1, 1, 1),
    ]
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
            others = {
                tuple(c for i, c in enumerate(P.rank_coords(r, dp, tp, pp)) if i != index)
                for r in g
            }
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
    saved = wiring.named_optimizer_state(opt, model)
    assert "blocks.0.attn.wq.weight" in saved["state"]
    fresh = make_model()
    fresh.load_state_dict(model.state_dict())
    opt2 = torch.optim.AdamW(param_groups(fresh), lr=LR)
    wiring.load_named_optimizer_state(opt2, fresh, saved)
    x, y = batches(1, seed=9)[0]
    for m, o in [(model, opt), (fresh, opt2)]:
        m(x, y)[1].backward()
        o.step()
    assert_same(state(fresh), state(model), "resumed from named optimizer state")


# ------------------------------------------------------------------------------------------------------------------
# World 2: data parallel and ZeRO-1/2/3 in one launch
# ------------------------------------------------------------------------------------------------------------------


def _train_muon(model, data, forward) -> dict:
    """`model` after train.py's Muon (hidden matrices) + AdamW (the rest) stepped on `data` through `forward`."""
    import train

    optimizer = train.make_optimizer(model, train.TrainConfig(optimizer="muon", lr=LR), "cpu")
    for x, y in data:
        forward(x, y)[1].backward()
        getattr(forward, "finish_gradient_sync", lambda: None)()
        optimizer.step()
        optimizer.zero_grad()
    return state(model)


def _dp_and_zero_worker(rank, world):
    torch.manual_seed(100 + rank)  # different on purpose: the start broadcast must fix it
    mesh = P.Mesh.build()
    out = {}
    data = batches()
    # Muon under DP: the gradient is all-reduced first, so each rank orthogonalises the full matrix
    muon_model = make_model(seed=rank)
    muon_dp = P.DataParallel(muon_model, mesh.dp)
    out["dp_muon"] = _train_muon(
        muon_model, [(x.chunk(world)[rank], y.chunk(world)[rank]) for x, y in data], muon_dp
    )
    # Muon under ZeRO-1/2/3: the momentum is sharded; each unit's shards are gathered to
    # orthogonalise whole matrices (Zero._orthogonalise_shard), and each rank keeps its slice
    import train

    for stage in (1, 2, 3):
        muon_model = make_model(seed=rank)
        single = train.make_optimizer(muon_model, train.TrainConfig(optimizer="muon", lr=LR), "cpu")
        zero = P.Zero(muon_model, mesh.dp, stage, train.Muon, param_groups=single.param_groups)
        for x, y in data:
            muon_model(x.chunk(world)[rank], y.chunk(world)[rank])[1].backward()
            zero.step()
            zero.zero_grad()
        out[f"zero{stage}_muon"] = wiring.zero_full_state_dict(zero)
        out[f"zero{stage}_muon_opt"] = wiring.zero_optimizer_state_dict(zero)
    # DP with tiny buckets (many all-reduces in flight) and 2 micro-batches, the first under no_sync.
    model = make_model(seed=rank)
    dp = P.DataParallel(model, mesh.dp, bucket_bytes=1024)
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    out["dp_buckets"] = len(dp.buckets)
    out["dp_norms"] = []
    for x, y in data:
        xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
        with dp.no_sync():
            (dp(xs[:2], ys[:2])[1] / 2).backward()
        assert dp._next_bucket == 0  # no_sync: nothing sent
        (dp(xs[2:], ys[2:])[1] / 2).backward()
        out["dp_launched_in_backward"] = (
            dp._next_bucket
        )  # every bucket started before backward returned
        dp.finish_gradient_sync()
        # gradients are full and equal on every rank
        out["dp_norms"].append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        if x is data[0][0]:
            mesh.reset_counters()
        if x is data[1][0]:
            out["dp_step_bytes"] = mesh.dp.bytes_sent
        opt.step()
        out["dp_mem"] = wiring.training_state_bytes(model.parameters(), opt)
        opt.zero_grad()
    out["dp"] = state(model)
    # A frozen parameter is in no bucket and never changes; the others still match one process.
    model = make_model(seed=rank)
    model.blocks[0].attn_norm.weight.requires_grad_(False)
    dp = P.DataParallel(model, mesh.dp, bucket_bytes=1024)
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    out["dp_frozen_norms"] = []
    for x, y in data:
        dp(x.chunk(world)[rank], y.chunk(world)[rank])[1].backward()
        dp.finish_gradient_sync()
        out["dp_frozen_norms"].append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        opt.step()
        opt.zero_grad()
    out["dp_frozen"] = state(model)
    out["dp_frozen_in_buckets"] = any(
        p is model.blocks[0].attn_norm.weight for b in dp.buckets for p in b.params
    )
    for stage in (1, 2, 3):
        model = make_model(seed=rank)
        zero = P.Zero(
            model, mesh.dp, stage, torch.optim.AdamW, param_groups=param_groups(model), lr=LR
        )
        out[f"zero{stage}_norms"] = []
        for i, (x, y) in enumerate(data):
            mesh.reset_counters()
            xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
            model(xs, ys)[1].backward()
            out[f"zero{stage}_launched_in_backward"] = zero._next_bucket
            out[f"zero{stage}_units"] = len(zero.units)
            zero.finish_gradient_sync()
            out[f"zero{stage}_norms"].append(zero.clip_grad_norm_(CLIP))
            zero.step()
            ops = dict(mesh.dp.bytes_by_op)
            assert ops.pop("all_reduce") == 8  # the two squared norms of clipping
            out[f"zero{stage}_step_bytes"] = sum(ops.values())
            if i == len(data) - 1:
                out[f"zero{stage}_mem"] = wiring.zero_memory_bytes(
                    zero
                )  # before zero_grad: gradients still held
            zero.zero_grad()
        out[f"zero{stage}"] = wiring.zero_full_state_dict(zero)
        out[f"zero{stage}_opt"] = wiring.zero_optimizer_state_dict(zero)
        out[f"zero{stage}_padded"] = [
            (u.padded, u in zero._units_of_module.get(id(model), [])) for u in zero.units
        ]
    # Plain SGD, no clipping: DP (2 micro-batches, the first under no_sync) and ZeRO-1/2/3.
    for stage in (0, 1, 2, 3):
        model = make_model(seed=rank)
        if stage == 0:
            sync = P.DataParallel(model, mesh.dp, bucket_bytes=1024)
            opt = torch.optim.SGD(param_groups(model), lr=SGD_LR)
        else:
            sync = opt = P.Zero(
                model, mesh.dp, stage, torch.optim.SGD, param_groups=param_groups(model), lr=SGD_LR
            )
        for x, y in data[:SGD_STEPS]:
            xs, ys = x.chunk(world)[rank], y.chunk(world)[rank]
            with sync.no_sync():
                (model(xs[:2], ys[:2])[1] / 2).backward()
            (model(xs[2:], ys[2:])[1] / 2).backward()
            sync.finish_gradient_sync()
            opt.step()
            opt.zero_grad()
        out[f"sgd_zero{stage}"] = state(model) if stage == 0 else wiring.zero_full_state_dict(sync)
    # Load the single-process state after 5 steps into ZeRO-3 on 2 ranks (1 -> 2 ranks), take a 6th step.
    ref_model, ref_opt = reference()
    model = make_model(seed=rank)
    zero = P.Zero(model, mesh.dp, 3, torch.optim.AdamW, param_groups=param_groups(model), lr=LR)
    wiring.load_zero_full_state_dict(zero, state(ref_model))
    wiring.load_zero_optimizer_state_dict(zero, wiring.named_optimizer_state(ref_opt, ref_model))
    x, y = batches(1, seed=9)[0]
    model(x.chunk(world)[rank], y.chunk(world)[rank])[1].backward()
    out["resumed_on_2_norm"] = zero.clip_grad_norm_(CLIP)
    zero.step()
    out["resumed_on_2"] = wiring.zero_full_state_dict(zero)
    with torch.no_grad():  # stage 3 evaluation: gathers and frees, no backward
        out["eval_loss"] = model(x, y)[1]
    return out


@pytest.fixture(scope="module")
def dp_zero_results():
    return launcher.launch(_dp_and_zero_worker, 2, timeout_s=120)


def test_data_parallel_equals_single_process(dp_zero_results):
    ref = state(reference()[0])
    assert dp_zero_results[0]["dp_buckets"] > 3
    for rank, res in enumerate(dp_zero_results):
        assert_same(res["dp"], ref, f"DP rank {rank}")
        assert_norms(res["dp_norms"], reference_norms(), f"DP rank {rank}")
        assert_same(res["sgd_zero0"], reference_sgd(), f"DP rank {rank}, plain SGD")
        assert (
            res["dp_launched_in_backward"] == res["dp_buckets"]
        )  # overlap: hooks started every all-reduce


def test_muon_under_data_parallel_equals_single_process(dp_zero_results):
    """Every rank orthogonalises the same all-reduced full matrix: the one-process run's weights."""
    model = make_model()
    want = _train_muon(model, batches(), model)
    changed = [k for k in want if not torch.equal(want[k], state(make_model())[k])]
    assert any("attn.wq" in k for k in changed) and any("tok_emb" in k for k in changed)
    for rank, res in enumerate(dp_zero_results):
        assert_same(res["dp_muon"], want, f"Muon under DP, rank {rank}")


def test_muon_under_zero_equals_single_process(dp_zero_results):
    """ZeRO-1/2/3 shard Muon's momentum flat; gathering each unit's shards to orthogonalise whole
    matrices gives the one-process weights and momentum (a shard orthogonalised alone would not)."""
    import train

    model = make_model()
    optimizer = train.make_optimizer(model, train.TrainConfig(optimizer="muon", lr=LR), "cpu")
    for x, y in batches():
        model(x, y)[1].backward()
        optimizer.step()
        optimizer.zero_grad()
    want_momentum = wiring.named_optimizer_state(optimizer, model)["state"]
    for stage in (1, 2, 3):
        for rank, res in enumerate(dp_zero_results):
            assert_same(res[f"zero{stage}_muon"], state(model), f"Muon, ZeRO-{stage}, rank {rank}")
            got = res[f"zero{stage}_muon_opt"]["state"]
            for name, saved in want_momentum.items():
                if "momentum" in saved:
                    assert torch.allclose(got[name]["momentum"], saved["momentum"], atol=1e-6), name


def test_data_parallel_skips_frozen_parameters(dp_zero_results):
    model = make_model()
    model.blocks[0].attn_norm.weight.requires_grad_(False)
    before = model.blocks[0].attn_norm.weight.detach().clone()
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    norms = []
    for x, y in batches():
        model(x, y)[1].backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        opt.step()
        opt.zero_grad()
    for res in dp_zero_results:
        assert not res["dp_frozen_in_buckets"]
        assert_same(res["dp_frozen"], state(model), "DP with a frozen parameter")
        assert_norms(res["dp_frozen_norms"], torch.stack(norms), "DP with a frozen parameter")
        torch.testing.assert_close(
            res["dp_frozen"]["blocks.0.attn_norm.weight"], before, rtol=0, atol=0
        )


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_equals_single_process(dp_zero_results, stage):
    ref_model, ref_opt = reference()
    ref_opt_state = wiring.named_optimizer_state(ref_opt, ref_model)
    for rank, res in enumerate(dp_zero_results):
        assert_same(res[f"zero{stage}"], state(ref_model), f"ZeRO-{stage} rank {rank}")
        assert_norms(res[f"zero{stage}_norms"], reference_norms(), f"ZeRO-{stage} rank {rank}")
        assert_same(
            res[f"sgd_zero{stage}"], reference_sgd(), f"ZeRO-{stage} rank {rank}, plain SGD"
        )
        # Stages 2-3 start every unit's reduce-scatter from the gradient hooks, during backward; stage 1 at finish.
        assert res[f"zero{stage}_launched_in_backward"] == (
            0 if stage == 1 else res[f"zero{stage}_units"]
        )
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
    want_norm = torch.nn.utils.clip_grad_norm_(ref_model.parameters(), CLIP)
    ref_opt.step()
    want = state(ref_model)
    for res in dp_zero_results:
        assert_same(res["resumed_on_2"], want, "1 process -> ZeRO-3 on 2 ranks")
        assert_norms(
            res["resumed_on_2_norm"].reshape(1),
            want_norm.reshape(1),
            "1 process -> ZeRO-3 on 2 ranks",
        )
    saved = dp_zero_results[0]
    model = make_model(seed=5)
    model.load_state_dict(saved["zero3"])
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    wiring.load_named_optimizer_state(opt, model, saved["zero3_opt"])
    model(x, y)[1].backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    opt.step()
    assert_same(state(model), want, "ZeRO-3 on 2 ranks -> 1 process")
    with torch.no_grad():
        torch.testing.assert_close(
            saved["eval_loss"], ref_model(x, y)[1], **TOL
        )  # ZeRO-3 forward under no_grad


def test_memory_per_rank_matches_formula(dp_zero_results):
    """fp32 AdamW: 4 bytes weights + 4 gradients + 8 optimizer = 16 bytes/param, sharded as ZeRO says."""
    n_params = make_model().num_params()
    world = 2
    shares = {
        0: (4, 4, 8),
        1: (4, 4, 8 / world),
        2: (4, 4 / world, 8 / world),
        3: (4 / world, 4 / world, 8 / world),
    }
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
    assert res["zero3_step_bytes"] == pytest.approx(
        (n - 1) / n * 4 * (3 * padded - (padded - blocks))
    )
    assert 1.2 < res["zero3_step_bytes"] / res["dp_step_bytes"] <= 1.5 + 1e-3


# ------------------------------------------------------------------------------------------------------------------
# World 2: ZeRO-3 in mixed precision (bf16 gathers, bf16 or fp32 reduce-scatters, fp32 master shards)
# ------------------------------------------------------------------------------------------------------------------

MIXED = {
    "fp32": (torch.float32, None),
    "bf16/fp32": (torch.bfloat16, None),
    "bf16/bf16": (torch.bfloat16, torch.bfloat16),
}


def _zero3_mixed_precision_worker(rank, world):
    mesh = P.Mesh.build()
    out = {}
    for name, (compute, reduce) in MIXED.items():
        model = make_model(seed=rank)
        zero = P.Zero(
            model,
            mesh.dp,
            3,
            torch.optim.AdamW,
            param_groups=param_groups(model),
            lr=LR,
            compute_dtype=compute,
            reduce_dtype=reduce,
        )
        seen = []  # what block 0 computes with: runs after Zero's gather hook
        model.blocks[0].register_forward_pre_hook(
            lambda m, a: seen.append(
                (m.attn.wq.weight.dtype, zero._units_of_module[id(m)][0].full.nbytes)
            )
        )
        losses = []
        for i, (x, y) in enumerate(batches()):
            mesh.reset_counters()
            loss = model(x.chunk(world)[rank], y.chunk(world)[rank])[1]
            loss.backward()
            zero.finish_gradient_sync()
            if i == 0:
                grads, names = {}, wiring._param_names(model)
                for u in zero.units:
                    flat = torch.empty(u.padded, dtype=u.shard.grad.dtype)
                    P._all_gather_flat(flat, u.shard.grad)
                    for q, o in zip(u.params, u.offsets):
                        grads[names[id(q)]] = flat[o : o + q.numel()].view(q.shape).clone()
                out[f"{name} grads"] = grads
                out[f"{name} bytes"] = dict(mesh.dp.bytes_by_op)
                out[f"{name} units"] = [
                    (u.padded, u in zero._units_of_module.get(id(model), [])) for u in zero.units
                ]
                out[f"{name} shard dtypes"] = {u.shard.dtype for u in zero.units} | {
                    u.shard.grad.dtype for u in zero.units
                }
            losses.append(float(loss.detach()))
            zero.clip_grad_norm_(CLIP)
            zero.step()
            out[f"{name} memory"] = wiring.zero_memory_bytes(
                zero
            )  # after backward and step: gradients still held
            zero.zero_grad()
        out[f"{name} seen"] = seen[0]
        out[f"{name} losses"] = torch.tensor(losses)
        out[f"{name} state"] = wiring.zero_full_state_dict(zero)
    return out


@pytest.fixture(scope="module")
def mixed_results():
    return launcher.launch(_zero3_mixed_precision_worker, 2, timeout_s=120)


def _reference_losses_and_first_grads():
    """One process, fp32, the whole batch: per-step losses (mean of the two halves, as the ranks report) and the
    first step's gradients."""
    model = make_model()
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    losses, grads = [], None
    for x, y in batches():
        halves = [model(x.chunk(2)[r], y.chunk(2)[r])[1] / 2 for r in range(2)]
        sum(halves).backward()
        losses.append([2 * float(h.detach()) for h in halves])
        if grads is None:
            grads = {n: q.grad.clone() for n, q in model.named_parameters()}
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        opt.zero_grad()
    return torch.tensor(losses), grads, state(model)


def test_zero3_mixed_precision_gathers_bf16_keeps_fp32_masters_and_stays_close(mixed_results):
    ref_losses, ref_grads, ref_state = _reference_losses_and_first_grads()
    start = state(make_model())
    for rank, res in enumerate(mixed_results):
        assert_same(
            res["fp32 state"], ref_state, f"ZeRO-3 fp32 (compute_dtype=float32) rank {rank}"
        )  # exact
        for name in ("bf16/fp32", "bf16/bf16"):
            dtype, nbytes = res[f"{name} seen"]
            padded = res[f"{name} units"][0][0]
            assert dtype == torch.bfloat16 and nbytes == 2 * padded, (
                name
            )  # block 0 ran on a bf16 gathered copy
            assert res[f"{name} shard dtypes"] == {torch.float32}, (
                name
            )  # fp32 masters and shard gradients
            # Tolerances ~3x what bf16 (8 significant bits) gave here: losses 4e-4, gradients 1e-2 (relative
            # norm of the error), 5 AdamW steps 0.15 (Adam's 1/sqrt(v) amplifies noise on small gradients).
            torch.testing.assert_close(
                res[f"{name} losses"], ref_losses[:, rank], rtol=2e-3, atol=0
            )
            for k, g in ref_grads.items():
                err = (res[f"{name} grads"][k] - g).norm() / g.norm()
                assert err < 0.03, (name, k, float(err))
            for k in ref_state:
                moved, ref_moved = res[f"{name} state"][k] - start[k], ref_state[k] - start[k]
                assert res[f"{name} state"][k].dtype == torch.float32
                assert (moved - ref_moved).norm() / ref_moved.norm() < 0.3, (name, k)


def test_zero3_mixed_precision_traffic_matches_the_formula(mixed_results):
    """Gathers in bf16 send half the bytes of fp32 gathers; reduce-scatters in the chosen dtype."""
    res = mixed_results[0]
    units = res["fp32 units"]
    blocks = sum(p for p, is_root in units if not is_root)
    other = sum(p for p, is_root in units if is_root)
    bytes_of = {"fp32": (4, 4), "bf16/fp32": (2, 4), "bf16/bf16": (2, 2)}
    for name, (gather, reduce) in bytes_of.items():
        sent = res[f"{name} bytes"]
        assert sent["all_gather"] + sent["reduce_scatter"] == pytest.approx(
            P.zero_bytes_per_step(blocks, other, 2, 3, gather, reduce)
        ), name
    assert res["bf16/fp32 bytes"]["all_gather"] == res["fp32 bytes"]["all_gather"] / 2
    assert res["bf16/fp32 bytes"]["reduce_scatter"] == res["fp32 bytes"]["reduce_scatter"]
    assert res["bf16/bf16 bytes"]["reduce_scatter"] == res["fp32 bytes"]["reduce_scatter"] / 2


def test_zero3_mixed_precision_holds_what_the_formulas_say(mixed_results):
    """Between steps a rank holds fp32 shards, fp32 shard gradients and AdamW's two moments: 4/n + 4/n + 8/n
    bytes per parameter, in bf16 mode as in fp32 (the bf16 copies exist only while a unit is gathered)."""
    import scaling

    n_params = make_model().num_params()
    for res in mixed_results:
        for name in MIXED:
            got = res[f"{name} memory"]
            assert got["params"] == pytest.approx(4 / 2 * n_params, rel=0.05), name
            assert got["grads"] == pytest.approx(4 / 2 * n_params, rel=0.05), name
            assert got["optimizer"] == pytest.approx(8 / 2 * n_params, rel=0.05), name
            assert sum(got.values()) == pytest.approx(
                P.zero_memory_per_rank(n_params, 2, 3, 4, 4, 8), rel=0.05
            )
            assert sum(got.values()) == pytest.approx(
                scaling.training_memory(n_params, 2, 3, 4, 4, 8).total, rel=0.05
            )


def test_mixed_precision_is_zero3s_only():
    with pytest.raises(P.ParallelError, match="stage 2 keeps full fp32 weights"):
        P.Zero(make_model(), P.Comm.single(), 2, compute_dtype=torch.bfloat16)


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
    with pytest.raises(launcher.WorkerError, match="rank 1 failed: ValueError: simulated crash"):
        launcher.launch(_one_rank_dies, 2, timeout_s=60)


def _build_bad_mesh(rank, world):
    P.Mesh.build(dp=1, tp=3, pp=1)


def test_bad_mesh_is_one_clear_line():
    with pytest.raises(launcher.WorkerError, match="ParallelError: world size 2 != dp\\*tp\\*pp"):
        launcher.launch(_build_bad_mesh, 2, timeout_s=60)


# ------------------------------------------------------------------------------------------------------------------
# Pipeline schedules, without processes
# ------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["afab", "1f1b"])
@pytest.mark.parametrize(
    "p,m", [(1, 1), (1, 3), (2, 1), (2, 4), (3, 2), (4, 1), (4, 4), (4, 6), (4, 16), (5, 3)]
)
def test_schedule_is_complete_ordered_matched_and_bounded(name, p, m):
    schedule = MP.SCHEDULES[name](p, m)
    assert len(schedule) == p
    for s, actions in enumerate(schedule):
        f = [a.mb for a in actions if a.op == "F"]
        b = [a.mb for a in actions if a.op == "B"]
        assert sorted(f) == list(range(m)) and sorted(b) == list(range(m))
        for i in range(m):  # each micro-batch's forward before its backward
            assert actions.index(MP.Action("F", i)) < actions.index(MP.Action("B", i))
        # Every activation sent forward has a receive on the next stage, in the same order; same backwards.
        if s < p - 1:
            assert [a.mb for a in actions if a.op == "SEND_F"] == [
                a.mb for a in schedule[s + 1] if a.op == "RECV_F"
            ]
            assert [a.mb for a in actions if a.op == "RECV_B"] == [
                a.mb for a in schedule[s + 1] if a.op == "SEND_B"
            ]
        else:
            assert not [a for a in actions if a.op in ("SEND_F", "RECV_B")]
        if s == 0:
            assert not [a for a in actions if a.op in ("RECV_F", "SEND_B")]
    result = MP.simulate(
        schedule
    )  # raises on deadlock, mismatched messages, or compute before its input
    bound = m if name == "afab" else min(p, m)
    assert max(result["peak_in_flight"]) == bound
    if name == "1f1b":
        assert result["peak_in_flight"] == [min(p - s, m) for s in range(p)]
    # The idle share equals (p - 1) / (m + p - 1) whatever the forward/backward cost ratio.
    for t_f, t_b in [(1, 1), (1, 2), (1, 3)]:
        assert MP.simulate(schedule, t_f, t_b)["bubble"] == pytest.approx(MP.bubble_fraction(p, m))


def test_bubble_of_the_lecture():
    assert MP.bubble_fraction(4, 16) == pytest.approx(3 / 19)
    assert round(MP.bubble_fraction(4, 16), 2) == 0.16


def test_simulator_catches_broken_schedules():
    good = MP.one_f_one_b_schedule(2, 2)
    swapped = [good[0], [a if a.op != "RECV_F" else MP.Action("RECV_F", 1 - a.mb) for a in good[1]]]
    with pytest.raises(P.ParallelError, match="meets micro-batch"):
        MP.simulate(swapped)
    early_send = [
        [MP.Action("F", 0), MP.Action("SEND_F", 0), MP.Action("RECV_B", 0), MP.Action("B", 0)],
        [MP.Action("SEND_B", 0), MP.Action("RECV_F", 0), MP.Action("F", 0), MP.Action("B", 0)],
    ]
    with pytest.raises(P.ParallelError, match="before computing what it sends"):
        MP.simulate(early_send)
    # Stage 0 waits for a gradient before sending the activation that stage 1 needs to produce it.
    deadlock = [
        [MP.Action("RECV_B", 0), MP.Action("F", 0), MP.Action("SEND_F", 0), MP.Action("B", 0)],
        [MP.Action("RECV_F", 0), MP.Action("F", 0), MP.Action("B", 0), MP.Action("SEND_B", 0)],
    ]
    with pytest.raises(P.ParallelError, match="deadlock"):
        MP.simulate(deadlock)


def test_refused_combinations_say_why():
    wiring.check_combination(1, 2, 2)
    wiring.check_combination(2, 2, 1)
    with pytest.raises(P.ParallelError, match="use ZeRO-1 with pp"):
        wiring.check_combination(2, 1, 2)
    with pytest.raises(P.ParallelError, match="use ZeRO-1 or 2 with tp"):
        wiring.check_combination(3, 2, 1)


def test_layer_ranges():
    assert MP.layer_ranges(4, 2) == [(0, 2), (2, 4)]
    assert MP.layer_ranges(5, 3) == [(0, 2), (2, 4), (4, 5)]
    with pytest.raises(P.ParallelError, match="2 layers cannot fill 4 pipeline stages"):
        MP.layer_ranges(2, 4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_vocab_parallel_loss_makes_one_fp32_copy_and_no_host_read(dtype, monkeypatch):
    """Catches: more than one fp32 (N, V/t) tensor in TP's cross-entropy (each shifted, exp'd or normalised copy
    of the logits costs as much as the copy itself), and the boolean-mask index in its backward (a nonzero: the
    host waits for the GPU). One rank's slice here (Comm.single: the all-reduces are the identity) with 3 padded
    vocabulary rows; the reference is F.cross_entropy of the fp32 logits, loss and gradient."""
    from test_model import NewTensors
    from test_train import HostReads

    gen = torch.Generator().manual_seed(0)
    logits = (4 * torch.randn(12, 10, generator=gen)).to(dtype).requires_grad_()
    targets = torch.randint(0, 7, (12,), generator=gen)
    targets[3] = -1  # ignored
    with NewTensors(12 * 10) as made, HostReads() as reads:
        loss = MP.vocab_parallel_cross_entropy(logits, targets, P.Comm.single(), 0, 7)
        (grad,) = torch.autograd.grad(loss, logits)
    assert [kind for _, kind in made.made].count(torch.float32) == 1 and reads.reads == [], (
        made.made,
        reads.reads,
    )
    reference = torch.nn.functional.cross_entropy(logits[:, :7].float(), targets, ignore_index=-1)
    (want,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(loss, reference)
    torch.testing.assert_close(grad, want)
    assert grad.dtype == dtype and not grad[:, 7:].any()


def test_tensor_parallel_refuses_sizes_that_do_not_divide():
    comm = P.Comm(None, [0, 1, 2], 0)  # only sizes are read before any communication
    with pytest.raises(P.ParallelError, match="n_head = 4 is not divisible by tp 3"):
        MP.apply_tensor_parallel(make_model(), comm)
    gqa = GPTConfig(
        vocab_size=62, block_size=16, n_layer=1, n_head=4, n_kv_head=1, n_embd=32, ffn_hidden=64
    )
    with pytest.raises(P.ParallelError, match="n_kv_head = 1 is not divisible by tp 2"):
        MP.apply_tensor_parallel(make_model(gqa), P.Comm(None, [0, 1], 0))
    moe = dataclasses.replace(CFG, n_expert=2)
    with pytest.raises(P.ParallelError, match="this model uses MoE"):
        MP.apply_tensor_parallel(make_model(moe), P.Comm(None, [0, 1], 0))
    two_stages = P.Mesh(
        2, 0, P.Comm.single(), P.Comm.single(), P.Comm(None, [0, 1], 0), P.Comm.single()
    )
    model = make_model(moe)
    with pytest.raises(P.ParallelError, match="use pp 1 with MoE"):
        wiring.parallelize(model, torch.optim.AdamW(model.parameters()), two_stages)


# ------------------------------------------------------------------------------------------------------------------
# Tensor and pipeline parallel (and their combinations): equal to one process after 5 clipped AdamW steps
# ------------------------------------------------------------------------------------------------------------------

CFG4 = GPTConfig(
    vocab_size=62,
    block_size=16,
    n_layer=4,
    n_head=4,
    n_kv_head=2,
    n_embd=32,
    ffn_hidden=64,
    tie_embeddings=False,
)
BATCH12 = 12  # divisible by 1, 2, 3, 4, 6 micro-batches and 2 dp ranks


def _train_split(mesh, cfg, schedule, micro_batches, data, zero_stage=0, sgd=False):
    """Train a model split over the mesh (tp, then pp, then DP or ZeRO over dp) with clipped AdamW, or with
    SGD_STEPS steps of plain SGD and no clipping (sgd=True); return its full state, losses and pre-clip norms."""
    model = make_model(cfg)
    split = MP.TensorParallel(model, mesh.tp)  # with tp = 1 nothing is split
    pipe = MP.PipelineParallel(model, mesh, schedule) if mesh.pp.size > 1 else None
    optimizer_cls, lr, clip = (
        (torch.optim.SGD, SGD_LR, float("inf")) if sgd else (torch.optim.AdamW, LR, CLIP)
    )
    if zero_stage:
        zero = P.Zero(
            model, mesh.dp, zero_stage, optimizer_cls, param_groups=param_groups(model), lr=lr
        )
        sync = opt = zero
    else:
        sync = P.DataParallel(model, mesh.dp) if mesh.dp.size > 1 else None
        opt = optimizer_cls(param_groups(model), lr=lr)
    losses, norms = [], []
    for x, y in data[:SGD_STEPS] if sgd else data:
        xs, ys = x.chunk(mesh.dp.size)[mesh.dp.rank], y.chunk(mesh.dp.size)[mesh.dp.rank]
        if pipe is not None:
            losses.append(pipe.step(xs, ys, micro_batches, sync))
        else:
            loss = split(xs, ys)[1]
            loss.backward()
            if sync is not None:
                sync.finish_gradient_sync()
            losses.append(loss.detach())
        if zero_stage:
            norms.append(zero.clip_grad_norm_(clip, mesh))
        else:
            norms.append(P.clip_grad_norm_(model.parameters(), clip, mesh))
        opt.step()
        opt.zero_grad()
    with zero.gathered() if zero_stage else contextlib.nullcontext():
        full = wiring.full_model_state_dict(model, mesh)
    losses = torch.stack(losses)
    mesh.dp.all_reduce(
        losses
    )  # each dp rank saw a slice of the batch: the batch loss is their mean
    return {"state": full, "losses": losses / mesh.dp.size, "norms": torch.stack(norms)}


def _reference_losses(cfg, data):
    model = make_model(cfg)
    opt = torch.optim.AdamW(param_groups(model), lr=LR)
    losses, norms = [], []
    for x, y in data:
        loss = model(x, y)[1]
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP))
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    return state(model), torch.stack(losses), torch.stack(norms)


def _train_parallelized(mesh, zero, schedule, micro_batches, data, resume_from=None, sgd=False):
    """The train.py path: parallelize(full model, plain optimizer), then the usual loop; 5 steps, or 1 step
    after loading a single-process checkpoint (model + optimizer in torch's own format); sgd=True: SGD_STEPS
    steps of plain SGD without clipping."""
    model = make_model()
    opt = (
        torch.optim.SGD(param_groups(model), lr=SGD_LR)
        if sgd
        else torch.optim.AdamW(param_groups(model), lr=LR)
    )
    wrapped, wopt = wiring.parallelize(model, opt, mesh, zero=zero, schedule=schedule)
    if sgd:
        data = data[:SGD_STEPS]
    norms = []
    if resume_from is not None:
        wrapped.load_full_state_dict(resume_from["model"])
        wopt.load_state_dict(resume_from["optimizer"])
    for x, y in data:
        xs, ys = x.chunk(mesh.dp.size)[mesh.dp.rank], y.chunk(mesh.dp.size)[mesh.dp.rank]
        if wrapped.pipe is not None:
            wrapped.pipeline_step(list(zip(xs.chunk(2), ys.chunk(2))), micro_batches)
        else:
            with wrapped.no_sync():
                (wrapped(xs[:2], ys[:2])[1] * 2 / len(xs)).backward()
            (wrapped(xs[2:], ys[2:])[1] * (len(xs) - 2) / len(xs)).backward()
            wrapped.finish_gradient_sync()
        norms.append(wrapped.clip_grad_norm_(0 if sgd else CLIP))  # 0: only measure
        wopt.step()
        wopt.zero_grad()
    with torch.no_grad():
        x, y = data[0]
        eval_loss = wrapped(x, y)[1]
    return {
        "model": wrapped.full_state_dict(),
        "optimizer": wopt.state_dict(),
        "eval_loss": eval_loss,
        "describe": wrapped.describe(micro_batches),
        "norms": norms,
    }


def _world2_split_worker(rank, world, resume_from):
    data = batches(batch=BATCH12)
    out = {}
    for name, sizes, zero, schedule in [
        ("zero3", dict(dp=2), 3, "1f1b"),
        ("tp2_zero2", dict(tp=2), 2, "1f1b"),
        ("pp2_afab", dict(pp=2), 0, "afab"),
        ("dp2", dict(dp=2), 0, "1f1b"),
    ]:
        mesh = P.Mesh.build(**sizes)
        out["parallelized_" + name] = _train_parallelized(mesh, zero, schedule, 3, data)
        out["resumed_" + name] = _train_parallelized(mesh, zero, schedule, 3, data[:1], resume_from)
        out["sgd_parallelized_" + name] = _train_parallelized(
            mesh, zero, schedule, 3, data, sgd=True
        )
    tp = P.Mesh.build(tp=2)
    pp = P.Mesh.build(pp=2)
    for name, mesh, cfg, schedule, m in [
        ("tp2", tp, CFG, "1f1b", 1),
        ("pp2_afab", pp, CFG, "afab", 4),
        ("pp2_1f1b", pp, CFG, "1f1b", 3),
        ("pp2_1f1b_untied", pp, CFG4, "1f1b", 6),
        ("tp2_softcap", tp, CFG_SOFTCAP, "1f1b", 1),
        ("pp2_stable", pp, CFG_STABLE, "1f1b", 3),
    ]:
        out[name] = _train_split(mesh, cfg, schedule, m, data)
        out["sgd_" + name] = _train_split(mesh, cfg, schedule, m, data, sgd=True)
    # Activation checkpointing recomputes each block in backward: the same numbers under TP, PP and ZeRO-3.
    out["tp2_checkpointing"] = _train_split(tp, CFG_CKPT, "1f1b", 1, data)
    out["pp2_checkpointing"] = _train_split(pp, CFG_CKPT, "1f1b", 3, data)
    out["zero3_checkpointing"] = _train_split(
        P.Mesh.build(dp=2), CFG_CKPT, "1f1b", 1, data, zero_stage=3
    )
    return out


@pytest.fixture(scope="module")
def world2_split():
    model, opt = _reference_run(batches(batch=BATCH12))
    checkpoint = {"model": state(model), "optimizer": copy.deepcopy(opt.state_dict())}
    return launcher.launch(_world2_split_worker, 2, checkpoint, timeout_s=180)


def _reference_run(data):
    return reference(CFG, len(data), data) if data else reference(CFG, 0, [])


@pytest.mark.parametrize("mode", ["zero3", "tp2_zero2", "pp2_afab", "dp2"])
def test_parallelize_checkpoints_are_single_process_checkpoints(world2_split, mode):
    """What train.py uses: after 5 steps the gathered model AND optimizer state_dict() equal the single-process
    ones (torch's own format); a single-process checkpoint loaded into the split run continues identically."""
    data = batches(batch=BATCH12)
    ref_model, ref_opt = _reference_run(data)
    with torch.no_grad():
        ref_eval = ref_model(*data[0])[1]
    ref_opt_state = copy.deepcopy(ref_opt.state_dict())  # state_dict() holds live tensors
    next_model, next_opt = _reference_run([])
    next_model.load_state_dict(state(ref_model))
    next_opt.load_state_dict(copy.deepcopy(ref_opt_state))
    x, y = data[0]
    next_model(x, y)[1].backward()
    torch.nn.utils.clip_grad_norm_(next_model.parameters(), CLIP)
    next_opt.step()
    for rank, res in enumerate(world2_split):
        got = res["parallelized_" + mode]
        assert_same(got["model"], state(ref_model), f"{mode} rank {rank}")
        assert_norms(got["norms"], reference_norms(CFG, len(data), data), f"{mode} rank {rank}")
        assert_same(
            res["sgd_parallelized_" + mode]["model"],
            reference_sgd(CFG, data),
            f"{mode} rank {rank}, SGD",
        )
        torch.testing.assert_close(got["eval_loss"], ref_eval, **TOL)
        assert got["optimizer"]["state"].keys() == ref_opt_state["state"].keys()
        for i, s in ref_opt_state["state"].items():
            for key in s:
                torch.testing.assert_close(got["optimizer"]["state"][i][key], s[key], **TOL)
        assert [g["params"] for g in got["optimizer"]["param_groups"]] == [
            g["params"] for g in ref_opt_state["param_groups"]
        ]
        assert_same(
            res["resumed_" + mode]["model"], state(next_model), f"{mode} resumed on rank {rank}"
        )
        sizes = {
            "zero3": "dp 2 x tp 1 x pp 1 x cp 1 (ep 1 inside dp), ZeRO-3",
            "tp2_zero2": "dp 1 x tp 2 x pp 1 x cp 1 (ep 1 inside dp), ZeRO-2",
            "pp2_afab": "dp 1 x tp 1 x pp 2 x cp 1 (ep 1 inside dp), ZeRO-0, afab",
            "dp2": "dp 2 x tp 1 x pp 1 x cp 1 (ep 1 inside dp), ZeRO-0",
        }[mode]
        assert sizes in got["describe"]
        if mode == "pp2_afab":
            assert "bubble (p-1)/(m+p-1) = 25.0% with 3 micro-batches" in got["describe"]


CFG_CKPT = dataclasses.replace(CFG, activation_checkpointing=True)
# Issue 48's stability options a split model keeps: the soft-cap is elementwise on the logits (TP's
# vocabulary slices too), QK-norm lives inside a pipeline stage's blocks. machinery/run.py refuses
# z-loss with tp/pp and QK-norm with tp.
CFG_SOFTCAP = dataclasses.replace(CFG, logit_softcap=5.0)
CFG_STABLE = dataclasses.replace(CFG, qk_norm=True, logit_softcap=5.0)


@pytest.mark.parametrize(
    "mode,cfg",
    [
        ("tp2", CFG),
        ("pp2_afab", CFG),
        ("pp2_1f1b", CFG),
        ("pp2_1f1b_untied", CFG4),
        ("tp2_checkpointing", CFG),
        ("pp2_checkpointing", CFG),
        ("zero3_checkpointing", CFG),
        ("tp2_softcap", CFG_SOFTCAP),
        ("pp2_stable", CFG_STABLE),
    ],
)
def test_tensor_and_pipeline_parallel_equal_single_process(world2_split, mode, cfg):
    data = batches(batch=BATCH12)
    want_state, want_losses, want_norms = _reference_losses(cfg, data)
    for rank, res in enumerate(world2_split):
        assert_same(res[mode]["state"], want_state, f"{mode} rank {rank}")
        torch.testing.assert_close(res[mode]["losses"], want_losses, **TOL)
        assert_norms(res[mode]["norms"], want_norms, f"{mode} rank {rank}")
        if "sgd_" + mode in res:
            assert_same(
                res["sgd_" + mode]["state"],
                reference_sgd(cfg, data),
                f"{mode} rank {rank}, plain SGD",
            )


def _world4_worker(rank, world):
    data = batches(batch=BATCH12)
    out = {}
    for name, sizes, cfg, schedule, m, zero in [
        ("tp2_dp2", dict(tp=2, dp=2), CFG, "1f1b", 1, 0),
        ("pp2_dp2", dict(pp=2, dp=2), CFG, "1f1b", 2, 0),
        ("pp2_dp2_zero1", dict(pp=2, dp=2), CFG, "afab", 3, 1),
        ("tp2_pp2", dict(tp=2, pp=2), CFG, "1f1b", 3, 0),
        ("tp2_dp2_zero2", dict(tp=2, dp=2), CFG, "1f1b", 1, 2),
        ("pp4_m1", dict(pp=4), CFG4, "1f1b", 1, 0),
        ("pp4_m4", dict(pp=4), CFG4, "1f1b", 4, 0),
        ("pp4_m6", dict(pp=4), CFG4, "1f1b", 6, 0),
        ("zero3_dp4", dict(dp=4), CFG_ODD, "1f1b", 1, 3),
    ]:
        mesh = P.Mesh.build(**sizes)
        out[name] = _train_split(mesh, cfg, schedule, m, data, zero)
        out["sgd_" + name] = _train_split(mesh, cfg, schedule, m, data, zero, sgd=True)
    return out


# Sizes that do not divide by 4 ranks (embedding 63 x 34 = 2,142 and the final norm's 34): ZeRO-3 pads.
CFG_ODD = GPTConfig(
    vocab_size=63, block_size=16, n_layer=2, n_head=1, n_kv_head=1, n_embd=34, ffn_hidden=50
)


def test_odd_config_really_needs_padding_on_4_ranks():
    model = make_model(CFG_ODD)
    assert (model.tok_emb.weight.numel() % 4, model.norm.weight.numel() % 4) == (2, 2)


@pytest.mark.slow
def test_world4_combinations_equal_single_process():
    """TP2xDP2, PP2xDP2 (+ZeRO-1), TP2xPP2, TP2xDP2 with ZeRO-2, PP4 1F1B with M in {1, 4, 6}, ZeRO-3 on 4
    ranks (unit sizes that do not divide by 4: padding)."""
    results = launcher.launch(_world4_worker, 4, timeout_s=300)
    data = batches(batch=BATCH12)
    cfgs = {"CFG": CFG, "CFG4": CFG4, "CFG_ODD": CFG_ODD}
    refs = {
        name: (*_reference_losses(cfg, data), reference_sgd(cfg, data))
        for name, cfg in cfgs.items()
    }
    for name in [n for n in results[0] if not n.startswith("sgd_")]:
        want_state, want_losses, want_norms, want_sgd = refs[
            "CFG4" if name.startswith("pp4") else "CFG_ODD" if "zero3" in name else "CFG"
        ]
        for rank, res in enumerate(results):
            assert_same(res[name]["state"], want_state, f"{name} rank {rank}")
            torch.testing.assert_close(res[name]["losses"], want_losses, **TOL)
            assert_norms(res[name]["norms"], want_norms, f"{name} rank {rank}")
            assert_same(res["sgd_" + name]["state"], want_sgd, f"{name} rank {rank}, plain SGD")


# ------------------------------------------------------------------------------------------------------------------
# Docstring examples and the command line
# ------------------------------------------------------------------------------------------------------------------


def test_docstring_examples():
    import doctest

    assert doctest.testmod(P).failed == 0


def test_cli_memory_and_schedule(capsys):
    assert command.main(["memory", "--params", "7e9", "--world", "8"]) == 0
    out = capsys.readouterr().out
    for figure in ("112.00 GB", "38.50 GB", "26.25 GB", "14.00 GB"):
        assert figure in out
    assert command.main(["schedule", "--p", "4", "--m", "16"]) == 0
    assert "simulated 0.158, formula (p-1)/(m+p-1) = 0.158" in capsys.readouterr().out
    assert command.main(["mesh", "--dp", "2", "--tp", "2", "--pp", "2"]) == 0
    assert "dp groups: [[0, 2], [1, 3], [4, 6], [5, 7]]" in capsys.readouterr().out
    for bad in (["schedule", "--p", "0"], ["memory", "--params", "-5"], ["schedule", "--p", "abc"]):
        with pytest.raises(SystemExit) as e:
            command.main(bad)
        assert e.value.code == 2
    capsys.readouterr()
    assert command.main(["demo", "--world", "3"]) == 2  # refused before any process starts
    assert "splits over 1 or 2 ranks, not --world 3" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------------------
# train.py wiring: --zero / --tp / --pp on 2 ranks give the single-process loss curve; checkpoints change layout
# ------------------------------------------------------------------------------------------------------------------

TRAIN_ARGS = [
    "--model",
    "tiny",
    "--model-args",
    "n_layer=2,n_head=2,n_kv_head=2,n_embd=32,block_size=32",
    "--batch-size",
    "4",
    "--block-size",
    "32",
    "--lr",
    "3e-3",
    "--warmup-steps",
    "2",
    "--max-steps",
    "6",
    "--eval-interval",
    "3",
    "--eval-batches",
    "2",
    "--ckpt-interval",
    "3",
    "--log-interval",
    "1000",
    "--num-samples",
    "1",
    "--sample-tokens",
    "4",
    "--peak-flops",
    "1e12",
]


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    import random

    import data
    from machinery import dataset

    rng = random.Random(0)
    words = [
        "the parser",
        "a list",
        "returns",
        "reads",
        "the keys",
        "every item",
        "a string",
        "sorts",
        "joins",
    ]
    docs = [
        " ".join(rng.choice(words) for _ in range(rng.randint(40, 80))) + "." for _ in range(200)
    ]
    root = tmp_path_factory.mktemp("parallel-train-data")
    (root / "corpus.txt").write_text("\n\n".join(docs))
    return dataset.prepare(
        [str(root / "corpus.txt")],
        out_dir=root / "prepared",
        vocab_size=300,
        seed=0,
        clean_settings=data.CleanSettings(filters="none", near_dup_threshold=0, mask_pii=False),
    )


def _train_rank(rank, world, argv):
    from machinery import run as train_run
    from machinery.commands import train as train_command

    train_run.train(train_command.parse_config(argv), log=lambda *a, **k: None)


def _curve(out_dir):
    """step -> (training loss, pre-clip grad norm), and step -> validation loss."""
    from machinery import run as train_run

    records = train_run.read_metrics(out_dir / "metrics.jsonl")
    return (
        {
            r["step"]: (r["loss"], r["grad_norm"])
            for r in records
            if "loss" in r and "event" not in r
        },
        {r["step"]: r["val_loss"] for r in records if "val_loss" in r},
    )


@pytest.mark.slow
def test_train_py_layouts_give_the_single_process_curve(tiny_dataset, tmp_path):
    """`train.py --zero 3`, `--tp 2`, `--pp 2 --micro-batches 2` on 2 ranks and DP2 x TP2 with ZeRO-1 on 4 ranks =
    `train.py` on 1 process with the same global batch. Checkpoints change layout: the 2-rank ZeRO-3 and the 4-rank
    run resume on 1 process; a 1-process checkpoint resumes on 2 TP ranks and on TP2 x PP2; all continue the curve."""
    import shutil

    import train
    from machinery import run as train_run
    from machinery.commands import train as train_command

    base = ["--data", str(tiny_dataset), *TRAIN_ARGS]
    train_run.train(
        train_command.parse_config([*base, "--out-dir", str(tmp_path / "one")]),
        log=lambda *a, **k: None,
    )
    want_loss, want_val = _curve(tmp_path / "one")
    assert sorted(want_loss) == list(range(6))
    runs = {
        "zero3": (2, ["--zero", "3", "--batch-size", "2"]),
        "tp2": (2, ["--tp", "2"]),
        "pp2": (2, ["--pp", "2", "--micro-batches", "2", "--pp-schedule", "1f1b"]),
        "dp2_tp2_zero1": (4, ["--tp", "2", "--zero", "1", "--batch-size", "2"]),
    }
    for name, (world, flags) in runs.items():
        launcher.launch(
            _train_rank, world, [*base, *flags, "--out-dir", str(tmp_path / name)], timeout_s=240
        )
        loss, val = _curve(tmp_path / name)
        for s in range(6):  # the loss, and the gradient norm that sees a wrong gradient scale
            assert loss[s] == pytest.approx(want_loss[s], rel=1e-4), (name, s)
        assert val == pytest.approx(want_val, rel=1e-4), name
    # Resume at step 3 in another layout, finish, same curve.
    for source, target, world, flags in [
        ("zero3", "zero3_on_1", 1, []),
        ("dp2_tp2_zero1", "dp2_tp2_on_1", 1, []),
        ("one", "one_on_tp2", 2, ["--tp", "2"]),
        ("one", "one_on_tp2_pp2", 4, ["--tp", "2", "--pp", "2"]),
    ]:
        (tmp_path / target).mkdir()
        shutil.copy(train.checkpoint_path(tmp_path / source, 3), tmp_path / target)
        argv = [*base, *flags, "--out-dir", str(tmp_path / target), "--resume"]
        if world > 1:
            launcher.launch(_train_rank, world, argv, timeout_s=240)
        else:
            train_run.train(train_command.parse_config(argv), log=lambda *a, **k: None)
        loss, _ = _curve(tmp_path / target)
        for s in range(3, 6):
            assert loss[s] == pytest.approx(want_loss[s], rel=1e-4), (target, s)


def _layout_gives_the_single_process_curve_and_resumes_on_one(base, world, flags, tmp_path):
    """`train.py` with `base` on one process, then on `world` ranks with `flags` (out/"layout"): the
    same losses, pre-clip gradient norms and validation loss; the layout's step-3 checkpoint resumes
    on one process and continues the curve."""
    import shutil

    import train
    from machinery import run as train_run
    from machinery.commands import train as train_command

    train_run.train(
        train_command.parse_config([*base, "--out-dir", str(tmp_path / "one")]),
        log=lambda *a, **k: None,
    )
    want, want_val = _curve(tmp_path / "one")
    layout = [*base, *flags, "--out-dir", str(tmp_path / "layout")]
    launcher.launch(_train_rank, world, layout, timeout_s=240)
    got, val = _curve(tmp_path / "layout")
    for s in range(6):
        assert got[s] == pytest.approx(want[s], rel=1e-4), s
    assert val == pytest.approx(want_val, rel=1e-4)
    (tmp_path / "on_1").mkdir()
    shutil.copy(train.checkpoint_path(tmp_path / "layout", 3), tmp_path / "on_1")
    argv = [*base, "--out-dir", str(tmp_path / "on_1"), "--resume"]
    train_run.train(train_command.parse_config(argv), log=lambda *a, **k: None)
    got, _ = _curve(tmp_path / "on_1")
    for s in range(3, 6):
        assert got[s] == pytest.approx(want[s], rel=1e-4), s


@pytest.mark.slow
def test_train_py_width_transfer_on_3_pipeline_stages_gives_the_single_process_curve(
    tiny_dataset, tmp_path
):
    """`--lr-base-width 8 --pp 3`: the middle stage holds no embedding, so its optimizer lacks that
    group; the losses are still one process's, the checkpoint keeps the single-process groups and
    their multipliers (hidden x 8/32, embedding and gains x 1), and it resumes on one process."""
    import train

    shape = "n_layer=3,n_head=2,n_kv_head=2,n_embd=32,block_size=32"
    base = ["--data", str(tiny_dataset), *TRAIN_ARGS, "--model-args", shape, "--lr-base-width", "8"]
    pp3 = ["--pp", "3", "--micro-batches", "2"]
    _layout_gives_the_single_process_curve_and_resumes_on_one(base, 3, pp3, tmp_path)
    saved = train.load_checkpoint(train.checkpoint_path(tmp_path / "layout", 3))["optimizer"]
    assert [g["lr_mult"] for g in saved["param_groups"]] == [0.25, 1.0, 1.0]


@pytest.mark.slow
def test_train_py_muon_under_zero_gives_the_single_process_curve_and_resumes_on_one(
    tiny_dataset, tmp_path
):
    """`train.py --optimizer muon --zero 1` on 2 ranks = one process (loss and pre-clip gradient
    norm per step); its step-3 checkpoint, momentum gathered by name, resumes on one process."""
    base = ["--data", str(tiny_dataset), *TRAIN_ARGS, "--optimizer", "muon"]
    zero = ["--zero", "1", "--batch-size", "2"]
    _layout_gives_the_single_process_curve_and_resumes_on_one(base, 2, zero, tmp_path)


def _train_rank_log(rank, world, argv):
    from machinery import run as train_run
    from machinery.commands import train as train_command

    lines = []
    train_run.train(train_command.parse_config(argv), log=lines.append)
    return "\n".join(map(str, lines))


def test_train_py_zero3_in_bf16_gathers_bf16_and_follows_the_single_process_curve(
    tiny_dataset, tmp_path
):
    """`train.py --zero 3 --dtype bf16` on 2 ranks: FSDP-style mixed precision, the 1-process bf16 curve within
    bf16's tolerance, fp32 weights in the checkpoint; --zero-reduce-dtype bf16 too."""
    import train
    from machinery import run as train_run
    from machinery.commands import train as train_command

    base = ["--data", str(tiny_dataset), *TRAIN_ARGS, "--dtype", "bf16"]
    train_run.train(
        train_command.parse_config([*base, "--out-dir", str(tmp_path / "one")]),
        log=lambda *a, **k: None,
    )
    want, _ = _curve(tmp_path / "one")
    for reduce in ("fp32", "bf16"):
        out = tmp_path / f"zero3_{reduce}"
        logs = launcher.launch(
            _train_rank_log,
            2,
            [
                *base,
                "--zero",
                "3",
                "--batch-size",
                "2",
                "--zero-reduce-dtype",
                reduce,
                "--out-dir",
                str(out),
            ],
            timeout_s=240,
        )
        assert (
            f"weights gathered in 2 bytes, gradients reduced in {4 if reduce == 'fp32' else 2}"
            in logs[0]
        )
        loss, _ = _curve(out)
        for s in range(6):  # the loss and the pre-clip grad norm, within bf16's tolerance
            assert loss[s] == pytest.approx(want[s], rel=1e-2), (reduce, s)
        ckpt = train.load_checkpoint(out)
        assert {v.dtype for v in ckpt["model"].values()} == {torch.float32}


def _train_expect_error(rank, world, argv):
    import train
    from machinery import run as train_run
    from machinery.commands import train as train_command

    try:
        train_run.train(train_command.parse_config(argv), log=lambda *a, **k: None)
    except train.TrainError as e:
        return train_command.flag_names(str(e))  # as the command line shows it
    return "no error"


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--tp", "3"], "tp*pp = 3*1 does not divide the world size 2"),
        (["--zero", "2", "--pp", "2"], "use ZeRO-1 with pp"),
        (["--zero", "3", "--tp", "2"], "use ZeRO-1 or 2 with tp"),
        (
            ["--pp", "2", "--micro-batches", "3"],
            "--micro-batches 3 does not divide the 4 sequences",
        ),
        (["--tp", "2", "--dtype", "fp16"], "--dtype fp16 with --zero/--tp/--pp"),
    ],
)
def test_train_py_refuses_bad_layouts_with_one_line(tiny_dataset, tmp_path, flags, message):
    argv = ["--data", str(tiny_dataset), *TRAIN_ARGS, *flags, "--out-dir", str(tmp_path / "run")]
    for error in launcher.launch(_train_expect_error, 2, argv, timeout_s=120):
        assert message in error and "\n" not in error


# ------------------------------------------------------------------------------------------------------------------
# Placement on a device that is not the CPU (the meta device stands in for CUDA: a CPU tensor meeting a meta one
# raises, and so does copying a value out; see tests/test_model.py for why not FakeTensorMode here)
# ------------------------------------------------------------------------------------------------------------------


def _meta_gpt(**overrides) -> GPT:
    cfg = GPTConfig(
        **{
            **dict(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32),
            **overrides,
        }
    )
    with torch.device("meta"):
        return GPT(cfg)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_optimizer_state_loads_onto_the_shards_device_step_included(stage):
    """A checkpoint loads on the CPU (map_location="cpu"); fused AdamW on CUDA needs every state tensor, the 0-dim
    `step` included, on its parameter's device. Catches: `step` cloned where it was loaded (the CPU)."""
    model = _meta_gpt()
    zero = P.Zero(model, P.Comm.single(), stage, torch.optim.AdamW, lr=1e-3)
    names = [n for n, _ in model.named_parameters()]
    saved = {
        "state": {
            n: {
                "step": torch.tensor(7.0),
                "exp_avg": torch.zeros(p.shape),
                "exp_avg_sq": torch.zeros(p.shape),
            }
            for n, p in model.named_parameters()
        },
        "param_groups": [{"lr": 1e-3, "param_names": names}],
    }
    wiring.load_zero_optimizer_state_dict(zero, saved)
    placed = {
        (k, v.device.type) for u in zero.units for k, v in zero.optimizer.state[u.shard].items()
    }
    assert placed == {("step", "meta"), ("exp_avg", "meta"), ("exp_avg_sq", "meta")}


def test_full_model_for_sampling_is_built_on_the_device_of_the_split_model():
    """Catches: full_model() building a CPU model from CPU state, which the sampler then feeds CUDA ids and a CUDA
    generator (every --zero/--tp/--pp run crashed at its end)."""
    model = _meta_gpt()
    wrapped, _ = wiring.parallelize(
        model, torch.optim.AdamW(model.parameters()), P.Mesh.single(), zero=1
    )
    full = wrapped.full_model()
    assert {p.device.type for p in full.parameters()} == {"meta"}
    ids = torch.zeros(1, 2, dtype=torch.long, device="meta")
    assert full.generate(ids, 3).device.type == "meta"


def test_tensor_parallel_untied_head_is_created_on_the_models_device():
    """Catches: the padded LM head of an untied model made with nn.Linear(...) on the CPU."""
    model = _meta_gpt(tie_embeddings=False)
    MP.apply_tensor_parallel(
        model, P.Comm(None, [0, 1], 0)
    )  # slicing only: no collective runs here
    assert {p.device.type for p in model.parameters()} == {"meta"}


# ---- the GPU step's fused matmuls and bf16 residual stream, split over ranks -----------------------------------


def _one_sgd_step(split, pipe, x, y):
    """One plain SGD step of a (maybe split) model under bf16 autocast; returns its loss."""
    model = split.module
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    with torch.autocast("cpu", torch.bfloat16):
        if pipe is not None:
            loss = pipe.step(x, y, 3)
        else:
            loss = split(x, y)[1]
            loss.backward()
    opt.step()
    return loss.detach().float()


def _fused_split_worker(rank, world):
    """tp 2 and pp 2 under bf16 autocast, each with the fused q/k/v and w1/w3 matmuls and with one matmul per
    layer (model.fused_linear replaced by the reference): the loss and the full state after one SGD step."""
    import model as model_module
    from test_model import separate_linears

    x, y = batches(batch=BATCH12)[0]
    out, fused = {}, model_module.fused_linear
    for name, sizes in (("tp2", dict(tp=2)), ("pp2", dict(pp=2))):
        for how in ("fused", "separate"):
            model_module.fused_linear = fused if how == "fused" else separate_linears
            mesh = P.Mesh.build(**sizes)
            model = make_model(CFG)
            split = MP.TensorParallel(model, mesh.tp)
            pipe = MP.PipelineParallel(model, mesh, "1f1b") if mesh.pp.size > 1 else None
            loss = _one_sgd_step(split, pipe, x, y)
            out[name, how] = {"loss": loss, "state": wiring.full_model_state_dict(model, mesh)}
    model_module.fused_linear = fused
    return out


def test_tp_and_pp_under_bf16_autocast_fused_equal_separate_and_one_process():
    """The fused projections under tensor parallel (each rank's ColumnParallelLinear shards: the local q, k, v
    sizes) and the bf16 residual stream between pipeline stages (sent and received in bf16): one SGD step under
    bf16 autocast, fused = one matmul per layer on the same split to the bit's neighbourhood, and both = one
    process within bf16's tolerance (the update, weight after minus before, to 2% of its norm)."""
    x, y = batches(batch=BATCH12)[0]
    reference = make_model(CFG)
    before = state(reference)
    split = MP.TensorParallel(reference, P.Comm.single())
    want_loss = _one_sgd_step(split, None, x, y)
    want = {k: v - before[k] for k, v in state(reference).items()}
    for rank, res in enumerate(launcher.launch(_fused_split_worker, 2, timeout_s=180)):
        for name in ("tp2", "pp2"):
            fused, separate = res[name, "fused"], res[name, "separate"]
            torch.testing.assert_close(fused["loss"], separate["loss"], rtol=1e-3, atol=1e-3)
            torch.testing.assert_close(fused["loss"], want_loss, rtol=2e-2, atol=2e-2)
            for key in want:
                got = fused["state"][key] - before[key]
                also = separate["state"][key] - before[key]
                scale = want[key].norm()
                what = f"{name} rank {rank} {key}"
                assert (got - also).norm() <= 1e-2 * scale + 1e-6, what
                assert (got - want[key]).norm() <= 2e-2 * scale + 1e-6, what
