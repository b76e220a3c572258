"""Tests for model.py, each against an independent reference written here (formulas, a loop, a second model,
torch's FLOP counter, Stanford CS336's snapshot arrays)."""

import dataclasses
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from scaling import count_decode_state_bytes, count_flops_per_token, count_params, training_memory
from machinery.presets import PRESETS
from model import (
    GPT,
    ConfigError,
    GPTConfig,
    KVCache,
    MoE,
    RMSNorm,
    SwiGLU,
    apply_rope,
    causal_attention,
    rope_angles,
    sample,
)
from machinery.commands.model import main

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one intra-op thread is fastest, and 2 threads crawl when the cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def small(**overrides) -> GPTConfig:
    """A model small enough to run dozens of times in a test."""
    base = dict(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
    base.update(overrides)
    return GPTConfig(**base)


def make(config: GPTConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def ids(shape, vocab=64, seed=0):
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------ config & errors


@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(n_embd=30, n_head=4), "n_embd"),
        (dict(n_head=4, n_kv_head=3), "n_kv_head"),
        (dict(n_embd=36, n_head=4, n_kv_head=4), "n_head"),  # head size 9 is odd
        (dict(n_expert=4, expert_top_k=5), "expert_top_k"),
        (dict(n_layer=0), "n_layer"),
        (dict(dropout=1.0), "dropout"),
        (dict(moe_capacity_factor=-1.0), "moe_capacity_factor"),
        (dict(logit_softcap=-30.0), "logit_softcap"),
        (dict(logit_softcap=math.inf), "logit_softcap"),
        (dict(z_loss=float("nan")), "z_loss"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ConfigError, match=rf"GPTConfig\.{field}:"):
        small(**overrides)


def test_bad_inputs_name_the_problem():
    model = make(small())
    with pytest.raises(ConfigError, match="exceeds block_size=16"):
        model(ids((1, 17)))
    with pytest.raises(ConfigError, match=r"vocab_size=64"):
        model(torch.tensor([[1, 64]]))
    with pytest.raises(ConfigError, match=r"vocab_size=64"):
        model(torch.tensor([[-1, 3]]))
    with pytest.raises(ConfigError, match="unknown field"):
        GPTConfig.from_dict({**dataclasses.asdict(small()), "n_embed": 3})


def test_config_round_trip_and_auto_ffn():
    config = small(n_expert=4, tie_embeddings=False)
    assert GPTConfig.from_dict(dataclasses.asdict(config)) == config
    assert GPTConfig(n_embd=128).ffn_dim == 384  # 8/3 * 128 = 341.3 -> multiple of 64
    assert GPTConfig(n_embd=768).ffn_dim == 2048
    assert GPTConfig(n_embd=128, ffn_hidden=100).ffn_dim == 100
    # ffn_hidden=0 stays "auto", so changing the width changes the FFN with it.
    assert dataclasses.replace(GPTConfig(n_embd=128), n_embd=256).ffn_dim == 704


# ------------------------------------------------------------------------------------------------ the pieces


def test_rmsnorm_formula():
    torch.manual_seed(0)
    norm = RMSNorm(8, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 8))
    x = torch.randn(3, 5, 8) * 4 + 1
    expected = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-5) * norm.weight
    torch.testing.assert_close(norm(x), expected)
    # The worked example: [3, 4] has mean square 12.5.
    torch.testing.assert_close(
        RMSNorm(2)(torch.tensor([3.0, 4.0])), torch.tensor([3.0, 4.0]) / math.sqrt(12.5 + 1e-5)
    )


def rotate(x, positions, theta=10000.0):
    """RoPE on (B, T, heads, d) at given positions."""
    cos, sin = rope_angles(torch.as_tensor(positions), x.shape[-1], theta)
    return apply_rope(x, cos, sin)


def test_rope_preserves_norms_and_sees_only_relative_position():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 3, 16)
    torch.testing.assert_close(rotate(x, torch.arange(7)).norm(dim=-1), x.norm(dim=-1))
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    for m, n in [(5, 2), (9, 0), (3, 3)]:
        dots = [(rotate(q, [m + s]) * rotate(k, [n + s])).sum() for s in (0, 7, 100)]
        for d in dots[1:]:
            torch.testing.assert_close(d, dots[0], atol=1e-5, rtol=1e-5)
    # Position 0 is the identity; pair i at position 1 turns by theta^(-2i/d).
    torch.testing.assert_close(rotate(x, torch.zeros(7, dtype=torch.long)), x)
    e = torch.zeros(1, 1, 1, 4)
    e[..., 2] = 1.0  # the first feature of pair 1
    torch.testing.assert_close(
        rotate(e, [1]).flatten(), torch.tensor([0, 0, math.cos(0.01), math.sin(0.01)])
    )


def test_rope_matches_cs336_snapshot(shared_data):
    """CS336 test_rope: d_k=64, theta=10000, positions 0..11, input randn(4, 12, 64) after manual_seed(4)."""
    expected = np.load(shared_data / "cs336/a1/_snapshots/test_rope.npz")["array"]
    torch.manual_seed(4)
    x = torch.randn(4, 12, 64)
    ours = rotate(x[:, :, None, :], torch.arange(12))[:, :, 0, :]
    np.testing.assert_allclose(ours.numpy(), expected, atol=1e-5)


def test_rope_halves_layout_is_a_permutation_of_ours():
    """Hugging Face rotates (x_i, x_{i+d/2}); permuting features maps that layout onto our interleaved pairs."""
    torch.manual_seed(0)
    d = 16
    x = torch.randn(2, 5, 3, d)
    cos, sin = rope_angles(torch.arange(5), d, 10000.0)
    a, b = x[..., : d // 2], x[..., d // 2 :]
    cos_, sin_ = cos[None, :, None, :], sin[None, :, None, :]
    halves = torch.cat((a * cos_ - b * sin_, a * sin_ + b * cos_), dim=-1)
    to_interleaved = torch.stack(
        (torch.arange(d // 2), torch.arange(d // 2) + d // 2), dim=-1
    ).flatten()
    torch.testing.assert_close(
        apply_rope(x[..., to_interleaved], cos, sin), halves[..., to_interleaved]
    )


def cs336_qkv_mask():
    """The CS336 conftest fixtures: q, k, v after seeds 1, 2, 3; mask (True = may attend) after seed 5."""
    tensors = []
    for seed, length in ((1, 12), (2, 16), (3, 16)):
        torch.manual_seed(seed)
        tensors.append(torch.randn(4, length, 64))
    torch.manual_seed(5)
    mask = torch.randn(4, 12, 16) > 0.5
    return (*tensors, mask)


def explicit_attention(q, k, v, mask):
    """softmax(q k^T / sqrt(d)) v with a boolean mask, written out."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    return scores.masked_fill(~mask, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize(
    "snapshot, shape",
    [
        ("test_scaled_dot_product_attention", (4, 12)),
        ("test_4d_scaled_dot_product_attention", (2, 2, 12)),
    ],
)
def test_attention_matches_cs336_snapshots(shared_data, snapshot, shape):
    """model.py's attention with CS336's mask, on CS336's fixtures (3-d, and 4-d as (batch, head) = (2, 2))."""
    expected = np.load(shared_data / f"cs336/a1/_snapshots/{snapshot}.npz")["array"]
    q, k, v, mask = cs336_qkv_mask()
    q, k, v = (t.reshape(*shape[:-1], -1, 64) for t in (q, k, v))
    mask = mask.reshape(*shape, 16)
    np.testing.assert_allclose(causal_attention(q, k, v, mask=mask).numpy(), expected, atol=1e-5)
    np.testing.assert_allclose(explicit_attention(q, k, v, mask).numpy(), expected, atol=1e-5)


@pytest.mark.parametrize("tq, tk", [(6, 6), (1, 6), (3, 6)])
def test_causal_attention_aligns_queries_to_the_last_positions(tq, tk):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 3, tq, 8), torch.randn(2, 3, tk, 8), torch.randn(2, 3, tk, 8)
    mask = torch.arange(tk)[None, :] <= torch.arange(tk - tq, tk)[:, None]
    torch.testing.assert_close(causal_attention(q, k, v), explicit_attention(q, k, v, mask))
    torch.testing.assert_close(
        causal_attention(q, k, v, mask=mask), explicit_attention(q, k, v, mask)
    )


def test_gqa_equals_mha_with_repeated_kv_heads():
    gqa = make(small(n_head=4, n_kv_head=2))
    mha = GPT(small(n_head=4, n_kv_head=4))
    state = gqa.state_dict()
    d = gqa.config.head_dim
    for key, value in list(state.items()):
        if key.endswith(
            ("attn.wk.weight", "attn.wv.weight")
        ):  # (h_kv * d, C): head j -> heads 2j, 2j+1
            state[key] = value.view(2, d, -1).repeat_interleave(2, dim=0).reshape(4 * d, -1)
    mha.load_state_dict(state)
    x = ids((2, 16))
    torch.testing.assert_close(gqa(x)[0], mha(x)[0])


@pytest.mark.parametrize(
    "overrides", [{}, dict(n_kv_head=1), dict(n_expert=4, moe_capacity_factor=0.0)]
)
def test_causality(overrides):
    model = make(small(**overrides))
    x = ids((2, 16))
    y = x.clone()
    y[:, 9:] = ids((2, 7), seed=1)
    torch.testing.assert_close(model(x)[0][:, :9], model(y)[0][:, :9])
    assert not torch.allclose(model(x)[0][:, 9:], model(y)[0][:, 9:])


# ------------------------------------------------------------------------------------------------ the model


def test_forward_is_embed_blocks_head_and_loss_is_cross_entropy():
    model = make(small())
    x, t = ids((2, 16)), ids((2, 16), seed=1)
    logits, loss = model(x, t)
    h = model.embed(x)
    for block in model.blocks:
        h = block(h)
    torch.testing.assert_close(logits, model.head(h))
    assert logits.shape == (2, 16, 64)
    expected = -torch.log_softmax(logits, -1).gather(-1, t[..., None]).mean()
    torch.testing.assert_close(loss, expected)
    t[0, :5] = -1  # ignored positions
    kept = t != -1
    expected = -torch.log_softmax(logits, -1)[kept].gather(-1, t[kept][:, None]).mean()
    torch.testing.assert_close(model(x, t)[1], expected)


class NewTensors(TorchDispatchMode):
    """The (op, dtype) of every tensor of `numel` elements that the ops run under it allocate: outputs whose
    storage is no input's (views and in-place ops allocate nothing)."""

    def __init__(self, numel: int):
        super().__init__()
        self.numel, self.made = numel, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        inputs = {t.untyped_storage().data_ptr() for t in tensors}
        self.made += [
            (str(func), t.dtype)
            for t in tree_leaves(out)
            if isinstance(t, torch.Tensor)
            and t.numel() == self.numel
            and t.untyped_storage().data_ptr() not in inputs
        ]
        return out


@pytest.mark.parametrize("compute", ["bf16 autocast", "bf16 weights", "fp32"])
def test_the_loss_upcasts_the_logits_once_and_returns_them_in_the_compute_dtype(compute):
    """Catches: a second full fp32 copy of the logits (B, T, V) for the loss, the logits returned in fp32 (train.py's
    `_, loss = model(x, y)` keeps them alive), or a loss left in bf16 (no autocast to upcast it: ZeRO-3's bf16
    weights). The loss makes one fp32 copy on purpose (model.py says why) plus the log-softmax that backward needs;
    in fp32 the logits are already fp32: no copy. The loss is the fp32 cross-entropy of the logits returned."""
    model = make(small(vocab_size=96))
    dtype = torch.float32 if compute == "fp32" else torch.bfloat16
    if compute == "bf16 weights":
        model = model.to(torch.bfloat16)
    x = ids(
        (3, 16)
    )  # B x T x V = 4,608 elements: no weight's size, no activation's (fused q, k, v: 64 wide)
    with (
        NewTensors(3 * 16 * 96) as watch,
        torch.autocast("cpu", torch.bfloat16, enabled=compute == "bf16 autocast"),
    ):
        logits, loss = model(x, x)
    assert logits.dtype == dtype and loss.dtype == torch.float32
    fp32 = [op for op, kind in watch.made if kind == torch.float32]
    copies = [op for op in fp32 if "_to_copy" in op]
    assert len(copies) == (dtype != torch.float32) and len(fp32) == 2, watch.made
    torch.testing.assert_close(
        loss, F.cross_entropy(logits.float().flatten(0, 1), x.flatten()), rtol=0, atol=0
    )


def test_tied_and_untied_head():
    tied, untied = make(small()), make(small(tie_embeddings=False))
    assert tied.lm_head.weight is tied.tok_emb.weight
    assert untied.lm_head.weight is not untied.tok_emb.weight
    assert "lm_head.weight" in untied.state_dict()
    assert untied.num_params() - tied.num_params() == 64 * 32


def test_dropout_only_acts_in_training():
    plain, dropped = make(small()), make(small(dropout=0.5))
    x = ids((2, 16))
    torch.testing.assert_close(plain.eval()(x)[0], dropped.eval()(x)[0])
    assert not torch.allclose(plain.train()(x)[0], dropped.train()(x)[0])


def test_initialisation_scales_residual_projections():
    model = make(small(n_layer=8, n_embd=128, n_head=4, n_kv_head=4))
    assert model.blocks[0].attn.wq.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.tok_emb.weight.std().item() == pytest.approx(0.02, rel=0.05)
    for block in model.blocks:
        for w in (block.attn.wo.weight, block.ffn.w2.weight):
            assert w.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert torch.equal(model.norm.weight, torch.ones(128))


def test_kv_cache_gives_the_full_forward_logits():
    model = make(small(n_kv_head=1)).eval()
    x = ids((3, 16))
    full, _ = model(x)
    cache = KVCache(2, 3, 1, 16, 8)
    pieces = [model(x[:, a:b], kv_cache=cache)[0] for a, b in ((0, 5), (5, 6), (6, 11), (11, 16))]
    torch.testing.assert_close(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.length == 16
    with pytest.raises(ConfigError, match="feed them one at a time"):
        model(x[:, :2], kv_cache=cache)  # a full window takes one token at a time
    with pytest.raises(ConfigError, match="reach past block_size=16"):
        model(x[:, :1], kv_cache=KVCache(2, 3, 1, 17, 8))


def naive_generate(model, idx, steps):
    """Greedy decoding without a cache: a full forward over the last block_size tokens at every step."""
    for _ in range(steps):
        logits, _ = model(idx[:, -model.config.block_size :])
        idx = torch.cat((idx, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    return idx


def banded_forward(model, seq, monkeypatch):
    """Logits (B, T, V) of a full forward over the whole sequence, positions 0, 1, 2, ... even past block_size,
    every token attending to the block_size tokens up to itself (a banded causal mask): the semantics a rolling
    cache must reproduce, computed without any cache."""
    import model as model_module

    W = model.config.block_size

    def banded_attention(q, k, v, dropout_p=0.0):
        pos = torch.arange(q.shape[2])
        band = (pos[None, :] <= pos[:, None]) & (
            pos[None, :] > pos[:, None] - W
        )  # (T, T) key visible
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=band, enable_gqa=True
        )  # k, v: h_kv heads

    with monkeypatch.context() as patch:
        patch.setattr(model_module, "causal_attention", banded_attention)
        x = model.tok_emb(seq)  # GPT.forward refuses T > block_size
        for block in model.blocks:
            x = block(x)
        return model.head(x)


def lively(model: GPT) -> GPT:
    """Weights N(0, 1): an untrained model with 0.02-scale weights decodes greedily into one repeated token,
    which any cache, right or wrong, reproduces. These weights give varied tokens that depend on the context."""
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 1.0, generator=g)
    return model.eval()


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        dict(n_expert=4, expert_top_k=2),
        dict(n_kv_head=1),
        dict(qk_norm=True, logit_softcap=30.0),
    ],
)
def test_rolling_cache_equals_sliding_window_attention_past_block_size(overrides, monkeypatch):
    model = lively(make(small(**overrides)))
    x = ids((2, 45))  # block_size 16: the window slides 29 times
    with torch.no_grad():
        expected = banded_forward(model, x, monkeypatch)
        cache = KVCache(2, 2, model.config.n_kv_head, 16, 8)
        pieces = [model(x[:, :10], kv_cache=cache)[0]] + [
            model(x[:, t : t + 1], kv_cache=cache)[0] for t in range(10, 45)
        ]
    torch.testing.assert_close(
        torch.cat(pieces, dim=1), expected, atol=1e-3, rtol=1e-4
    )  # logits ~ 10
    for prompt in (ids((2, 5)), ids((2, 20), seed=1)):  # a prompt longer than the window too
        generated = model.generate(prompt, 40, temperature=0)
        assert len(set(generated[0, -30:].tolist())) > 3  # not one repeated token
        with torch.no_grad():
            logits = banded_forward(
                model, generated[:, -56:] if prompt.shape[1] > 16 else generated, monkeypatch
            )
        assert torch.equal(
            generated[:, -40:], logits[:, -41:-1].argmax(-1)
        )  # each token is the oracle's argmax


def test_rolling_cache_of_one_layer_equals_recomputing_the_cropped_window():
    """With one layer the cached keys depend on their own token only, so sliding the window equals a fresh
    forward over the last block_size tokens (RoPE scores depend on relative positions only)."""
    model = lively(make(small(n_layer=1)))
    prompt = ids((3, 4))
    with torch.no_grad():
        expected = naive_generate(model, prompt, 40)
    assert torch.equal(model.generate(prompt, 40, temperature=0), expected)
    assert len(set(expected[0, -30:].tolist())) > 3


def test_sample_respects_top_k_and_temperature():
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0]]).repeat(2000, 1)
    g = torch.Generator().manual_seed(0)
    assert set(sample(logits, top_k=2, generator=g).flatten().tolist()) == {2, 3}
    assert sample(logits[:1], temperature=0).item() == 3
    counts = torch.bincount(
        sample(logits, temperature=1.0, generator=g).flatten(), minlength=4
    ).float()
    expected = logits[0].softmax(-1) * 2000  # e^x / sum: 64, 175, 475, 1286
    assert torch.all((counts - expected).abs() < 5 * expected.sqrt() + 5)


def test_sampling_is_seeded_and_top_k_one_is_greedy():
    model = make(small())
    prompt = ids((2, 3))
    a = model.generate(prompt, 8, generator=torch.Generator().manual_seed(1))
    b = model.generate(prompt, 8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b) and a.shape == (2, 11) and torch.equal(a[:, :3], prompt)
    assert torch.equal(model.generate(prompt, 8, top_k=1), model.generate(prompt, 8, temperature=0))
    assert model.training  # generate restores the mode


# ------------------------------------------------------------------------------------------------ MoE


def test_moe_with_one_expert_top1_equals_the_dense_ffn():
    config = small(n_embd=32, n_expert=1, expert_top_k=1)
    torch.manual_seed(0)
    moe, dense = MoE(config), SwiGLU(32, config.ffn_dim)
    with torch.no_grad():
        moe.w1.copy_(dense.w1.weight.t()[None])
        moe.w3.copy_(dense.w3.weight.t()[None])
        moe.w2.copy_(dense.w2.weight.t()[None])
    x = torch.randn(2, 8, 32)
    y, aux_loss = moe(x)
    torch.testing.assert_close(y, dense(x))
    assert aux_loss.item() == pytest.approx(1.0)


def moe_reference(moe: MoE, x):
    """Every token, every one of its top-k experts, one at a time: sum_e p_e * SwiGLU_e(x)."""
    tokens = x.reshape(-1, x.shape[-1])
    probs = moe.router(tokens).softmax(-1)
    out = torch.zeros_like(tokens)
    for n in range(tokens.shape[0]):
        gate, chosen = probs[n].topk(moe.top_k)
        for g, e in zip(gate, chosen.tolist()):
            h = F.silu(tokens[n] @ moe.w1[e]) * (tokens[n] @ moe.w3[e])
            out[n] += g * (h @ moe.w2[e])
    return out.view_as(x)


def test_moe_without_dropping_equals_per_token_reference():
    torch.manual_seed(0)
    moe = MoE(small(n_expert=4, expert_top_k=2, moe_capacity_factor=0.0))
    for w in (moe.w1, moe.w2, moe.w3, moe.router.weight):
        torch.nn.init.normal_(w, 0, 0.2)
    x = torch.randn(2, 8, 32)
    torch.testing.assert_close(moe(x)[0], moe_reference(moe, x), atol=1e-5, rtol=1e-5)


def test_moe_capacity_drops_overflow_and_aux_loss_sees_collapse():
    torch.manual_seed(0)
    moe = MoE(small(n_expert=4, expert_top_k=1, moe_capacity_factor=1.0))
    for w in (moe.w1, moe.w2, moe.w3):
        torch.nn.init.normal_(w, 0, 0.2)
    with torch.no_grad():  # the router sends every token to expert 2
        moe.router.weight.zero_()
        moe.router.weight[2, 0] = 100.0
    x = torch.randn(1, 16, 32)
    x[..., 0] = x[..., 0].abs() + 1
    assert moe.capacity(16) == 4  # 1.0 * 16 tokens * top-1 / 4 experts
    y, aux_loss = moe(x)
    served = (y.abs().sum(-1) > 0)[0]
    assert served.tolist() == [True] * 4 + [False] * 12  # first come, first served
    torch.testing.assert_close(y[0, :4], moe_reference(moe, x)[0, :4])
    assert aux_loss.item() == pytest.approx(4.0, rel=1e-4)  # E * 1 * 1: total collapse
    moe.eval()  # inference never drops
    torch.testing.assert_close(moe(x)[0], moe_reference(moe, x))


def test_model_aux_loss_sums_layers_and_gets_gradients():
    model = make(small(n_expert=4, expert_top_k=2))
    x = ids((2, 16))
    _, loss = model(x, x)
    assert model.aux_loss.shape == () and 2 * 0.9 < model.aux_loss.item() < 2 * 4
    torch.testing.assert_close(model.aux_loss, sum(b.aux_loss for b in model.blocks))
    (loss + model.config.moe_aux_coef * model.aux_loss).backward()
    assert model.blocks[0].ffn.router.weight.grad.abs().sum() > 0
    assert make(small()).aux_loss.item() == 0.0


# ------------------------------------------------------------------------------------------------ accounting


def moe_variant(config: GPTConfig) -> GPTConfig:
    return dataclasses.replace(config, n_expert=8, expert_top_k=2)


def built_params(model: GPT, non_embedding: bool = False, active: bool = False) -> int:
    """GPT.num_params, and with `active` a MoE's weights counted for the top k of E experts only."""
    total = model.num_params(non_embedding)
    if active and model.config.n_expert:
        E, k = model.config.n_expert, model.config.expert_top_k
        experts = sum(w.numel() for b in model.blocks for w in (b.ffn.w1, b.ffn.w2, b.ffn.w3))
        total -= experts * (E - k) // E
    return total


@pytest.mark.parametrize("name", list(PRESETS))
def test_param_counts_match_the_closed_form(name):
    for config in (
        PRESETS[name],
        dataclasses.replace(PRESETS[name], tie_embeddings=False),
        moe_variant(PRESETS[name]),
        dataclasses.replace(PRESETS[name], qk_norm=True),  # + 2 gains of head_dim per layer
    ):
        with torch.device("meta"):  # shapes only: the 1B model costs nothing
            model = GPT(config)
        for kwargs in (
            {},
            dict(non_embedding=True),
            dict(active=True),
            dict(non_embedding=True, active=True),
        ):
            assert built_params(model, **kwargs) == count_params(config, **kwargs), (config, kwargs)


def test_closed_form_by_hand_and_preset_sizes():
    # 124m: 12 layers * 12 * 768^2 + 50304 * 768 (tied) + 25 * 768 norm gains.
    assert count_params(PRESETS["124m"]) == 12 * 12 * 768**2 + 50304 * 768 + 25 * 768
    assert count_params(PRESETS["350m"]) == pytest.approx(355e6, rel=0.03)
    assert count_params(PRESETS["1b"]) == pytest.approx(1.08e9, rel=0.02)
    assert count_params(PRESETS["10m"], non_embedding=True) == pytest.approx(10e6, rel=0.1)
    sweep = [count_params(PRESETS[f"sweep-{i}"], non_embedding=True) for i in range(1, 5)]
    for smaller, larger in zip(sweep, sweep[1:]):
        assert 3 <= larger / smaller <= 5
    assert PRESETS["tiny"].vocab_size == 4096
    # MoE: memory counts all experts, compute only the active ones.
    moe = moe_variant(PRESETS["tiny"])
    C, H, L = 128, 384, 4
    assert count_params(moe) - count_params(moe, active=True) == L * 6 * 3 * C * H


def test_flops_per_token_matches_torch_flop_counter():
    """6N + 12 L T C_q against the matmul FLOPs torch counts in one forward+backward.

    The math attention backend spells attention out as two batched matmuls over all T^2 pairs (the fused CPU
    kernel is invisible to the counter). The formula's N also holds the norm gains (not matmuls): 0.3% here.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    config = small(vocab_size=256, block_size=32, n_embd=64)
    model = make(config)
    x = ids((2, 32), vocab=256)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        model(x, x)[1].backward()
    measured = counter.get_total_flops() / x.numel()
    assert measured == pytest.approx(count_flops_per_token(model.config), rel=0.005)


def test_training_memory_is_16_bytes_per_parameter():
    n_params = count_params(PRESETS["1b"])
    assert training_memory(n_params).total == 16 * n_params
    # The lesson's 1e9 parameters need 16 GB; the 1b preset's 1.076e9 need 17.2 GB (python model.py's table).
    assert training_memory(n_params).total / 1e9 == pytest.approx(17.22, abs=0.01)


# ------------------------------------------------------------------------------------------------ training


def test_activation_checkpointing_gives_the_same_gradients():
    for overrides in ({}, dict(n_expert=4, expert_top_k=2)):
        plain = make(small(**overrides))
        ckpt = make(small(activation_checkpointing=True, **overrides))
        x = ids((2, 16))
        for model in (plain, ckpt):
            _, loss = model(x, x)
            (loss + 0.01 * model.aux_loss).backward()
        for (name, a), b in zip(plain.named_parameters(), ckpt.parameters()):
            torch.testing.assert_close(a.grad, b.grad, msg=name)


@pytest.mark.parametrize(
    "overrides", [{}, dict(n_expert=4, expert_top_k=2, activation_checkpointing=True)]
)
def test_no_graph_breaks_under_torch_compile(overrides):
    model = make(small(**overrides))
    x = ids((2, 16))
    # fullgraph=True raises at the first graph break; aot_eager also traces the backward (no C compiler needed).
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    logits, loss = compiled(x, x)
    compiled_aux = model.aux_loss
    (loss + compiled_aux).backward()
    eager_logits, _ = model(x, x)
    torch.testing.assert_close(logits, eager_logits)
    torch.testing.assert_close(
        compiled_aux, model.aux_loss
    )  # the MoE side channel survives compile
    torch._dynamo.reset()


def test_tiny_model_overfits_a_batch():
    model = make(small(block_size=32, n_layer=2, n_embd=64, n_head=4, n_kv_head=2))
    x = ids((4, 32))
    y = torch.roll(x, -1, dims=1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(100):
        _, loss = model(x, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.05  # started at ln(64) = 4.16


# ------------------------------------------------------------------------------------------------ command line


def test_cli_prints_presets_and_demo(capsys):
    assert main([]) == 0
    table = capsys.readouterr().out
    for name in PRESETS:
        assert f"\n{name} " in table
    assert "124M" in table and "1.08B" in table
    assert main(["demo", "--tokens", "3"]) == 0
    assert "same ids within block_size: True" in capsys.readouterr().out  # KV cache vs full forward
    script = subprocess.run(
        [sys.executable, str(ROOT / "model.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert script.returncode == 0 and "presets" in script.stdout


# The CUDA path without a GPU. torch's FakeTensorMode makes device="cuda" tensors on this CPU build, but it cannot
# go further here: indexing one (`x[:, None]`, inside RoPE) raises "not linked with support for cuda devices" and
# autograd over fake CUDA parameters aborts the process. The meta device stands in for "a device that is not the
# CPU": shapes, dtypes and autograd run, a CPU tensor meeting a meta one raises (0-dim scalars excepted, as on
# CUDA), and any read of a value back to the host raises, which is exactly what a device-to-host sync would be.


def test_forward_backward_and_generate_on_another_device_never_read_values_back():
    """Catches: `int(idx.min())` / `int(idx.max())` in the input check (two device-to-host syncs per forward on a
    GPU) and any CPU tensor created inside forward or generate (a KV cache, RoPE angles, a mask on the CPU)."""
    with torch.device("meta"):
        model = GPT(small())
    idx = torch.zeros(2, 16, dtype=torch.long, device="meta")
    _, loss = model(idx, idx)
    loss.backward()
    assert loss.device.type == "meta" and model.tok_emb.weight.grad.device.type == "meta"
    out = model.generate(idx[:, :3], 4, top_k=5)
    assert out.shape == (2, 7) and out.device.type == "meta"


def test_gqa_expands_kv_heads_in_groups_like_repeat_interleave():
    """Catches: repeating the kv heads as a block (k.repeat) instead of head by head, which pairs query head j
    with kv head j % h_kv instead of j // group; the reference is the explicit repeat_interleave."""
    torch.manual_seed(0)
    config = small(n_head=4, n_kv_head=2)
    model = GPT(config).eval()
    attn, x = model.blocks[0].attn, torch.randn(2, 16, config.n_embd)
    B, T, d = 2, 16, config.head_dim
    from model import apply_rope, rope_angles

    q = attn.wq(x).view(B, T, 4, d)
    k = attn.wk(x).view(B, T, 2, d)
    v = attn.wv(x).view(B, T, 2, d)
    cos, sin = rope_angles(torch.arange(T), d, config.rope_theta)
    q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)
    v = v.transpose(1, 2)
    y = F.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), is_causal=True
    )
    want = attn.wo(y.transpose(1, 2).reshape(B, T, 4 * d))
    torch.testing.assert_close(attn(x), want)


def gqa_inputs(tq, tk, dtype, seed=0):
    """q (2, 8, tq, 16) over k, v (2, 2, tk, 16): 4 query heads per kv head; and an output gradient."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 8, tq, 16, generator=gen).to(dtype).requires_grad_()
    k, v = (torch.randn(2, 2, tk, 16, generator=gen).to(dtype).requires_grad_() for _ in range(2))
    return q, k, v, torch.randn(2, 8, tq, 16, generator=gen).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(
    "tq, tk", [(8, 8), (1, 8), (3, 8)]
)  # causal, one new token, a prompt after a cache
def test_gqa_reads_kv_heads_in_place_and_equals_the_copy(dtype, tq, tk, monkeypatch):
    """Catches: K/V copied to n_head heads where the CPU's kernel reads the groups itself (autograd then keeps the
    copies: group times the K/V memory), or paired with the wrong query heads. The references: the same function
    made to copy (SDPA_GQA_IN_PLACE emptied, the rule for a device whose kernel needs the copy) and K/V repeated
    by hand (query head j reads kv head j // 4) into plain SDPA, outputs and gradients."""
    import model as model_module

    q, k, v, d_out = gqa_inputs(tq, tk, dtype)

    def run(attention):
        saved = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved.append(t.data_ptr()) or t, lambda t: t
        ):
            out = attention(q, k, v)
        return out, torch.autograd.grad(out, (q, k, v), d_out), saved

    out, grads, saved = run(causal_attention)
    assert k.data_ptr() in saved and v.data_ptr() in saved  # the kernel keeps k, v, no copies
    mask = torch.arange(tk)[None, :] <= torch.arange(tk - tq, tk)[:, None]
    by_hand = run(
        lambda q, k, v: F.scaled_dot_product_attention(
            q, k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1), attn_mask=mask
        )
    )
    with monkeypatch.context() as patch:
        patch.setattr(model_module, "SDPA_GQA_IN_PLACE", {})
        copied = run(causal_attention)
    assert k.data_ptr() not in copied[2]  # this one did copy
    # bf16: the kernel adds a group's 4 K/V gradients in fp32 and rounds once, the copy's backward rounds each
    # head's gradient and adds them in bf16: they differ by bf16 rounding (~2e-3 here, |grad| ~ 3), not more
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    for want in (copied, by_hand):
        torch.testing.assert_close(out, want[0], **tol)
        for got, grad in zip(grads, want[1]):
            torch.testing.assert_close(got, grad, **tol)


# ------------------------------------------------------------------------- attention's cost: flash, linear, hybrid

from model import (  # noqa: E402
    FlashAttention2,
    flash_attention,
    linear_attention_chunked,
    linear_attention_recurrent,
)


def naive_attention(q, k, v, is_causal):
    """The formula, T x T matrix and all: softmax(q k^T / sqrt(d) + mask) v, mask top-left aligned."""
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), -math.inf)
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("is_causal", [True, False])
@pytest.mark.parametrize(
    "tq, tk, tile", [(37, 37, 8), (16, 16, 16), (1, 1, 4), (5, 70, 16), (70, 70, 64)]
)
def test_flash_attention_equals_sdpa_and_the_formula_with_gradients(is_causal, tq, tk, tile):
    gen = torch.Generator().manual_seed(tq * 100 + tk)
    q = torch.randn(2, 3, tq, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (
        torch.randn(2, 3, tk, 8, generator=gen, dtype=torch.float64, requires_grad=True)
        for _ in range(2)
    )
    d_out = torch.randn(2, 3, tq, 8, generator=gen, dtype=torch.float64)
    out = FlashAttention2.apply(q, k, v, is_causal, tile)
    for reference in (
        F.scaled_dot_product_attention(q, k, v, is_causal=is_causal),
        naive_attention(q, k, v, is_causal),
    ):
        torch.testing.assert_close(out, reference, rtol=1e-10, atol=1e-10)
        grads = torch.autograd.grad(out, (q, k, v), d_out, retain_graph=True)
        for got, want in zip(grads, torch.autograd.grad(reference, (q, k, v), d_out)):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("is_causal", [True, False])
def test_flash_attention_broadcasts_gqa_groups_with_gradients(is_causal):
    """Catches: a kv head's gradient taken from one query head of its group instead of the group's sum. The
    reference: SDPA's own GQA (enable_gqa) in float64; q (2, 2, 4, 37, 16) against k, v (2, 2, 1, 37, 16)."""
    q, k, v, d_out = gqa_inputs(37, 37, torch.float64, seed=1)
    out = FlashAttention2.apply(
        q.unflatten(1, (2, 4)), k.unsqueeze(2), v.unsqueeze(2), is_causal, 8
    ).flatten(1, 2)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=True)
    torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(out, (q, k, v), d_out)
    for got, grad in zip(grads, torch.autograd.grad(want, (q, k, v), d_out)):
        torch.testing.assert_close(got, grad, rtol=1e-9, atol=1e-9)


def test_flash_attention_saves_linear_memory_for_backward():
    """What autograd keeps: q, k, v, the output and one log-sum-exp per query (O(T)); the formula keeps T x T."""

    def saved_numbers(fn, T):
        numbers = []
        q, k, v = (torch.randn(1, 1, T, 8, requires_grad=True) for _ in range(3))
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t: numbers.append(t.numel()) or t, lambda t: t
        ):
            fn(q, k, v, True)
        return sum(numbers)

    assert (
        saved_numbers(flash_attention, 512)
        == 2 * saved_numbers(flash_attention, 256)
        == 2 * 256 * 33
    )
    assert saved_numbers(naive_attention, 512) > 3.5 * saved_numbers(naive_attention, 256)


@pytest.mark.parametrize("T", [256, 2048])
def test_flash_attention_in_bf16_is_as_accurate_as_sdpa(T):
    """Catches: the running max, sum or output (or the gradients' sums) kept in bf16, whose error is 2-5x the
    fused kernel's and grows with T. Both kernels get the same bf16 q, k, v, d_out (1, 2, T, 32); the reference is
    the formula in float64 on those values; the error is |x - ref| / |ref| over the output and each gradient."""
    gen = torch.Generator().manual_seed(T)
    q, k, v, d_out = (torch.randn(1, 2, T, 32, generator=gen).to(torch.bfloat16) for _ in range(4))

    def output_and_grads(attend, dtype):
        leaves = [x.to(dtype).requires_grad_() for x in (q, k, v)]
        out = attend(*leaves)
        return [out] + list(torch.autograd.grad(out, leaves, d_out.to(dtype)))

    reference = output_and_grads(
        lambda *qkv: F.scaled_dot_product_attention(*qkv, is_causal=True), torch.float64
    )
    fused = output_and_grads(
        lambda *qkv: F.scaled_dot_product_attention(*qkv, is_causal=True), torch.bfloat16
    )
    by_hand = output_and_grads(lambda *qkv: flash_attention(*qkv, True), torch.bfloat16)
    for name, want, sdpa, got in zip(("out", "dq", "dk", "dv"), reference, fused, by_hand):
        assert got.dtype == torch.bfloat16
        sdpa_error = ((sdpa.double() - want).norm() / want.norm()).item()
        error = ((got.double() - want).norm() / want.norm()).item()
        assert error <= 1.5 * sdpa_error, (name, error, sdpa_error)


def test_compiled_flash_attention_graph_does_not_grow_with_T():
    """Catches: the tile loops traced into the graph (370 forward + 734 backward nodes at T = 256, 4,150 + 9,524
    at 1,024: (T / tile)^2). Counted by the compiler's own graphs (aot_autograd's forward and backward); the
    compiled result equals eager, GQA-shaped as the model calls it: q (1, 2, 2, T, 16), k, v (1, 2, 1, T, 16)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def compiled_nodes(T):
        counts = {}

        def counting(kind):
            def compile_graph(graph_module, example_inputs):
                counts[kind] = len(graph_module.graph.nodes)
                return make_boxed_func(graph_module.forward)

            return compile_graph

        torch._dynamo.reset()
        backend = aot_autograd(fw_compiler=counting("forward"), bw_compiler=counting("backward"))
        attend = torch.compile(
            lambda q, k, v: flash_attention(q, k, v, True),
            backend=backend,
            dynamic=False,
            fullgraph=True,
        )
        gen = torch.Generator().manual_seed(T)
        q = torch.randn(1, 2, 2, T, 16, generator=gen, requires_grad=True)
        k, v = (torch.randn(1, 2, 1, T, 16, generator=gen, requires_grad=True) for _ in range(2))
        compiled = attend(q, k, v)
        eager = flash_attention(q, k, v, True)
        torch.testing.assert_close(compiled, eager, rtol=0, atol=0)
        for got, want in zip(
            torch.autograd.grad(compiled.sum(), (q, k, v)),
            torch.autograd.grad(eager.sum(), (q, k, v)),
        ):
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        return counts

    short, long = compiled_nodes(256), compiled_nodes(1024)
    torch._dynamo.reset()
    assert set(short) == {"forward", "backward"}
    assert short == long, (short, long)


def test_flash_in_the_model_equals_sdpa_with_gqa_outputs_and_gradients():
    x = ids((2, 13))
    sdpa, flash = make(small()), make(small(attention="flash"))
    assert sdpa.blocks[0].attn.n_kv_head < sdpa.blocks[0].attn.n_head  # GQA is exercised
    (logits_a, loss_a), (logits_b, loss_b) = sdpa(x, x), flash(x, x)
    torch.testing.assert_close(logits_a, logits_b, rtol=1e-5, atol=1e-5)
    loss_a.backward()
    loss_b.backward()
    for (name, a), b in zip(sdpa.named_parameters(), flash.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)
    assert torch.equal(sdpa.generate(x, 3, temperature=0), flash.generate(x, 3, temperature=0))


@pytest.mark.parametrize("T, chunk", [(1, 4), (37, 8), (64, 64), (50, 64)])
def test_linear_attention_recurrent_and_chunked_forms_agree(T, chunk):
    gen = torch.Generator().manual_seed(T)
    q, k, v = (torch.randn(2, 3, T, 6, generator=gen, dtype=torch.float64) for _ in range(3))
    log_a = F.logsigmoid(torch.randn(2, 3, T, generator=gen, dtype=torch.float64) + 1)
    state = torch.randn(2, 3, 6, 6, generator=gen, dtype=torch.float64)
    for start in (None, state):
        out_r, state_r = linear_attention_recurrent(q, k, v, log_a, start)
        out_c, state_c = linear_attention_chunked(q, k, v, log_a, start, chunk)
        torch.testing.assert_close(out_r, out_c, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(state_r, state_c, rtol=1e-10, atol=1e-10)
    # The formula by hand for the last token: o_T = sum_s prod_{r > s} a_r (q_T . k_s) v_s (no initial state).
    a = log_a.exp()
    scores = (q[:, :, -1:] @ k.transpose(-1, -2))[:, :, 0]  # (B, h, T)
    weights = torch.stack([a[:, :, s + 1 :].prod(-1) for s in range(T)], -1) * scores
    torch.testing.assert_close(
        linear_attention_recurrent(q, k, v, log_a)[0][:, :, -1], (weights[..., None] * v).sum(2)
    )


def greedy_by_full_forward(model, prompt, steps):
    """The reference for a cached generate: each next token by argmax over a full forward."""
    idx = prompt
    with torch.no_grad():
        for _ in range(steps):
            idx = torch.cat((idx, model(idx)[0][:, -1].argmax(-1, keepdim=True)), 1)
    return idx


@pytest.mark.parametrize("pattern", ["L", "LA", "AL"])
def test_generate_with_kv_cache_and_recurrent_state_equals_the_full_forward(pattern):
    model = make(small(layer_pattern=pattern, block_size=40)).eval()
    prompt = ids((2, 5))
    out = model.generate(prompt, 30, temperature=0)
    idx = greedy_by_full_forward(model, prompt, 30)
    assert torch.equal(out, idx)
    cache = KVCache(2, 2, 2, 40, 8, kinds=model.config.layer_kinds)
    with torch.no_grad():
        model(idx[:, :34], kv_cache=cache)  # a prompt, chunked form
        step = model(idx[:, 34:35], kv_cache=cache)[0]  # one token, recurrent form
        torch.testing.assert_close(step[:, -1], model(idx)[0][:, -1], rtol=1e-4, atol=1e-5)
    attention_layers = pattern.count("A")
    # the bytes held: the attention layers' K/V buffers and the linear layers' states
    held = [t for layer in cache.layers for t in (layer.k, layer.v, layer.state) if t is not None]
    assert sum(t.numel() * t.element_size() for t in held) == 4 * (
        attention_layers * 2 * 2 * 2 * 40 * 8 + (2 - attention_layers) * 2 * 4 * 8 * 8
    )


def test_layer_pattern_builds_the_kinds_and_counts_their_parameters_and_state():
    config = small(n_layer=4, layer_pattern="LLLA")
    model = make(config)
    assert [type(b.attn).__name__ for b in model.blocks] == ["LinearAttention"] * 3 + ["Attention"]
    assert model.num_params() == count_params(config) and config.layer_kinds == "LLLA"
    assert make(small(layer_pattern="A")).num_params() == make(small()).num_params()
    full, linear = small(layer_pattern="A"), small(layer_pattern="L")
    assert count_decode_state_bytes(full, 2000) == 2 * count_decode_state_bytes(
        full, 1000
    )  # the cache grows
    assert (
        count_decode_state_bytes(linear, 2000) == count_decode_state_bytes(linear, 10) > 0
    )  # the state does not
    assert (
        count_flops_per_token(linear, 1000)
        == count_flops_per_token(linear, 10)
        < count_flops_per_token(full, 1000)
    )
    x = ids((2, 16))
    loss = model(x, x)[1]
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(layer_pattern="LAX"), "layer_pattern: 'LAX' has a kind other than A"),
        (
            dict(n_layer=4, layer_pattern="LLA"),
            r"layer_pattern: 'LLA' \(length 3\) does not tile n_layer=4",
        ),
        (dict(attention="triton"), "attention: must be 'sdpa' or 'flash'"),
        (dict(attention="flash", dropout=0.1), "attention: 'flash' has no attention dropout"),
    ],
)
def test_bad_attention_configs_get_one_line(overrides, message):
    with pytest.raises(ConfigError, match=rf"GPTConfig\.{message}"):
        small(**overrides)


# ------------------------------------------------------------------------------------------------ stability (issue 48)


def test_stability_options_off_leave_the_default_model_as_it_was():
    """The loss of a fixed-seed default model (weights in float64, the loss in fp32 as GPT.forward takes it),
    recorded before qk_norm, logit_softcap and z_loss existed: off, they change nothing (no parameter, no random
    draw, no arithmetic)."""
    config = small()
    assert (config.qk_norm, config.logit_softcap, config.z_loss) == (False, 0.0, 0.0)
    model = make(config).double()
    targets = ids((2, 16), seed=1)
    targets[0, :5] = -1
    _, loss = model(ids((2, 16)), targets)
    assert loss.item() == pytest.approx(4.200470924377441, rel=1e-6)
    assert not any("norm" in name for name, _ in model.blocks[0].attn.named_parameters())


def explicit_max_logit(model: GPT, idx: torch.Tensor) -> float:
    """The largest causal attention logit by hand in float64: RMSNorm, QK-norm and RoPE (as complex rotations)
    written out here, each layer's input from the model's own previous block."""
    model = model.double().eval()
    cfg, best = model.config, -math.inf
    T, d = idx.shape[1], cfg.head_dim
    angle = torch.arange(T, dtype=torch.float64)[:, None] * cfg.rope_theta ** (
        -torch.arange(0, d, 2, dtype=torch.float64) / d
    )  # (T, d/2)
    rotation = torch.polar(torch.ones_like(angle), angle)[None, :, None, :]  # (1, T, 1, d/2)

    def rms(x, gain):
        return x / torch.sqrt((x**2).mean(-1, keepdim=True) + cfg.norm_eps) * gain

    with torch.no_grad():
        x = model.tok_emb(idx)
        for block in model.blocks:
            attn, h = block.attn, rms(x, block.attn_norm.weight)
            q = (h @ attn.wq.weight.T).view(*idx.shape, cfg.n_head, d)
            k = (h @ attn.wk.weight.T).view(*idx.shape, cfg.n_kv_head, d)
            if cfg.qk_norm:
                q, k = rms(q, attn.q_norm.weight), rms(k, attn.k_norm.weight)
            q, k = (
                torch.view_as_real(
                    torch.view_as_complex(t.reshape(*t.shape[:3], d // 2, 2)) * rotation
                )
                .flatten(-2)
                .transpose(1, 2)
                for t in (q, k)
            )  # (B, heads, T, d)
            k = k.repeat_interleave(cfg.n_head // cfg.n_kv_head, dim=1)
            scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(
                torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf
            )
            best = max(best, scores.max().item())
            x = block(x)
    return best


@pytest.mark.parametrize(
    "overrides", [dict(qk_norm=True), {}, dict(qk_norm=True, attention="flash")]
)
def test_max_attention_logit_equals_a_float64_computation(overrides):
    from machinery.attention_probe import max_attention_logit

    model = make(small(**overrides))  # GQA: 4 query heads over 2 kv heads
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "q_norm" in name or "k_norm" in name:
                p.copy_(
                    torch.rand(p.shape, generator=g) * 3
                )  # unequal gains: before RoPE or after differ
            elif name.endswith(("wq.weight", "wk.weight")):
                p.mul_(20)  # logits of several units, not ~0
    x = ids((2, 16))
    got = max_attention_logit(model, x)
    assert model.training and model.blocks[0].attn.flash == (overrides.get("attention") == "flash")
    assert got > 1.0
    assert got == pytest.approx(explicit_max_logit(model, x), rel=1e-5)


def test_qk_norm_with_unit_gains_bounds_every_attention_logit_by_sqrt_head_dim():
    from machinery.attention_probe import max_attention_logit

    x = ids((2, 16))
    for qk_norm in (False, True):
        model = make(small(qk_norm=qk_norm, n_embd=64, n_head=4, n_kv_head=2))  # head_dim 16
        with torch.no_grad():
            for block in model.blocks:
                block.attn.wq.weight.mul_(50)
                block.attn.wk.weight.mul_(50)
        largest = max_attention_logit(model, x)
        if qk_norm:
            assert 1.0 < largest <= math.sqrt(16)  # 4: |q| = |k| = sqrt(d)
        else:
            assert largest > 100  # the same weights without the norm: unbounded


def test_qk_norm_keeps_q_and_k_in_the_compute_dtype_under_bf16_autocast(monkeypatch):
    """An fp32 gain would promote a bf16 q and k to fp32 (twice the bytes through RoPE and the kernel, and a dtype
    unlike v's): RMSNorm returns its input's dtype, so QK-norm hands them on in v's, as they are without it."""
    import model as model_module

    seen = []

    def recording(kernel):
        def record(q, k, v, *args, **kwargs):
            seen.append((q.dtype, k.dtype, v.dtype))
            return kernel(q, k, v, *args, **kwargs)

        return record

    for name in ("causal_attention", "flash_attention"):
        monkeypatch.setattr(model_module, name, recording(getattr(model_module, name)))
    x = ids((2, 16))
    for attention in ("sdpa", "flash"):
        model = make(small(qk_norm=True, attention=attention))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits, loss = model(x, x)
        loss.backward()
        assert logits.dtype == torch.bfloat16 and torch.isfinite(loss)
        assert model.blocks[0].attn.q_norm.weight.grad is not None
    assert seen == [(torch.bfloat16,) * 3] * 4  # 2 layers, sdpa then flash


def test_logit_softcap_bounds_the_logits_and_equals_the_formula():
    capped, plain = make(small(logit_softcap=5.0)), make(small())
    with torch.no_grad():
        for model in (capped, plain):
            model.tok_emb.weight.mul_(
                40
            )  # tied head: logits up to ~40 (fp32's tanh reaches 1.0 at 9)
    x = ids((2, 16))
    raw, got = plain(x)[0], capped(x)[0]
    assert raw.abs().max() > 20 and got.abs().max() < 5.0
    torch.testing.assert_close(got, 5.0 * torch.tanh(raw / 5.0))


def test_z_loss_equals_the_formula_over_the_positions_with_a_target_and_its_gradient():
    z = 0.05
    with_z, plain = make(small(z_loss=z)), make(small())
    with torch.no_grad():
        for model in (with_z, plain):
            model.tok_emb.weight.mul_(30)  # log Z far from 0 and unequal across positions
    x, y = ids((2, 16)), ids((2, 16), seed=1)
    y[0, :7] = -1
    y[1, 3] = -1
    # a training objective: in eval mode the loss is the cross-entropy alone, as without z-loss
    assert with_z.eval()(x, y)[1].item() == plain.eval()(x, y)[1].item()
    with_z.train(), plain.train()
    logits, loss = with_z(x, y)
    kept = (y != -1).flatten()
    log_z = logits.double().flatten(0, 1)[kept].logsumexp(-1)
    ce = F.cross_entropy(logits.double().flatten(0, 1), y.flatten(), ignore_index=-1)
    assert loss.item() == pytest.approx((ce + z * log_z.pow(2).mean()).item(), rel=1e-6)
    assert loss.item() - plain(x, y)[1].item() > 0.1  # the term is there, and large here
    loss.backward()
    ref_logits, _ = plain(x)
    flat = ref_logits.float().flatten(0, 1)
    formula = F.cross_entropy(flat, y.flatten(), ignore_index=-1)
    (formula + z * torch.logsumexp(flat[kept], -1).pow(2).mean()).backward()
    for (name, a), b in zip(with_z.named_parameters(), plain.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("pattern", ["A", "LA"])
def test_qk_norm_model_generates_with_kv_cache_as_the_full_forward_and_round_trips(pattern):
    config = small(qk_norm=True, logit_softcap=30.0, z_loss=1e-4, layer_pattern=pattern)
    model = lively(make(config))
    # the attention layers have the norms (not merely the attribute), the linear ones none
    assert [getattr(b.attn, "q_norm", None) is not None for b in model.blocks] == [
        k == "A" for k in config.layer_kinds
    ]
    prompt = ids((2, 5))
    out = model.generate(prompt, 11, temperature=0)
    idx = greedy_by_full_forward(model, prompt, 11)
    assert torch.equal(out, idx) and len(set(out[0, 5:].tolist())) > 2
    again = GPT(GPTConfig.from_dict(dataclasses.asdict(config)))
    again.load_state_dict(model.state_dict())
    torch.testing.assert_close(again.eval()(idx)[0], model(idx)[0])


# ------------------------------------------------------------------------------- the GPU step: fused matmuls, bf16


def separate_linears(x, *linears):
    """The reference for model.fused_linear: one matmul per layer, each through its own forward."""
    return tuple(linear(x) for linear in linears)


def loss_and_grads(model, x, autocast: bool):
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        logits, loss = model(x, x)
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logits, loss, grads


@pytest.mark.parametrize(
    "pattern", ["", "LA"]
)  # GQA attention; linear attention (its q, k, v fused too)
@pytest.mark.parametrize("autocast", [False, True])
def test_fused_projections_equal_separate_matmuls(monkeypatch, pattern, autocast):
    """q/k/v and w1/w3 as one matmul each (model.fused_linear) against one matmul per layer: logits, loss and every
    gradient, fp32 to rounding, bf16 autocast within bf16's. Catches fused_linear stacking or splitting wrongly;
    the order in which Attention and SwiGLU take its pieces is held by references that call wq, wk, wv, w1 and w3
    one by one (test_gqa_expands_kv_heads_in_groups_like_repeat_interleave, test_moe_with_one_expert_top1_...)."""
    import model as model_module

    cfg = small(layer_pattern=pattern, n_head=4, n_kv_head=2 if not pattern else 4)
    fused, separate = make(cfg), make(cfg)
    x = ids((3, 16))
    got = loss_and_grads(fused, x, autocast)
    monkeypatch.setattr(model_module, "fused_linear", separate_linears)
    want = loss_and_grads(separate, x, autocast)
    tol = dict(rtol=2e-2, atol=2e-2) if autocast else dict(rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got[0], want[0], **tol)
    torch.testing.assert_close(got[1], want[1], **tol)
    assert got[2].keys() == want[2].keys()
    for name in want[2]:
        torch.testing.assert_close(got[2][name], want[2][name], **tol, msg=name)


def test_the_residual_stream_and_the_norms_stay_bf16_under_bf16_autocast():
    """Under bf16 autocast every activation between matmuls is bf16: the embedding's output (the residual stream at
    each block and at the final norm) and every RMSNorm's output (an fp32 stream, or an fp32 gain, would make
    autocast cast each matmul's input again: fp32 bytes through every elementwise kernel). In fp32 all stays fp32."""
    for autocast, dtype in ((True, torch.bfloat16), (False, torch.float32)):
        model = make(small(qk_norm=True))
        seen = []
        for module in model.modules():
            if isinstance(module, (RMSNorm, model.blocks[0].__class__)):
                module.register_forward_hook(
                    lambda m, args, out: seen.append((type(m).__name__, args[0].dtype, out.dtype))
                )
        with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
            logits, loss = model(ids((2, 16)), ids((2, 16)))
        assert (
            len(seen) == 2 * (2 + 2) + 2 + 1
        )  # per block: 2 norms, 2 QK-norms, the block; the final norm
        assert set(seen) == {("RMSNorm", dtype, dtype), ("Block", dtype, dtype)}, set(seen)
        assert logits.dtype == dtype and loss.dtype == torch.float32


def test_rmsnorm_takes_the_mean_square_in_fp32_and_returns_the_input_dtype():
    """bf16 in, bf16 out, with the mean square of the fp32 values: equal to the fp32 formula's, rounded, to the
    bit (squares and their mean rounded to bf16's 8 bits of mantissa change 44% of these 4,096 outputs)."""
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(512)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(512, generator=gen) + 0.5)
    x = (3 * torch.randn(8, 512, generator=gen)).to(torch.bfloat16)
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-5)).to(torch.bfloat16)
    want = normed * norm.weight.to(torch.bfloat16)
    got = norm(x)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got, want, rtol=0, atol=0)
