"""Expert parallel (--ep) and context parallel (--cp) equal one process (model_parallel.py 4, 5).

One spawn per world size runs every layout of that size: a training step (loss, aux loss, gradient
norm, and the weights after a plain SGD step: AdamW's first step is about lr x sign(g), so gradients
at rounding level flip it) against the same step in this process on the same global batch, and the
bytes the all-to-all and the K/V ring sent against `all_to_all_bytes` and `ring_bytes`. The same
spawn measures what each layout is for (`_check_costs`): CP's saved activations (saved-tensor hooks)
and score elements computed at T = 1,024 against one process, EP's bytes under bf16, TP's blocks
compiled without a recompile per call, and `--ep` with `--cp` refused.
"""

import pytest
import torch

import model_parallel as MP
from machinery import launch as launcher
from machinery import parallelize as wiring
import parallel as P
from model import GPT, GPTConfig

MOE = dict(
    vocab_size=64,
    block_size=16,
    n_layer=2,
    n_head=4,
    n_kv_head=2,
    n_embd=32,
    ffn_hidden=32,
    n_expert=4,
    expert_top_k=2,
    moe_capacity_factor=0.0,
)
DENSE = dict(
    vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64
)
B, T = 8, 16


def _batch():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 64, (B, T), generator=g), torch.randint(0, 64, (B, T), generator=g)


def _step(model, wrapped, opt, x, y):
    """One step; returns (loss, aux loss, pre-clip gradient norm, full weights after the update,
    the momentum buffers (= the gradients) in the one-process optimizer's format after a round
    trip: saved (gathered), loaded (sliced back onto the shards) and saved again)."""
    _, loss = wrapped(x, y)
    aux = model.aux_loss if model.config.n_expert else torch.zeros(())
    (loss + model.config.moe_aux_coef * aux).backward()
    if hasattr(wrapped, "finish_gradient_sync"):
        wrapped.finish_gradient_sync()
        norm = wrapped.clip_grad_norm_(1e9)
    else:
        norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))
    opt.step()
    state = wrapped.full_state_dict() if hasattr(wrapped, "full_state_dict") else model.state_dict()
    opt.load_state_dict(opt.state_dict())
    momenta = {i: s["momentum_buffer"].clone() for i, s in opt.state_dict()["state"].items()}
    return (
        float(loss.detach()),
        float(aux.detach()),
        norm,
        {k: v.detach().clone() for k, v in state.items()},
        momenta,
    )


def _sgd(model):
    """SGD with momentum: its one state tensor per parameter is the gradient after one step."""
    return torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9)


def _single(cfg):
    torch.manual_seed(0)
    model = GPT(GPTConfig(**cfg))
    return _step(model, model, _sgd(model), *_batch())


def _worker(rank, world, layouts):
    out = {}
    for name, cfg, ep, cp, zero in layouts:
        torch.manual_seed(0)
        model = GPT(GPTConfig(**cfg))
        mesh = P.Mesh.build(cp=cp)
        wrapped, opt = wiring.parallelize(model, _sgd(model), mesh, ep=ep, zero=zero)
        x, y = (t.chunk(mesh.dp.size)[mesh.dp.rank] for t in _batch())
        mesh.reset_counters()
        for c in [wrapped.module.ep, wrapped.module.edp] if ep > 1 else []:
            c.reset_counters()
        loss, aux, norm, state, momenta = _step(model, wrapped, opt, x, y)
        sent = (
            wrapped.module.ep.bytes_by_op.get("all_to_all", 0)
            if ep > 1
            else mesh.cp.bytes_by_op.get("send")
        )
        out[name] = dict(
            loss=loss,
            aux=aux,
            norm=norm,
            state=state,
            momenta=momenta,
            sent=sent,
            describe=wrapped.describe(),
        )
    out["ring"] = _ring_saved_and_work(P.Mesh.build(cp=world).cp)
    out["ep_bf16_sent"] = _ep_sent_under_bf16(world)
    out["tp_graphs"] = _tp_graphs_compiled(P.Mesh.build(dp=world // 2, tp=2).tp)
    model = GPT(GPTConfig(**MOE))
    with pytest.raises(P.ParallelError) as refused:  # CP would be silently ignored
        wiring.parallelize(model, _sgd(model), P.Mesh.build(cp=2), ep=2)
    out["ep_cp_refused"] = str(refused.value)
    return out


def _tp_graphs_compiled(comm):
    """Graphs torch.compile made for TP's blocks (compiled one by one, as machinery/run.py's compile_model does)
    over 4 training steps and 2 no_grad evaluations: 2 (train, eval) when nothing inside a block
    changes between calls. A byte counter updated inside one is a value dynamo guards on: a new
    graph per call."""
    import torch._dynamo

    graphs = []

    def backend(gm, example_inputs):  # dynamo only: no code generation to wait for
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.manual_seed(0)
    tp = MP.TensorParallel(GPT(GPTConfig(**DENSE)), comm)
    for block in tp.module.blocks:
        block.forward = torch.compile(block.forward, backend=backend, dynamic=False)
    x, y = _batch()
    for _ in range(4):
        tp(x, y)[1].backward()
    with torch.no_grad():
        for _ in range(2):
            tp(x, y)
    return len(graphs)


def _ep_sent_under_bf16(world):
    """The all-to-all bytes of --ep world's forward and backward under bf16 autocast."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(**MOE))
    mesh = P.Mesh.build()
    wrapped, _ = wiring.parallelize(model, _sgd(model), mesh, ep=world)
    x, y = (t.chunk(world)[mesh.dp.rank] for t in _batch())
    wrapped.module.ep.reset_counters()
    with torch.autocast("cpu", torch.bfloat16):
        _, loss = wrapped(x, y)
    loss.backward()
    return wrapped.module.ep.bytes_by_op["all_to_all"]


# Saved activations at T = 1,024: a 1-layer, 64-wide model (weights ~0.1 MiB, activations MiBs).
LONG = dict(
    vocab_size=64, block_size=1024, n_layer=1, n_head=4, n_kv_head=2, n_embd=64, ffn_hidden=128
)


def saved_bytes(fn):
    """(bytes of the unique storages autograd saves for backward while fn runs, fn's result)."""
    storages = {}

    def pack(t):
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return sum(storages.values()), out


def _long_batch():
    g = torch.Generator().manual_seed(2)
    return (torch.randint(0, 64, (1, 1024), generator=g),) * 2


def _ring_saved_and_work(comm):
    """This cp rank's saved bytes and score elements computed (per batch row and head) for one
    forward of LONG, and its loss after a backward (the gradient of the embedding)."""
    torch.manual_seed(0)
    cp = MP.ContextParallel(GPT(GPTConfig(**LONG)), comm)
    nbytes, (_, loss) = saved_bytes(lambda: cp(*_long_batch()))
    loss.backward()  # its loss is x n: data parallel averages over dp x cp
    comm.all_reduce(cp.module.tok_emb.weight.grad)
    return dict(
        saved=nbytes,
        scores=cp.work["scores"],
        loss=float(loss),
        grad=cp.module.tok_emb.weight.grad / comm.size,
    )


def _check_costs(results):
    """Per rank: saved activations within 1/n + 10% of one process's (SDPA), the score elements
    computed the causal pairs' share (the diagonal squares' 64-query tiles add under 10%), the
    loss and gradient one process's; EP's all-to-all bytes under bf16; TP's blocks compiled once
    for training and once for evaluation; --ep with --cp refused."""
    n, T_long = len(results), LONG["block_size"]
    torch.manual_seed(0)
    model = GPT(GPTConfig(**LONG))
    single, (_, loss) = saved_bytes(lambda: model(*_long_batch()))
    loss.backward()
    loss = loss.detach()
    causal = T_long * (T_long + 1) // 2
    c = GPTConfig(**MOE)  # EP's slots travel in bf16 under autocast (model.py's stream), not fp32
    want = c.n_layer * MP.all_to_all_bytes(c.n_expert, B // n * T, c.n_embd, n, nbytes=2)
    assert [r["ep_bf16_sent"] for r in results] == [want] * n, (want, results[0]["ep_bf16_sent"])
    assert [r["tp_graphs"] for r in results] == [2] * n, [r["tp_graphs"] for r in results]
    assert all("ep 2 with cp 2:" in r["ep_cp_refused"] for r in results), results[0]
    for r in results:
        assert r["ring"]["saved"] <= (1 / n + 0.1) * single, (r["ring"]["saved"], single)
        assert causal / n <= r["ring"]["scores"] <= 1.1 * causal / n, (r["ring"]["scores"], causal)
        assert r["ring"]["loss"] == pytest.approx(float(loss), rel=1e-5)
        torch.testing.assert_close(
            r["ring"]["grad"], model.tok_emb.weight.grad, rtol=1e-4, atol=1e-6
        )


def _check(results, layouts):
    for name, cfg, ep, cp, zero in layouts:
        want_loss, want_aux, want_norm, want_state, want_momenta = _single(cfg)
        loss = sum(r[name]["loss"] for r in results) / len(
            results
        )  # the mean over dp (cp ranks agree)
        assert loss == pytest.approx(want_loss, rel=1e-5), name
        for r in results:
            assert r[name]["aux"] == pytest.approx(want_aux, rel=1e-5), (
                name
            )  # the global batch's balance
            assert r[name]["norm"] == pytest.approx(want_norm, rel=1e-4), name
            for k, v in want_state.items():
                torch.testing.assert_close(
                    r[name]["state"][k], v, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} {k}: {m}"
                )
            assert r[name]["momenta"].keys() == want_momenta.keys(), name
            for i, v in want_momenta.items():
                torch.testing.assert_close(r[name]["momenta"][i], v, rtol=1e-4, atol=1e-6)
        c = GPTConfig(**cfg)
        n_dp = len(results) // cp
        if ep > 1:  # capacity factor 0: cap = this rank's tokens
            want = c.n_layer * MP.all_to_all_bytes(c.n_expert, B // n_dp * T, c.n_embd, ep)
        else:
            want = c.n_layer * MP.ring_bytes(B // n_dp, T, c.n_kv_head, c.head_dim, cp)
        assert all(r[name]["sent"] == want for r in results), (
            name,
            want,
            [r[name]["sent"] for r in results],
        )
        assert (
            f"ep {ep} inside dp" in results[0][name]["describe"]
            and f"cp {cp}" in results[0][name]["describe"]
            and f"ZeRO-{zero}" in results[0][name]["describe"]
        )


# (name, model, ep, cp, ZeRO stage). Under EP, ZeRO shards the dense parameters over dp and each
# expert slice over the ranks holding it: one rank on 2 ranks with ep 2, two with ep 2 on 4 ranks.
# Issue 48's stability options: EP runs GPT.forward (all three hold); CP takes the loss itself, so
# only QK-norm (inside Attention, before the ring) and the soft-cap (inside GPT.head); machinery/run.py
# refuses z-loss with cp.
STABLE = dict(qk_norm=True, logit_softcap=5.0)
WORLD2 = [
    ("ep2", MOE, 2, 1, 0),
    ("ep2_zero1", MOE, 2, 1, 1),
    ("ep2_zero2", MOE, 2, 1, 2),
    ("cp2", DENSE, 1, 2, 0),
    ("ep2_stable", {**MOE, **STABLE, "z_loss": 0.01}, 2, 1, 0),
    ("cp2_stable", {**DENSE, **STABLE}, 1, 2, 0),
]
WORLD4 = [
    ("ep4", MOE, 4, 1, 0),
    ("ep2_dp2", MOE, 2, 1, 0),
    ("ep2_dp2_zero1", MOE, 2, 1, 1),
    ("cp4", DENSE, 1, 4, 0),
    ("cp2_dp2", DENSE, 1, 2, 0),
]


def test_expert_and_context_parallel_equal_one_process_on_2_ranks():
    results = launcher.launch(_worker, 2, WORLD2, timeout_s=180)
    _check(results, WORLD2)
    _check_costs(results)


@pytest.mark.slow
def test_expert_and_context_parallel_equal_one_process_on_4_ranks():
    results = launcher.launch(_worker, 4, WORLD4, timeout_s=300)
    _check(results, WORLD4)
    _check_costs(results)


def test_positions_split_the_sequence_one_early_one_late_chunk():
    parts = [MP.cp_positions(16, 4, r) for r in range(4)]
    assert sorted(torch.cat(parts).tolist()) == list(range(16))
    assert [p.tolist() for p in parts[:1]] == [[0, 1, 14, 15]]
    # Balanced: every rank has the same number of visible (query, key) pairs.
    assert len({int(sum(int(q) + 1 for q in p)) for p in parts}) == 1


# --------------------------------------------------------------------------------------------------
# train.py: --ep 2 and --cp 2 on 2 ranks give the one-process curve, resume, refuse in one line
# --------------------------------------------------------------------------------------------------

from test_parallel import (  # noqa: E402,F401
    TRAIN_ARGS,
    _curve,
    _train_expect_error,
    _train_rank,
    tiny_dataset,
)

MOE_ARGS = [
    a + ",n_expert=4,expert_top_k=2,moe_capacity_factor=0" if a.startswith("n_layer=") else a
    for a in TRAIN_ARGS
]


@pytest.mark.slow
def test_train_py_ep_and_cp_give_the_one_process_curve_and_resume_across_layouts(
    tiny_dataset, tmp_path
):
    """`train.py --ep 2` (2 ranks, 2 sequences each; also under --zero 1: AdamW's state sharded)
    and `--cp 2` (2 ranks, 4 sequences split along time) = one process on the same 4 sequences:
    loss and pre-clip gradient norm per step (rel 1e-4).
    Each run's step-3 checkpoint resumes on one process, the one-process one on 2 ranks."""
    import shutil

    import train
    from machinery import run as train_run
    from machinery.commands import train as train_command

    for name, args, world, flags in [
        ("ep2", MOE_ARGS, 2, ["--ep", "2", "--batch-size", "2"]),
        ("ep2_zero1", MOE_ARGS, 2, ["--ep", "2", "--zero", "1", "--batch-size", "2"]),
        ("cp2", TRAIN_ARGS, 2, ["--cp", "2"]),
    ]:
        base = ["--data", str(tiny_dataset), *args]
        one = tmp_path / f"one_{name}"
        train_run.train(
            train_command.parse_config([*base, "--out-dir", str(one)]), log=lambda *a, **k: None
        )
        want, want_val = _curve(one)
        launcher.launch(
            _train_rank, world, [*base, *flags, "--out-dir", str(tmp_path / name)], timeout_s=240
        )
        got, val = _curve(tmp_path / name)
        for s in range(6):
            assert got[s] == pytest.approx(want[s], rel=1e-4), (name, s)
        assert val == pytest.approx(want_val, rel=1e-4), name
        for source, target, w, f in [
            (name, f"{name}_on_1", 1, []),
            (one.name, f"one_on_{name}", world, flags),
        ]:
            (tmp_path / target).mkdir()
            shutil.copy(train.checkpoint_path(tmp_path / source, 3), tmp_path / target)
            argv = [*base, *f, "--out-dir", str(tmp_path / target), "--resume"]
            if w > 1:
                launcher.launch(_train_rank, w, argv, timeout_s=240)
            else:
                train_run.train(train_command.parse_config(argv), log=lambda *a, **k: None)
            got, _ = _curve(tmp_path / target)
            for s in range(3, 6):
                assert got[s] == pytest.approx(want[s], rel=1e-4), (target, s)


def _refusals(rank, world, cases):
    return [_train_expect_error(rank, world, argv) for argv, _ in cases]


def test_train_py_refuses_ep_and_cp_layouts_it_does_not_support_in_one_line(tiny_dataset, tmp_path):
    base = ["--data", str(tiny_dataset), "--out-dir", str(tmp_path / "run")]
    cases = [
        (
            [*base, *TRAIN_ARGS, "--ep", "2"],
            "expert parallel over 2 ranks needs a MoE whose n_expert (0)",
        ),
        (
            [*base, *(a.replace("n_expert=4", "n_expert=3") for a in MOE_ARGS), "--ep", "2"],
            "n_expert (3)",
        ),
        ([*base, *MOE_ARGS, "--ep", "2", "--zero", "3"], "ZeRO-3 with ep 2: its full state"),
        ([*base, *TRAIN_ARGS, "--cp", "2", "--zero", "3"], "ZeRO-3 with cp 2: ring attention"),
        (
            [*base, *TRAIN_ARGS, "--cp", "2", "--tp", "2"],
            "context parallel (cp 2) with tp 2 / pp 1",
        ),
        ([*base, *MOE_ARGS, "--cp", "2"], "context parallel splits dense attention"),
        ([*base, *TRAIN_ARGS, "--cp", "2", "--block-size", "30"], "not a multiple of 2 x --cp 2"),
        ([*base, *MOE_ARGS, "--ep", "2", "--cp", "2"], "--ep 2 with --cp 2: expert parallel"),
    ]
    for rank_errors in launcher.launch(_refusals, 2, cases, timeout_s=120):
        for error, (_, message) in zip(rank_errors, cases):
            assert message in error and "\n" not in error, (message, error)
