"""Scaling laws: plan a pretraining run before touching a GPU, then fit the laws to your own runs.

A 1,000-GPU run is planned on paper first. This file is that paper, in the order of the lecture.

1. Compute. Training costs C ≈ 6·N·D FLOPs (N parameters, D tokens): a forward pass is one multiply
   and one add per parameter per token (2 FLOPs), the backward pass twice that (4 FLOPs).
2. The worked budget. C = 1.2e20 FLOPs and Chinchilla's D ≈ 20·N give C = 120·N², so N = sqrt(C/120)
   = 1e9 and D = 2e10 tokens: 40,000 steps of 5e5 tokens, 6e5 s ≈ 167 hours on a GPU that really
   does 2e14 FLOP/s, ≈ 21 hours on 8. Same rule: 1e18 -> N ≈ 9.1e7; 1.2e21 -> N ≈ 3.2e9.
3. The Chinchilla law (Hoffmann et al. 2022, Approach 3): L(N, D) = E + A / N^α + B / D^β with
   E = 1.69, A = 406.4, B = 410.7, α = 0.34, β = 0.28. Along 6·N·D = 1.2e20 it is a U (2.75, 2.62,
   2.58, 2.64, 2.87 at N = 1e8 .. 1e10); its bottom, in closed form N_opt = G·(C/6)^(β/(α+β)), is
   N ≈ 7e8 at about 40 tokens per parameter. Besiroglu et al. (2024) refitted it: E = 1.8172,
   A = 482.01, B = 2085.43, α = 0.3478, β = 0.3658 (N and D grow at nearly equal rates).
4. Kaplan et al. (2020): L ∝ N^-0.076, D^-0.095, C^-0.050, and a model grown as C^0.73. Real
   models against 20:1: GPT-3 1.7 (under-trained), Chinchilla 20, Llama 3 8B 1,875 (over-trained on
   purpose: a smaller model is cheaper to serve).
5. Memory. Mixed-precision AdamW keeps 16 bytes per parameter (2 + 2 + 12): 7e9 parameters = 112 GB;
   ZeRO stages 1 / 2 / 3 on 8 GPUs leave 38.5 / 26.25 / 14 GB each. A pipeline of p stages fed m
   micro-batches idles (p-1)/(m+p-1) of the time: p=4, m=16 -> 16%.
6. Fitting your own runs, the three approaches of Hoffmann et al.: 1 the lowest loss at each
   compute, 2 a parabola in log N per IsoFLOP budget, 3 the whole law by a Huber loss on log L.

docs/scaling.md works every number at length; the sweep that does 6 on real runs trained through
train.py (`python scaling.py sweep`) is machinery/sweep.py, measured in docs/scaling-sweep.md.

Depends on numpy and the standard library; torch only for the Approach 3 fit (L-BFGS). The counts of
parameters and FLOPs read a GPT config's fields without importing its file.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple, Sequence

import numpy as np


class ScalingError(ValueError):
    """A bad input, reported as one line (exit code 2 from the CLI)."""


_LOG_FLOAT_MAX = math.log(np.finfo(float).max) - 1  # ≈ 708.8: e^this still fits in a float64


def positive(name: str, value) -> float:
    """Return value as a finite float > 0, else raise ScalingError naming the argument.

    >>> positive("budget", "1.2e20")
    1.2e+20
    """
    try:
        # true is not 1 parameter; 10**400, an int JSON allows, overflows float
        x = math.nan if isinstance(value, bool) else float(value)
    except (TypeError, ValueError, OverflowError):
        raise ScalingError(
            f"{name} must be a positive number like 1.2e20, got {value!r:.40}"
        ) from None
    if not math.isfinite(x) or x <= 0:
        raise ScalingError(f"{name} must be a positive finite number, got {value!r}")
    return x


def unit_fraction(name: str, value) -> float:
    """A number in (0, 1], e.g. the model FLOPs utilisation (MFU)."""
    x = positive(name, value)
    if x > 1:
        raise ScalingError(
            f"{name} must be in (0, 1] (a fraction of peak, e.g. 0.4), got {value!r}"
        )
    return x


# --------------------------------------------------------------------------------------------------
# 1. Hardware: the peaks a budget divides by.
# --------------------------------------------------------------------------------------------------


class GPU(NamedTuple):
    name: str
    bf16_flops: float  # dense bf16 tensor-core peak, FLOP/s (no 2:4 sparsity)
    memory_gb: float  # HBM capacity, GB


# NVIDIA datasheet peaks for the SXM parts. Real training reaches 35-45% of this on big clusters
# (the MFU).
GPUS = {
    "A100": GPU("A100 SXM 80GB", 312e12, 80),
    "H100": GPU("H100 SXM", 989e12, 80),
    "H200": GPU("H200 SXM", 989e12, 141),  # same compute die as the H100, more and faster memory
}

# the lecture's "a GPU really does 2e14 FLOP/s" (an A100 at 64%, an H100 at 20%)
LECTURE_ACHIEVED_FLOPS = 2e14


def training_flops(n_params: float, n_tokens: float) -> float:
    """C ≈ 6·N·D: 2 FLOPs per parameter per token forward, 4 backward.

    >>> training_flops(1e9, 2e10)
    1.2e+20
    """
    return 6.0 * positive("parameters", n_params) * positive("tokens", n_tokens)


# N and the FLOPs per token of this project's GPT (model.GPTConfig), from its shapes alone: no model
# needs to be built, so a 70B run is planned with these as cheaply as the 124m preset. Kaplan's N is
# the non-embedding count; C ≈ 6·N·D above takes the matmul parameters, these count them exactly.


def count_params(config, non_embedding: bool = False, active: bool = False) -> int:
    """Parameters of a model.GPTConfig (GPT.num_params counts the same on the built tensors).
    non_embedding: without the embedding and an untied head (Kaplan's N); active: the top-k
    experts only (MoE compute).

    >>> from model import GPTConfig
    >>> count_params(GPTConfig(vocab_size=100, n_layer=1, n_head=2, n_kv_head=2, n_embd=8,
    ...                        ffn_hidden=16))
    1464
    """
    C, H, L = config.n_embd, config.ffn_dim, config.n_layer
    q_width = config.n_head * config.head_dim
    kv_width = config.n_kv_head * config.head_dim
    attention = C * q_width + 2 * C * kv_width + q_width * C
    if config.qk_norm:
        attention += 2 * config.head_dim  # q's and k's gains, shared by the heads
    if config.n_expert:
        experts = config.expert_top_k if active else config.n_expert
        ffn = experts * 3 * C * H + C * config.n_expert  # experts + router
    else:
        ffn = 3 * C * H
    n_linear = config.layer_kinds.count("L")
    # wq, wk, wv, wo + the gate wg and its bias
    linear = 4 * C * q_width + C * config.n_head + config.n_head
    # + the two norm gains
    blocks = (L - n_linear) * attention + n_linear * linear + L * (ffn + 2 * C)
    total = blocks + C  # + final norm
    if not non_embedding:
        total += config.vocab_size * C * (1 if config.tie_embeddings else 2)
    return total


def count_flops_per_token(config, seq_len: int | None = None) -> int:
    """Training FLOPs (forward + backward) per token of a model.GPTConfig: 6 * matmul parameters
    + 12 * L * T * C_q.

    The matmul parameters are the active non-embedding ones plus the LM head (V*C, a matmul whether
    tied or not); the embedding lookup is not a matmul. The attention term counts q.k and p.v for
    all T keys (PaLM's convention; a causal kernel skips about half of it). A linear layer has no T
    term: its state costs q S and k^T v, 2 x 2 C_q d a token forward, 12 C_q d with the backward.
    """
    T = config.block_size if seq_len is None else seq_len
    matmul_params = count_params(config, non_embedding=True, active=True)
    matmul_params += config.vocab_size * config.n_embd  # the LM head
    kinds, q_width = config.layer_kinds, config.n_head * config.head_dim
    attention = 12 * q_width * (kinds.count("A") * T + kinds.count("L") * config.head_dim)
    return 6 * matmul_params + attention


def count_decode_state_bytes(config, context: int, batch: int = 1, bytes_per_value: int = 2) -> int:
    """What generation keeps per sequence batch at `context` tokens: the KV cache of the attention
    layers (2 * n_kv_head * head_dim per token, growing) plus the recurrent state of the linear
    layers (n_head * head_dim^2, fixed). bf16 by default. In KiB at 128K tokens:

    >>> from model import GPTConfig
    >>> configs = [GPTConfig(layer_pattern=pattern) for pattern in ("A", "L", "LLLA")]
    >>> [count_decode_state_bytes(config, 2**17) >> 10 for config in configs]
    [262144, 32, 65560]
    """
    kinds, d = config.layer_kinds, config.head_dim
    growing = kinds.count("A") * 2 * config.n_kv_head * d * context  # the KV cache
    fixed = kinds.count("L") * config.n_head * d * d  # the linear layers' states
    return (growing + fixed) * batch * bytes_per_value


# --------------------------------------------------------------------------------------------------
# 2. The budget: from FLOPs to N, D, steps and GPU time.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Budget:
    """A planned run. Times are in seconds; `seconds` is wall time on `gpus` GPUs at `mfu` of
    `flops_per_gpu`."""

    compute: float
    tokens_per_param: float
    params: float
    tokens: float
    tokens_per_step: float
    steps: float
    flops_per_gpu: float
    mfu: float
    gpus: int
    seconds_one_gpu: float
    seconds: float

    @property
    def achieved_flops(self) -> float:
        return self.flops_per_gpu * self.mfu

    @property
    def gpu_hours(self) -> float:
        return self.seconds_one_gpu / 3600


def params_for_budget(compute: float, tokens_per_param: float = 20.0) -> float:
    """N from C = 6·N·(r·N) = 6r·N², i.e. N = sqrt(C / 6r).

    >>> params_for_budget(1.2e20)      # sqrt(1.2e20 / 120) = sqrt(1e18)
    1000000000.0
    """
    c = positive("compute budget", compute)
    r = positive("tokens per parameter", tokens_per_param)
    return math.sqrt(c / (6.0 * r))


def plan_budget(
    compute: float,
    tokens_per_param: float = 20.0,
    tokens_per_step: float = 5e5,
    flops_per_gpu: float = LECTURE_ACHIEVED_FLOPS,
    mfu: float = 1.0,
    gpus: int = 8,
) -> Budget:
    """The lecture's planning chain for one budget.

    >>> b = plan_budget(1.2e20)
    >>> b.params, b.tokens, b.steps, round(b.seconds_one_gpu / 3600), round(b.seconds / 3600)
    (1000000000.0, 20000000000.0, 40000.0, 167, 21)
    """
    c = positive("compute budget", compute)
    n = params_for_budget(c, tokens_per_param)
    d = tokens_per_param * n
    # the arithmetic still works, but on fractions of a parameter or of a token
    if n < 1 or d < 1:
        raise ScalingError(
            f"C = {c:.3g} FLOPs at {tokens_per_param:g} tokens per parameter gives N = {n:.3g} "
            f"parameters and D = {d:.3g} tokens, less than one: raise the budget or move "
            f"tokens_per_param toward 20"
        )
    per_step = positive("tokens per step", tokens_per_step)
    if per_step > d:
        raise ScalingError(
            f"one step of {per_step:.3g} tokens is more than the whole run's D = {d:.3g} tokens: "
            f"lower tokens_per_step or raise the budget"
        )
    flops = positive("FLOP/s per GPU", flops_per_gpu)
    u = unit_fraction("MFU", mfu)
    g = int(positive("number of GPUs", gpus))
    one_gpu = c / (flops * u)
    return Budget(
        c, tokens_per_param, n, d, per_step, d / per_step, flops, u, g, one_gpu, one_gpu / g
    )


# --------------------------------------------------------------------------------------------------
# 3. The Chinchilla law, its compute-optimal allocation and the IsoFLOP table.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ChinchillaFit:
    """L(N, D) = E + A / N^alpha + B / D^beta (loss in nats per token)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    source: str = ""

    def loss(self, n, d):
        """Works on floats and numpy arrays alike."""
        n = np.asarray(n, dtype=float)
        d = np.asarray(d, dtype=float)
        out = self.E + self.A / n**self.alpha + self.B / d**self.beta
        return float(out) if out.ndim == 0 else out

    @property
    def a(self) -> float:
        """N_opt ∝ C^a with a = β / (α + β)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """D_opt ∝ C^b with b = α / (α + β)."""
        return self.alpha / (self.alpha + self.beta)

    def optimal_params(self, compute):
        """Closed form: N_opt = G·(C/6)^a with G = (αA / βB)^(1/(α+β))."""
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))
        return g * (np.asarray(compute, dtype=float) / 6.0) ** self.a


FITS = {
    # Hoffmann et al. 2022, eq. (10), the rounded constants printed in the paper (and in the
    # lecture).
    "hoffmann": ChinchillaFit(1.69, 406.4, 410.7, 0.34, 0.28, "Hoffmann et al. 2022, Approach 3"),
    # Besiroglu, Erdil, Barnett, You 2024, "Chinchilla Scaling: A replication attempt"
    # (arXiv:2404.10102), refit to 240 runs read off Hoffmann's Figure 4 (standard errors 0.03,
    # 124.58, 1293.23, 0.02, 0.02).
    "besiroglu": ChinchillaFit(
        1.8172, 482.01, 2085.43, 0.3478, 0.3658, "Besiroglu et al. 2024 replication"
    ),
}


def _get_fit(fit) -> ChinchillaFit:
    if isinstance(fit, ChinchillaFit):
        return fit
    if fit not in FITS:
        raise ScalingError(
            f"unknown fit {fit!r}: choose one of {', '.join(FITS)} (or pass a ChinchillaFit)"
        )
    return FITS[fit]


def chinchilla_loss(N, D, fit="hoffmann"):
    """Predicted loss of a model with N parameters trained on D tokens.

    1.69 + 406.4/10^(9·0.34) + 410.7/(2e10)^0.28 = 1.69 + 0.354 + 0.536:
    >>> round(chinchilla_loss(1e9, 2e10), 2)
    2.58
    """
    n = np.asarray(N, dtype=float)
    d = np.asarray(D, dtype=float)
    if not (np.all(np.isfinite(n)) and np.all(n > 0) and np.all(np.isfinite(d)) and np.all(d > 0)):
        raise ScalingError("parameters and tokens must be positive finite numbers")
    return _get_fit(fit).loss(n, d)


class Allocation(NamedTuple):
    """How to spend a compute budget: N parameters, D tokens, and the loss the law predicts for
    them."""

    compute: float
    params: float
    tokens: float
    loss: float

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.params


def compute_optimal(C, tokens_per_param=None, fit="hoffmann") -> Allocation:
    """Split C between N and D.

    tokens_per_param=None minimises the fitted law (closed form); a number r fixes D = r·N (N =
    sqrt(C / 6r)).

    >>> a = compute_optimal(1.2e20); f"{a.params:.1e} {a.tokens_per_param:.0f} {a.loss:.2f}"
    '7.0e+08 41 2.57'
    >>> compute_optimal(1.2e20, tokens_per_param=20).params
    1000000000.0
    """
    c = positive("compute budget", C)
    law = _get_fit(fit)
    if tokens_per_param is None:
        return _on_isoflop(c, float(law.optimal_params(c)), law)
    return _on_isoflop(c, params_for_budget(c, tokens_per_param), law)


def _on_isoflop(c: float, n: float, law: ChinchillaFit) -> Allocation:
    """N parameters on the IsoFLOP line 6·N·D = C: D = C / 6N, and the loss the law predicts
    there."""
    d = c / (6.0 * n)
    return Allocation(c, n, d, law.loss(n, d))


LECTURE_SIZES = (1e8, 2.5e8, 1e9, 2.5e9, 1e10)


def isoflop_table(C, sizes: Sequence[float] = LECTURE_SIZES, fit="hoffmann") -> list[Allocation]:
    """One row per model size N on the IsoFLOP line 6·N·D = C: D = C/(6N) and the predicted loss.

    >>> [round(r.loss, 2) for r in isoflop_table(1.2e20)]
    [2.75, 2.62, 2.58, 2.64, 2.87]
    """
    c = positive("compute budget", C)
    law = _get_fit(fit)
    return [_on_isoflop(c, positive("model size", n), law) for n in sizes]


# --------------------------------------------------------------------------------------------------
# 4. Kaplan et al. 2020: three separate power laws and a model that grows as C^0.73.
# --------------------------------------------------------------------------------------------------

PF_DAY = 1e15 * 86400  # 8.64e19 FLOPs, Kaplan's unit of compute

# Kaplan et al. 2020, Table 5 / eqs. (1.1)-(1.3), (6.1): WebText2, their BPE, non-embedding
# parameters, loss in nats.
KAPLAN = {
    "alpha_N": 0.076,
    "N_c": 8.8e13,
    "alpha_D": 0.095,
    "D_c": 5.4e13,
    "alpha_C": 0.050,
    "C_c_pf_days": 3.1e8,
    "N_opt_coef": 1.3e9,
    "N_opt_exp": 0.73,
}


def kaplan_loss_params(n_nonembedding):
    """L(N) = (N_c / N)^0.076: a converged model of N non-embedding parameters (data unlimited)."""
    return (KAPLAN["N_c"] / np.asarray(n_nonembedding, dtype=float)) ** KAPLAN["alpha_N"]


def kaplan_loss_data(tokens):
    """L(D) = (D_c / D)^0.095: a large model trained on D tokens with early stopping."""
    return (KAPLAN["D_c"] / np.asarray(tokens, dtype=float)) ** KAPLAN["alpha_D"]


def kaplan_loss_compute(flops):
    """L(C_min) = (C_c / C_min)^0.050 with C in PF-days, along the compute-efficient frontier."""
    return (KAPLAN["C_c_pf_days"] / (np.asarray(flops, dtype=float) / PF_DAY)) ** KAPLAN["alpha_C"]


def kaplan_optimal_params(flops):
    """N_opt = 1.3e9 · (C / PF-day)^0.73 non-embedding parameters.

    >>> f"{kaplan_optimal_params(PF_DAY):.2g}"
    '1.3e+09'
    """
    return KAPLAN["N_opt_coef"] * (np.asarray(flops, dtype=float) / PF_DAY) ** KAPLAN["N_opt_exp"]


# --------------------------------------------------------------------------------------------------
# 5. Tokens per parameter: real models against Chinchilla's 20:1.
# --------------------------------------------------------------------------------------------------

# (name, parameters, training tokens) as published.
REAL_MODELS = (
    ("GPT-3 175B (2020)", 175e9, 300e9),
    ("Gopher 280B (2021)", 280e9, 300e9),
    ("Chinchilla 70B (2022)", 70e9, 1.4e12),
    ("Llama 2 70B (2023)", 70e9, 2e12),
    ("Llama 3 8B (2024)", 8e9, 15e12),
)


def tokens_per_param_verdict(params: float, tokens: float) -> str:
    """Read D/N against Chinchilla's 20:1.

    >>> tokens_per_param_verdict(175e9, 300e9)
    'under-trained (1.7:1, far below 20:1)'
    >>> tokens_per_param_verdict(8e9, 15e12)
    'inference-optimal: over-trained on purpose (1875:1)'
    """
    r = positive("tokens", tokens) / positive("parameters", params)
    if r < 10:
        return f"under-trained ({r:.2g}:1, far below 20:1)"
    if r <= 50:
        return f"compute-optimal range ({r:.0f}:1, near 20:1)"
    return f"inference-optimal: over-trained on purpose ({r:.0f}:1)"


# --------------------------------------------------------------------------------------------------
# 6. Memory per GPU (ZeRO stages, activations) and the pipeline bubble.
# --------------------------------------------------------------------------------------------------


class Memory(NamedTuple):
    """Bytes of training state held by one GPU."""

    weights: float
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.weights + self.grads + self.optimizer


def training_memory(
    N, world_size=1, zero_stage=0, weight_bytes=2, grad_bytes=2, optimizer_bytes=12
) -> Memory:
    """Per-GPU bytes for mixed-precision AdamW: bf16 weights (2) + bf16 grads (2) + fp32 master and
    moments (12).

    ZeRO-1 shards the optimizer state over the world, ZeRO-2 also the gradients, ZeRO-3 also the
    weights.

    >>> [round(training_memory(7e9, 8, s).total / 1e9, 2) for s in (0, 1, 2, 3)]
    [112.0, 38.5, 26.25, 14.0]

    This project's code holds the same 16 bytes split as 4 + 4 + 8: train.py keeps fp32 weights and
    gradients (autocast casts to bf16 per matmul, transiently), and parallel.py's ZeRO-3 in bf16
    keeps fp32 master shards and fp32 shard gradients, gathering one unit at a time in bf16. So
    `training_memory(N, w, s, 4, 4, 8)` is what it holds between steps (tests/test_parallel.py
    measures it), and bench/bench_gpu.py compares it with a GPU.
    >>> training_memory(124e6, 8, 3, 4, 4, 8).total == training_memory(124e6, 8, 3).total
    True
    """
    n = positive("parameters", N)
    w = int(positive("world size", world_size))
    if zero_stage not in (0, 1, 2, 3):
        raise ScalingError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero_stage!r}")
    return Memory(
        weight_bytes * n / (w if zero_stage >= 3 else 1),
        grad_bytes * n / (w if zero_stage >= 2 else 1),
        optimizer_bytes * n / (w if zero_stage >= 1 else 1),
    )


def activation_memory(
    n_layer: int,
    d_model: int,
    n_head: int,
    seq_len: int,
    micro_batch: int,
    checkpointing: bool = False,
    flash_attention: bool = True,
) -> float:
    """Bytes of saved activations per GPU for one micro-batch (16-bit activations, no tensor
    parallelism).

    Korthikanti et al. 2022 count s·b·h·(34 + 5·a·s/h) bytes per layer: 34·s·b·h for the matmul
    inputs, norms, GELU and dropout masks, 5·a·s²·b for the attention scores, their softmax and
    dropout mask (gone with flash attention, which recomputes them). With full activation
    checkpointing only each layer's input (2·s·b·h bytes) is kept, plus one layer's full set while
    it is recomputed; the price is one extra forward (+33% compute).

    >>> round(activation_memory(24, 2048, 16, 1024, 8) / 1e9, 1)
    13.7
    >>> round(activation_memory(24, 2048, 16, 1024, 8, checkpointing=True) / 1e9, 2)
    1.38
    """
    s, b, h, a, layers = seq_len, micro_batch, d_model, n_head, n_layer
    for name, v in (
        ("n_layer", layers),
        ("d_model", h),
        ("n_head", a),
        ("seq_len", s),
        ("micro_batch", b),
    ):
        positive(name, v)
    per_layer = s * b * h * (34 + (0 if flash_attention else 5 * a * s / h))
    if checkpointing:
        return layers * 2 * s * b * h + per_layer
    return layers * per_layer


def pipeline_bubble(p, m) -> float:
    """Idle fraction of a p-stage pipeline fed m micro-batches (GPipe and 1F1B alike):
    (p-1)/(m+p-1).

    >>> round(pipeline_bubble(4, 16), 3)   # 3/19
    0.158
    """
    stages, micro = positive("pipeline stages", p), positive("micro-batches", m)
    for name, x in (("pipeline stages", stages), ("micro-batches", micro)):
        if x != int(x):
            raise ScalingError(f"{name} must be a whole number >= 1, got {x:g}")
    return (stages - 1) / (micro + stages - 1)


# --------------------------------------------------------------------------------------------------
# 7. Fitting laws to runs: the three approaches of Hoffmann et al. 2022.
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Run:
    """One measured point: a model of `params` parameters after `tokens` tokens (compute = 6·N·D)
    had `loss`.

    `budget` groups IsoFLOP runs (the compute they were planned for); `series` names the training
    run a checkpoint belongs to (a loss curve)."""

    params: float
    tokens: float
    loss: float
    budget: float
    series: str = ""

    @property
    def compute(self) -> float:
        return 6.0 * self.params * self.tokens


def mean_over_seeds(runs: Sequence[Run]) -> list[Run]:
    """Runs of the same N, D and budget (one point trained again with another seed) as one run at
    their mean loss, in first-seen order: a point measured twice is measured better, not counted
    twice by a fit.

    >>> runs = [Run(1e5, 2e6, 2.5, 1e12), Run(2e5, 1e6, 2.9, 1e12), Run(1e5, 2e6, 3.5, 1e12)]
    >>> [r.loss for r in mean_over_seeds(runs)]
    [3.0, 2.9]
    """
    groups: dict[tuple, list[Run]] = {}
    for r in runs:
        groups.setdefault((r.params, r.tokens, r.budget), []).append(r)
    return [
        dataclasses.replace(g[0], loss=sum(r.loss for r in g) / len(g)) if len(g) > 1 else g[0]
        for g in groups.values()
    ]


class AllocationLaw(NamedTuple):
    """N_opt(C) = coef · C^a and D_opt(C) = C / (6·N_opt) ∝ C^(1-a): what each approach
    estimates."""

    a: float
    coef: float

    @property
    def b(self) -> float:
        return 1.0 - self.a

    def params_at(self, compute):
        return self.coef * np.asarray(compute, dtype=float) ** self.a

    def tokens_at(self, compute):
        c = np.asarray(compute, dtype=float)
        return c / (6.0 * self.params_at(c))


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares slope and intercept of y = slope·x + intercept."""
    slope, intercept = np.polyfit(x, y, 1)
    return float(slope), float(intercept)


def _allocation_line(computes, params, approach: str) -> AllocationLaw:
    """Fit log N = a·log C + k. Optima at nearly equal computes can give a slope of thousands and a
    coefficient e^k beyond any float: that is no law, and is reported as one line instead of an
    OverflowError.

    >>> round(_allocation_line([1e18, 1e20], [1e8, 1e9], "Approach 1").a, 6)
    0.5
    """
    a, k = fit_line(np.log(computes), np.log(params))
    if not (math.isfinite(a) and abs(k) < _LOG_FLOAT_MAX):
        raise ScalingError(
            f"{approach}: the optima give N_opt ∝ C^{a:.3g}, a line no float can hold: their "
            "computes "
            f"({min(computes):.3g}-{max(computes):.3g}) are too close together; spread the budgets"
        )
    return AllocationLaw(a, math.exp(k))


def group_close(runs: Sequence[Run], key, rel: float = 0.01) -> dict[float, list[Run]]:
    """Group runs whose key (a compute) agrees within `rel` (float round-off makes 6·N·(C/6N) differ
    from C)."""
    groups: dict[float, list[Run]] = {}
    for r in sorted(runs, key=key):
        last = next(reversed(groups), None)
        if last is not None and abs(math.log(key(r) / last)) < rel:
            groups[last].append(r)
        else:
            groups[key(r)] = [r]
    return groups


def frontier(runs: Sequence[Run]) -> list[Run]:
    """The lowest loss at each compute (Approach 1): walking up in compute, keep a run when it beats
    every run that used less compute. Runs at the same compute compete first; only the best of them
    can enter.

    >>> rs = [Run(1, 1, 3.0, 6), Run(2, 1, 2.5, 12), Run(1, 3, 2.8, 18), Run(2, 2, 2.0, 24)]
    >>> [r.loss for r in frontier(rs)]
    [3.0, 2.5, 2.0]
    """
    best_so_far = math.inf
    out = []
    for group in group_close(runs, key=lambda r: r.compute).values():
        champion = min(group, key=lambda r: r.loss)
        if champion.loss < best_so_far:
            out.append(champion)
            best_so_far = champion.loss
    return out


def fit_approach1(runs: Sequence[Run]) -> AllocationLaw:
    """Approach 1: fit log N = a·log C + k through the frontier runs (the lowest loss at each
    compute)."""
    front = frontier(runs)
    if len({r.params for r in front}) < 2:
        raise ScalingError(
            f"Approach 1 needs a frontier that crosses at least 2 model sizes (got "
            f"{len({r.params for r in front})} from {len(runs)} runs): add sizes or longer runs"
        )
    return _allocation_line([r.compute for r in front], [r.params for r in front], "Approach 1")


def isoflop_minima(runs: Sequence[Run]) -> list[tuple[float, float, np.ndarray]]:
    """Approach 2, step 1: per IsoFLOP budget with ≥ 3 sizes, fit loss = c0 + c1·x + c2·x² (x = ln
    N) and take the vertex N* = exp(-c1 / 2c2). Returns [(budget, N*, coefficients)]; a budget whose
    parabola opens downwards, or whose vertex lies outside the sizes tried (an extrapolation), is
    skipped."""
    out = []
    for budget, group in group_close(runs, key=lambda r: r.budget).items():
        if len({r.params for r in group}) < 3:
            continue
        x = np.log([r.params for r in group])
        c2, c1, c0 = np.polyfit(x, [r.loss for r in group], 2)
        vertex = -c1 / (2 * c2) if c2 > 0 else math.nan
        if not x.min() <= vertex <= x.max():  # no U, or its bottom outside the sizes tried
            continue
        out.append((budget, math.exp(vertex), np.array([c2, c1, c0])))
    return out


def fit_approach2(runs: Sequence[Run]) -> AllocationLaw:
    """Approach 2: IsoFLOP parabola minima N*(C), then log N* = a·log C + k."""
    if not runs:
        raise ScalingError(
            "Approach 2 needs IsoFLOP runs (one compute, 3+ sizes); there are none (in a sweep: "
            "the curves of 3+ sizes never reach the same compute)"
        )
    minima = isoflop_minima(runs)
    if len(minima) < 2:
        raise ScalingError(
            f"Approach 2 needs at least 2 compute budgets with 3+ model sizes each and a U-shaped "
            f"loss with its minimum inside the sizes tried (got {len(minima)} usable of "
            f"{len(group_close(runs, key=lambda r: r.budget))} budgets)"
        )
    return _allocation_line([m[0] for m in minima], [m[1] for m in minima], "Approach 2")


# The grid of starting points Hoffmann et al. used (Appendix D.2): α, β ∈ {0, .5, .., 2},
# e ∈ {-1, -.5, .., 1}, a, b ∈ {0, 5, .., 25}, where A = e^a, B = e^b, E = e^e: 5·5·5·6·6 = 4,500
# starts.
GRID = (
    np.array(
        np.meshgrid(
            np.arange(0, 26, 5.0),
            np.arange(0, 26, 5.0),
            np.arange(-1, 1.01, 0.5),
            np.arange(0, 2.01, 0.5),
            np.arange(0, 2.01, 0.5),
            indexing="ij",
        )
    )
    .reshape(5, -1)
    .T
)


def _huber(r, delta):
    """Quadratic inside ±delta, linear outside: robust to outlier runs."""
    a = np.abs(r)
    return np.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta))


def _log_law(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray) -> np.ndarray:
    """log L = logsumexp(a - α·log N, b - β·log D, e) for theta rows (a, b, e, α, β); shape (S,
    runs)."""
    a, b, e, alpha, beta = (theta[:, i : i + 1] for i in range(5))
    terms = np.stack(
        [a - alpha * log_n, b - beta * log_d, np.broadcast_to(e, (len(theta), len(log_n)))]
    )
    top = terms.max(axis=0)
    return top + np.log(np.exp(terms - top).sum(axis=0))


def _minimise_from(start: np.ndarray, objective) -> tuple[float, np.ndarray]:
    """Run torch's L-BFGS in float64 from one start to convergence: (objective, theta) there."""
    import torch  # only the Approach 3 fit needs it

    theta = torch.tensor(start, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS(
        [theta],
        lr=1.0,
        max_iter=500,
        tolerance_grad=1e-12,
        tolerance_change=1e-14,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure():
        opt.zero_grad()
        value = objective(theta)
        value.backward()
        return value

    opt.step(closure)
    with torch.no_grad():
        value = float(objective(theta))
    return value, theta.detach().numpy().copy()


def fit_approach3(
    runs: Sequence[Run], delta: float = 1e-3, refine: int = 16, starts: np.ndarray | None = None
) -> ChinchillaFit:
    """Approach 3: minimise Σ Huber_δ(log L̂(N, D) - log L) over (a, b, e, α, β) with L-BFGS.

    Every grid start is scored at once (numpy); the `refine` best, plus any extra `starts`, are run
    to convergence with torch's L-BFGS in float64, and the lowest objective wins. The sum (not the
    mean) keeps the objective's scale, which Besiroglu et al. found made the original optimiser stop
    early.
    """
    if len(runs) < 5:
        raise ScalingError(
            f"Approach 3 fits 5 parameters (E, A, B, alpha, beta): give at least 5 runs, "
            f"got {len(runs)}"
        )
    if len({r.params for r in runs}) < 2 or len({r.tokens for r in runs}) < 2:
        raise ScalingError(
            "Approach 3 needs runs with at least 2 different sizes and 2 different token counts"
        )
    import torch  # only this fit needs it

    log_n = np.log([r.params for r in runs])
    log_d = np.log([r.tokens for r in runs])
    log_l = np.log([r.loss for r in runs])
    scores = _huber(_log_law(GRID, log_n, log_d) - log_l, delta).sum(axis=1)
    candidates = GRID[np.argsort(scores, kind="stable")[:refine]]
    if starts is not None:
        candidates = np.vstack([np.atleast_2d(starts), candidates])

    tn, td, tl = (torch.tensor(v, dtype=torch.float64) for v in (log_n, log_d, log_l))

    def objective(theta):
        a, b, e, alpha, beta = theta
        pred = torch.logsumexp(torch.stack([a - alpha * tn, b - beta * td, e.expand_as(tn)]), dim=0)
        return torch.nn.functional.huber_loss(pred, tl, reduction="sum", delta=delta)

    best_value, best_theta = math.inf, None
    for start in candidates:
        value, found = _minimise_from(start, objective)
        # A start can run off to A, B or E = e^800: a perfect fit of a too-narrow range of N or D
        # that no float can hold. Such a law predicts nothing outside the runs, so it does not
        # compete.
        finite = np.all(np.abs(found[:3]) < _LOG_FLOAT_MAX)
        if math.isfinite(value) and value < best_value and finite:
            best_value, best_theta = value, found
    if best_theta is None:
        raise ScalingError(
            f"Approach 3 found no law with finite constants for these {len(runs)} runs (E, A or B "
            f"beyond 1e300): they span too little of N ({min(np.exp(log_n)):.3g}-"
            f"{max(np.exp(log_n)):.3g}) or D ({min(np.exp(log_d)):.3g}-{max(np.exp(log_d)):.3g}) "
            f"to pin five constants; add sizes or longer runs"
        )
    a, b, e, alpha, beta = best_theta
    return ChinchillaFit(
        math.exp(e), math.exp(a), math.exp(b), float(alpha), float(beta), "Approach 3 fit"
    )


def _law_from_fit(fit: ChinchillaFit) -> AllocationLaw:
    """The allocation a Chinchilla fit implies: N_opt = G·(C/6)^a = (G·6^-a)·C^a."""
    if not (fit.alpha > 0 and fit.beta > 0):
        raise ScalingError(
            f"Approach 3's law has alpha = {fit.alpha:.3g}, beta = {fit.beta:.3g}: the loss does "
            f"not fall with both N and D, so it implies no compute-optimal size"
        )
    return AllocationLaw(fit.a, float(fit.optimal_params(1.0)))


@dataclasses.dataclass
class FitReport:
    """What `fit_all` found: per approach the exponent a (N_opt ∝ C^a), N_opt and D_opt at the
    target compute, and bootstrap intervals (10th-90th percentile, as Hoffmann et al. report)."""

    target: float
    runs: int
    # approach name -> AllocationLaw, or the error message when it could not be fitted
    laws: dict
    chinchilla: ChinchillaFit | None
    intervals: dict  # approach name -> {"a": (lo, hi), "params": (lo, hi), "tokens": (lo, hi)}
    bootstrap: int


def fit_all(
    runs: Sequence[Run],
    target_compute: float,
    bootstrap: int = 100,
    seed: int = 0,
    refine: int = 16,
) -> FitReport:
    """All three approaches on the same runs, each with bootstrap intervals (resample the runs with
    replacement, refit; a resample where an approach cannot be fitted is dropped for that
    approach)."""
    target = positive("target compute", target_compute)
    laws: dict = {}
    chinchilla = None
    fitters = {"approach1": fit_approach1, "approach2": fit_approach2}
    for key, fitter in fitters.items():
        try:
            laws[key] = fitter(runs)
        except ScalingError as e:
            laws[key] = str(e)
    try:
        chinchilla = fit_approach3(runs, refine=refine)
        laws["approach3"] = _law_from_fit(chinchilla)
        # Each resample starts from the full fit's constants: one L-BFGS run instead of `refine`
        # grid starts.
        theta0 = np.array(
            [
                math.log(chinchilla.A),
                math.log(chinchilla.B),
                math.log(chinchilla.E),
                chinchilla.alpha,
                chinchilla.beta,
            ]
        )
        fitters["approach3"] = lambda rs: _law_from_fit(fit_approach3(rs, refine=0, starts=theta0))
    except ScalingError as e:
        laws["approach3"] = str(e)

    rng = np.random.default_rng(seed)
    samples: dict = {k: [] for k, v in laws.items() if not isinstance(v, str)}
    for _ in range(int(bootstrap)):
        resample = [runs[i] for i in rng.integers(0, len(runs), len(runs))]
        for key in samples:
            try:
                law = fitters[key](resample)
            except (ScalingError, np.linalg.LinAlgError, ValueError):
                continue
            samples[key].append((law.a, float(law.params_at(target)), float(law.tokens_at(target))))
    intervals = {}
    for key, rows in samples.items():
        if len(rows) >= 2:
            arr = np.array(rows)
            lo, hi = np.percentile(arr, 10, axis=0), np.percentile(arr, 90, axis=0)
            intervals[key] = {
                "a": (lo[0], hi[0]),
                "params": (lo[1], hi[1]),
                "tokens": (lo[2], hi[2]),
            }
    return FitReport(target, len(runs), laws, chinchilla, intervals, int(bootstrap))


def synthetic_isoflop_runs(
    fit="besiroglu",
    budgets=(1e18, 3e18, 1e19, 3e19, 1e20),
    sizes_per_budget: int = 9,
    noise: float = 0.01,
    seed: int = 0,
) -> list[Run]:
    """IsoFLOP runs drawn from a known law with multiplicative noise: the test a fitter must pass
    before its answers on real runs mean anything. Sizes span 1/8x .. 8x the law's optimum at each
    budget."""
    law = _get_fit(fit)
    rng = np.random.default_rng(seed)
    runs = []
    for c in budgets:
        centre = float(law.optimal_params(c))
        for n in centre * np.logspace(-math.log10(8), math.log10(8), sizes_per_budget):
            d = c / (6 * n)
            loss = law.loss(n, d) * math.exp(noise * rng.standard_normal())
            runs.append(Run(float(n), float(d), loss, float(c)))
    return runs


if __name__ == "__main__":
    from machinery.commands import scaling as command

    raise SystemExit(command.main())
