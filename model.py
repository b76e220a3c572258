"""A modern decoder-only Transformer in one file: RMSNorm, RoPE, SwiGLU, grouped-query attention, optional
Mixture of Experts, a KV cache for generation, and the parameter / FLOP / memory accounting that the rest of
the project plans with.

Depends on: torch only. The Hugging Face bridge alone imports more, inside its functions: safetensors, bpe.py
(the tokenizer files) and train.py (the checkpoint format: its loader for export, its writer for import-hf).

The lesson, in numbers
----------------------
Pretraining maximises log P(x_t | x_<t) at every position. The network that computes P is a stack of L identical
blocks over a residual stream of width C (`n_embd`):

    x = tok_emb[idx]                        # (B, T, C)  no position embedding: position enters through RoPE
    for each block:
        x = x + attn(rmsnorm(x))            # tokens talk to earlier tokens
        x = x + ffn(rmsnorm(x))             # each token thinks on its own
    logits = lm_head(rmsnorm(x))            # (B, T, V)

"The details matter" - each choice below is what Llama-class models settled on, and each has a reason:

* Pre-normalisation with RMSNorm: y = x / sqrt(mean(x^2) + eps) * g. Normalising the *input* of each sub-layer
  leaves the residual path an identity from the loss down to the embeddings, so gradients reach the bottom of a
  deep stack unchanged; RMSNorm drops LayerNorm's mean subtraction and bias (cheaper, works as well).
  Example: x = [3, 4] has mean square 12.5, so RMSNorm gives [3, 4] / 3.536 = [0.849, 1.131].
* Rotary position embeddings (RoPE): rotate each pair of features (x_2i, x_2i+1) of q and k by the angle
  pos * theta^(-2i/d). A rotation keeps lengths, and the dot product of a query rotated by m and a key rotated by
  n depends only on m - n: attention sees relative position, with nothing added to the residual stream.
  Pair 0 turns by 1 radian per position, the last pair of a 64-wide head by 10000^(-62/64) = 1.3e-4 radian:
  fast pairs resolve neighbours, slow pairs carry long-range position.
* Grouped-query attention (GQA): n_head query heads share n_kv_head key/value heads (n_kv_head = n_head is
  plain multi-head attention, 1 is multi-query). The KV cache shrinks by n_head / n_kv_head, which is what
  bounds the batch size at inference time.
* SwiGLU feed-forward: w2(silu(w1 x) * w3 x). Three matrices instead of two, so the hidden width is 8/3 C
  instead of 4 C to keep the parameter count (3 * 8/3 = 2 * 4); rounded up to a multiple for fast matmuls.
* Mixture of Experts (optional): E copies of the FFN, a router picks the top-k per token. Parameters grow by E,
  compute per token by k. DeepSeek-V3 holds 671B parameters but activates 37B per token: it pays the compute of
  the active parameters and the memory of all of them (every expert must sit in memory, because routing is
  decided per token). A load-balancing loss keeps the router from collapsing onto a few experts.

Accounting (the numbers scaling.py and train.py plan with)
----------------------------------------------------------
* Parameters of one dense block: attention C*(C + 2*C_kv + C) with C_kv = n_kv_head * head_dim, FFN 3*C*H,
  two norms 2*C. With MHA and H = 8/3 C that is 12 C^2: the 124m preset (L=12, C=768, V=50304) has
  12 * 12 * 768^2 = 85M block parameters plus 50304 * 768 = 39M embedding parameters = 124M.
* Training FLOPs per token: 6 per matmul parameter (2 forward: one multiply, one add; 4 backward) plus the
  attention scores 12 * L * T * C_q (PaLM's formula), so training costs C = 6ND. MFU = achieved FLOP/s / peak.
* Training memory with AdamW in mixed precision: 16 bytes per parameter (bf16 weights 2 + bf16 grads 2 + fp32
  master 4 + two fp32 moments 4 + 4), so 1e9 parameters need 16 GB before any activation is stored.

Initialisation: every Linear and the embedding draw from N(0, 0.02); the two projections that write into the
residual stream (attn.wo, ffn.w2) use 0.02 / sqrt(2 L), so the variance the 2L residual additions pile up stays
that of a single layer (GPT-2). Norm gains start at 1. With tied embeddings the LM head reuses tok_emb.weight.

Exporting to Hugging Face: the same network, another RoPE layout
-----------------------------------------------------------------
A dense model here is Hugging Face's LlamaForCausalLM up to names (wq/wk/wv/wo = q/k/v/o_proj, w1 = gate_proj,
w3 = up_proj, w2 = down_proj, attn_norm = input_layernorm, ffn_norm = post_attention_layernorm) and one real
difference: which features RoPE rotates together. We rotate adjacent pairs (x_2i, x_2i+1), as RoFormer and
Meta's Llama code do; HF rotates the two halves (x_i, x_i+d/2) (`rotate_half`). With head_dim d = 4, pair 0
turning by angle a and pair 1 by angle b:

    ours: [q0, q1, q2, q3]   rotates (q0, q1) by a and (q2, q3) by b
    HF:   [q0, q2, q1, q3]   rotates its features (0, 2) = (q0, q1) by a and (1, 3) = (q2, q3) by b

So HF's feature j must be our feature [0, 2, 1, 3][j] (the even ones, then the odd ones): permute the output
rows of wq and wk that way inside every head and HF rotates exactly our pairs by exactly our angles. q and k
then hold the same numbers in another order, and q.k, a sum over features, does not care about the order; v
and wo are not rotated and need nothing. Skip the permutation and the export still loads and runs, just wrong:
q0 turns with q2 instead of q1, and the logits drift away from ours. The rest is configuration HF would
otherwise default differently: rms_norm_eps (HF 1e-6, ours 1e-5), rope_theta, tie_word_embeddings (HF False,
ours True); silu is the SwiGLU gate in both. `python model.py export` writes the directory (`export_hf`) and
`python model.py import-hf` reads one back (`load_hf`); tests/test_hf.py checks the logits against
transformers'. A Mixture of Experts is refused: we weigh the top-k experts by their full-softmax probabilities,
Mixtral renormalises them over the k, so no Mixtral config computes our logits.

Run `python model.py` to print every preset with its parameters, FLOPs per token and training memory.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import pathlib
import shutil
import sys
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

# bf16 weights (2) + bf16 grads (2) + fp32 master weights (4) + AdamW first and second moments (4 + 4).
TRAINING_BYTES_PER_PARAM = 16


class ConfigError(ValueError):
    """A model configuration or input that cannot work; the message names the field and the fix."""


# ----------------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class GPTConfig:
    """Shape and options of the model. Validated on creation, so a bad config fails before any tensor exists.

    >>> GPTConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64).head_dim
    16
    >>> GPTConfig(n_embd=128).ffn_dim      # 8/3 * 128 = 341.3, rounded up to a multiple of 64
    384
    """
    vocab_size: int = 4096
    block_size: int = 256             # the longest sequence the model is trained on (and may see)
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 4                # = n_head: multi-head attention; 1: multi-query; in between: GQA
    n_embd: int = 128
    ffn_hidden: int = 0               # 0 = auto: 8/3 * n_embd rounded up to ffn_multiple_of
    ffn_multiple_of: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    dropout: float = 0.0
    n_expert: int = 0                 # 0 = dense FFN; E > 0 = Mixture of Experts with E experts per layer
    expert_top_k: int = 2
    moe_capacity_factor: float = 1.25  # slots per expert = factor * tokens * k / E; 0 = never drop a token
    moe_aux_coef: float = 0.01        # train.py adds moe_aux_coef * model.aux_loss to the loss
    activation_checkpointing: bool = False

    def __post_init__(self):
        def need(ok: bool, field: str, message: str):
            if not ok:
                raise ConfigError(f"GPTConfig.{field}: {message}")

        for field in ("vocab_size", "block_size", "n_layer", "n_head", "n_kv_head", "n_embd", "ffn_multiple_of"):
            value = getattr(self, field)
            need(isinstance(value, int) and not isinstance(value, bool) and value > 0, field,
                 f"must be a positive integer, got {value!r}")
        need(self.n_embd % self.n_head == 0, "n_embd",
             f"{self.n_embd} is not divisible by n_head={self.n_head}; pick n_embd as a multiple of n_head")
        need(self.n_head % self.n_kv_head == 0, "n_kv_head",
             f"n_head={self.n_head} is not divisible by n_kv_head={self.n_kv_head}; "
             f"use a divisor of n_head (n_head for MHA, 1 for MQA)")
        need(self.head_dim % 2 == 0, "n_head",
             f"head size n_embd/n_head = {self.head_dim} is odd, but RoPE rotates pairs of features; "
             f"choose n_embd and n_head so that the head size is even")
        need(isinstance(self.ffn_hidden, int) and self.ffn_hidden >= 0, "ffn_hidden",
             f"must be an integer >= 0 (0 = auto), got {self.ffn_hidden!r}")
        need(self.rope_theta > 0, "rope_theta", f"must be > 0, got {self.rope_theta}")
        need(self.norm_eps > 0, "norm_eps", f"must be > 0, got {self.norm_eps}")
        need(0.0 <= self.dropout < 1.0, "dropout", f"must be in [0, 1), got {self.dropout}")
        need(isinstance(self.n_expert, int) and self.n_expert >= 0, "n_expert",
             f"must be an integer >= 0 (0 = dense), got {self.n_expert!r}")
        if self.n_expert > 0:
            need(1 <= self.expert_top_k <= self.n_expert, "expert_top_k",
                 f"top_k={self.expert_top_k} must be between 1 and n_expert={self.n_expert}; "
                 f"lower expert_top_k or raise n_expert")
        need(self.moe_capacity_factor >= 0, "moe_capacity_factor",
             f"must be >= 0 (0 = no token dropping), got {self.moe_capacity_factor}")
        need(self.moe_aux_coef >= 0, "moe_aux_coef", f"must be >= 0, got {self.moe_aux_coef}")

    # Derived sizes ------------------------------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        """Hidden width of one SwiGLU FFN (or of one expert)."""
        if self.ffn_hidden:
            return self.ffn_hidden
        return _round_up(8 * self.n_embd / 3, self.ffn_multiple_of)

    # Checkpoint round trip --------------------------------------------------------------------------------

    def to_dict(self) -> dict:
        """Plain JSON-able dict (what a checkpoint stores)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        """Inverse of to_dict; an unknown key is an error (it means the checkpoint comes from another model)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"GPTConfig: unknown field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**d)

    # Closed-form accounting (no model needs to be built: scaling.py uses these for a 70B plan) ------------------

    def num_params(self, non_embedding: bool = False, active: bool = False) -> int:
        """Parameter count from the shapes alone.

        non_embedding: leave out the token embedding and an untied LM head (Kaplan's N).
        active: count only the top-k experts a token uses (MoE compute), instead of all E (MoE memory).

        >>> GPTConfig(vocab_size=100, n_layer=1, n_head=2, n_kv_head=2, n_embd=8, ffn_hidden=16).num_params()
        1464
        """
        C, H, L = self.n_embd, self.ffn_dim, self.n_layer
        q_width = self.n_head * self.head_dim
        kv_width = self.n_kv_head * self.head_dim
        attention = C * q_width + 2 * C * kv_width + q_width * C
        if self.n_expert:
            experts = self.expert_top_k if active else self.n_expert
            ffn = experts * 3 * C * H + C * self.n_expert           # experts + router
        else:
            ffn = 3 * C * H
        blocks = L * (attention + ffn + 2 * C)                      # + attn_norm and ffn_norm gains
        total = blocks + C                                          # + final norm
        if not non_embedding:
            total += self.vocab_size * C * (1 if self.tie_embeddings else 2)
        return total

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs (forward + backward) per token: 6 * matmul parameters + 12 * L * T * C_q.

        The matmul parameters are the active non-embedding ones plus the LM head (V*C, a matmul whether tied or
        not); the embedding lookup is not a matmul. The attention term counts q.k and p.v for all T keys
        (PaLM's convention; a causal kernel skips about half of it).
        """
        T = self.block_size if seq_len is None else seq_len
        matmul_params = self.num_params(non_embedding=True, active=True) + self.vocab_size * self.n_embd
        attention = 12 * self.n_layer * T * self.n_head * self.head_dim
        return 6 * matmul_params + attention

    def training_memory_bytes(self) -> int:
        """Bytes of weights, gradients and AdamW state in mixed precision (16 per parameter, all experts),
        activations excluded."""
        return TRAINING_BYTES_PER_PARAM * self.num_params()


def _round_up(x: float, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= x: _round_up(341.3, 64) -> 384."""
    return int(math.ceil(x / multiple) * multiple)


# ----------------------------------------------------------------------------------------------------------------
# Building blocks, in the order of the lesson
# ----------------------------------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight, over the last dimension, computed in fp32.

    >>> RMSNorm(2)(torch.tensor([3.0, 4.0]))    # mean square 12.5, rms 3.536
    tensor([0.8485, 1.1314], grad_fn=<MulBackward0>)
    """

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.type_as(x) * self.weight


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the RoPE angles pos * theta^(-2i/head_dim) for i = 0 .. head_dim/2 - 1, each (T, head_dim/2).

    Computed on the fly in fp32 from the positions (a few thousand multiplies, folded into the graph by
    torch.compile), so there is no buffer to keep in sync with the device, the dtype or a KV-cache offset.

    >>> cos, sin = rope_angles(torch.tensor([0, 1]), 4, 10000.0)    # frequencies 1 and 0.01 rad/position
    >>> sin
    tensor([[0.0000, 0.0000],
            [0.8415, 0.0100]])
    """
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]      # (T, head_dim/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair (x_2i, x_2i+1) of x (B, T, heads, head_dim) by its angle (cos, sin: (T, head_dim/2)).

    Layout: interleaved pairs, as in the RoFormer paper, Meta's Llama code and Stanford CS336. (Hugging Face
    rotates the two halves (x_i, x_{i+d/2}) instead; that is the same rotation after permuting the features of
    wq and wk, so the two layouts train identically but their checkpoints need that permutation to convert.)

        [x0, x1] at angle a  ->  [x0 cos a - x1 sin a,  x0 sin a + x1 cos a]
    """
    B, T, n, d = x.shape
    pairs = x.float().reshape(B, T, n, d // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]                                   # (B, T, n, d/2)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]                 # (1, T, 1, d/2)
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rotated.reshape(B, T, n, d).type_as(x)


class KVCache:
    """Keys and values of the last `max_len` tokens of one sequence batch, one entry per layer: a rolling window.

    Each layer's buffer is (B, n_kv_head, max_len, head_dim), allocated once. The token at absolute position p lives
    in slot p % max_len, so once the window is full a new token overwrites the oldest one (a ring buffer, nothing
    is copied). Decoding one token then costs one query against at most max_len cached keys, at any length.
    With GQA the cache holds n_kv_head heads, not n_head: the saving grouped-query attention is for.

    Why a window may slide without recomputing anything: keys are stored already rotated by RoPE at their absolute
    positions, and a query at position m scores a key at position n through m - n only, so slot order does not
    matter and a new query at position 1,000 scores the key at 990 exactly as a query at 10 scores a key at 0.
    Positions past block_size are fine: rope_angles computes cos/sin for any position, there is no table.
    What sliding means: every layer attends to the previous max_len tokens (sliding-window attention, Mistral's
    rolling buffer, llama.cpp's context shift). For one layer that is exactly a fresh forward over the cropped
    window; deeper, it is not: a cached key of layer 2 was computed when its token still saw the tokens before
    the window, which a cropped recompute forgets. So past block_size the cache follows sliding-window attention,
    tested token for token against a full forward with a banded mask (tests/test_model.py).

    >>> cache = KVCache(n_layer=1, batch=1, n_kv_head=1, max_len=4, head_dim=2)
    >>> cache.length = 5; cache.stored, cache.slot(5)     # positions 1..4 held; position 5 replaces position 1
    (4, 1)
    """

    def __init__(self, n_layer: int, batch: int, n_kv_head: int, max_len: int, head_dim: int,
                 device=None, dtype=torch.float32):
        shape = (batch, n_kv_head, max_len, head_dim)
        self.k = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.v = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(n_layer)]
        self.max_len = max_len
        self.length = 0        # tokens seen so far, i.e. the absolute position of the next token

    @property
    def stored(self) -> int:
        """Tokens held in the window: min(length, max_len)."""
        return min(self.length, self.max_len)

    def slot(self, position: int) -> int:
        return position % self.max_len

    def layer(self, i: int) -> "LayerKV":
        return LayerKV(self, i)


class LayerKV:
    """One layer's view of a KVCache: `append` writes the new keys/values and returns all keys/values held."""

    def __init__(self, cache: KVCache, index: int):
        self.cache, self.index = cache, index

    @property
    def start(self) -> int:
        """Absolute position of the first new token (RoPE rotates by it)."""
        return self.cache.length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: (B, n_kv_head, T_new, head_dim) -> the keys/values held, (B, n_kv_head, min(start + T_new, max_len), d).

        Several tokens at once must fit the window in order (a prompt); one token at a time may wrap around.
        """
        cache, T_new = self.cache, k.shape[2]
        if T_new > 1 and self.start + T_new > cache.max_len:
            raise ConfigError(f"KV cache holds {cache.max_len} tokens and {self.start} are cached: {T_new} new ones "
                              f"at once do not fit; feed them one at a time (the window slides) or start a new cache")
        lo = cache.slot(self.start)                     # = start while the window is not yet full
        cache.k[self.index][:, :, lo:lo + T_new] = k
        cache.v[self.index][:, :, lo:lo + T_new] = v
        held = min(self.start + T_new, cache.max_len)
        return cache.k[self.index][:, :, :held], cache.v[self.index][:, :, :held]


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float = 0.0,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v with q (..., Tq, d) and k, v (..., Tk, d), Tq <= Tk, e.g. (B, h, T, d).

    `mask`: boolean, broadcastable to (..., Tq, Tk), True where a query may see a key (CS336's convention); None
    means causal. Then the queries are the last Tq of the Tk positions (a KV cache holds the first Tk - Tq), so
    query i may see keys 0 .. Tk - Tq + i. Three cases, all through the fused F.scaled_dot_product_attention:
    Tq == Tk: the usual lower-triangular mask (is_causal); Tq == 1: the new token sees every key, no mask;
    otherwise (a prompt appended to a non-empty cache) an explicit bottom-right-aligned mask.
    """
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
    Tq, Tk = q.shape[-2], k.shape[-2]
    if Tq == Tk:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True)
    if Tq == 1:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)
    query_pos = torch.arange(Tk - Tq, Tk, device=q.device)[:, None]
    key_pos = torch.arange(Tk, device=q.device)[None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=key_pos <= query_pos, dropout_p=dropout_p)


class Attention(nn.Module):
    """Causal self-attention with RoPE and grouped-query heads.

    `n_head`, `n_kv_head` and `head_dim` are plain attributes read by forward, so a tensor-parallel copy that
    keeps a slice of the heads only has to shrink wq/wk/wv/wo and set its local head counts.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.rope_theta = config.rope_theta
        self.dropout = config.dropout
        C = config.n_embd
        self.wq = nn.Linear(C, self.n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(C, self.n_kv_head * self.head_dim, bias=False)
        self.wv = nn.Linear(C, self.n_kv_head * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_head * self.head_dim, C, bias=False)

    def forward(self, x: torch.Tensor, cache: LayerKV | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_head, self.head_dim)                  # (B, T, h, d)
        k = self.wk(x).view(B, T, self.n_kv_head, self.head_dim)               # (B, T, h_kv, d)
        v = self.wv(x).view(B, T, self.n_kv_head, self.head_dim)
        start = 0 if cache is None else cache.start
        cos, sin = rope_angles(torch.arange(start, start + T, device=x.device), self.head_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)      # (B, heads, T, d)
        if cache is not None:
            k, v = cache.append(k, v)                                          # (B, h_kv, start + T, d)
        if self.n_kv_head != self.n_head:
            # GQA: query head j reads kv head j // group, i.e. kv heads repeated group times in place.
            group = self.n_head // self.n_kv_head
            k = k.repeat_interleave(group, dim=1)                              # (B, h, Tk, d)
            v = v.repeat_interleave(group, dim=1)
        y = causal_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)   # (B, h, T, d)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)
        return self.wo(y)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x): a gated feed-forward layer (Shazeer 2020). silu(z) = z * sigmoid(z)."""

    def __init__(self, n_embd: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(n_embd, hidden, bias=False)   # gate
        self.w3 = nn.Linear(n_embd, hidden, bias=False)   # value
        self.w2 = nn.Linear(hidden, n_embd, bias=False)   # back to the residual stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoE(nn.Module):
    """A Mixture of Experts in place of the FFN: E SwiGLU experts, top-k routing per token, fixed capacity.

    Routing: p = softmax(router(x)) over the E experts; each token goes to its k most probable experts and
    their outputs are summed with weights p (not renormalised over the k, as in Switch Transformer and
    Qwen-MoE: the router then gets a gradient from the main loss even with k = 1).

    Capacity: each expert processes at most `capacity = ceil(factor * N * k / E)` of the N tokens; choices are
    served first-choice-first then in token order, and an assignment beyond capacity is dropped (that token's
    residual stream simply passes through this layer for that expert). Fixed capacity is what makes every
    shape static, so torch.compile sees one graph and the experts run as one batched matmul (E, capacity, C).
    factor = 0 means capacity = N: nothing is ever dropped (costs E/k times the active compute). In eval mode
    capacity is always N, so generation and evaluation do not depend on which other tokens share the batch.
    Dropping is why a capacity-limited MoE is not strictly causal in training: a later token can take the slot
    an earlier token's second choice wanted (the cost of static shapes; Switch and GShard accept it too).

    Load balancing (Switch Transformer): aux = E * sum_e f_e * P_e, with f_e the fraction of the N*k choices
    that picked expert e and P_e the mean router probability of e. It is 1 when routing is uniform and grows
    towards E as the router collapses onto one expert. forward returns it beside the output rather than storing
    it: a pure function can sit inside activation checkpointing under torch.compile (a side effect there is a
    graph break); the Block records it.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        C, H, E = config.n_embd, config.ffn_dim, config.n_expert
        self.n_expert, self.top_k, self.capacity_factor = E, config.expert_top_k, config.moe_capacity_factor
        self.router = nn.Linear(C, E, bias=False)
        # The experts' SwiGLU weights stacked on a leading expert axis, laid out for x @ w.
        self.w1 = nn.Parameter(torch.empty(E, C, H))
        self.w3 = nn.Parameter(torch.empty(E, C, H))
        self.w2 = nn.Parameter(torch.empty(E, H, C))

    def capacity(self, n_tokens: int) -> int:
        """Slots per expert: ceil(factor * N * k / E), at most N; N when factor is 0.

        >>> MoE(GPTConfig(n_expert=8, expert_top_k=2)).capacity(1024)    # 1.25 * 1024 * 2 / 8
        320
        """
        if self.capacity_factor == 0:
            return n_tokens
        return min(n_tokens, math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_expert))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> (output (B, T, C), load-balancing loss (0-dim))."""
        B, T, C = x.shape
        E, k = self.n_expert, self.top_k
        tokens = x.reshape(B * T, C)                                           # (N, C)
        N = tokens.shape[0]
        probs = F.softmax(self.router(tokens).float(), dim=-1)                 # (N, E)
        gate, expert = probs.topk(k, dim=-1)                                   # (N, k) each

        # Order the N*k assignments choice-major (all first choices, then all second choices), so a full
        # expert drops second choices before first ones.
        expert = expert.t().reshape(-1)                                        # (k*N,)
        gate = gate.t().reshape(-1)                                            # (k*N,)
        chosen = F.one_hot(expert, E)                                          # (k*N, E)
        slot_in_expert = (chosen.cumsum(0) * chosen).sum(-1) - 1               # rank of this assignment, (k*N,)
        cap = self.capacity(N) if self.training else N                        # inference never drops
        kept = slot_in_expert < cap
        # Flat slot in an (E * cap + 1, C) buffer; dropped assignments all land in the spare last row.
        slot = torch.where(kept, expert * cap + slot_in_expert, torch.full_like(expert, E * cap))

        inputs = tokens.new_zeros(E * cap + 1, C)
        inputs.index_copy_(0, slot, tokens.repeat(k, 1))                       # kept slots are unique
        expert_in = inputs[:-1].view(E, cap, C)
        hidden = F.silu(expert_in @ self.w1) * (expert_in @ self.w3)           # (E, cap, H)
        expert_out = torch.cat(((hidden @ self.w2).view(E * cap, C), tokens.new_zeros(1, C)))  # (E*cap + 1, C)
        weighted = expert_out[slot] * (gate * kept).unsqueeze(-1).to(x.dtype)  # (k*N, C)
        y = weighted.view(k, N, C).sum(0)

        fraction = chosen.float().mean(0)                                      # f_e, sums to 1
        mean_prob = probs.mean(0)                                              # P_e, sums to 1
        aux_loss = E * (fraction * mean_prob).sum()
        return y.view(B, T, C), aux_loss


class Block(nn.Module):
    """x + attn(attn_norm(x)), then x + ffn(ffn_norm(x)). forward(x) -> x, the unit pipeline parallel moves.

    RoPE needs no table here: each Attention computes its angles from the positions (0..T-1, or shifted by a
    KV cache), so a block is self-contained and can run on any pipeline stage.

    Activation checkpointing lives here too: in training, with the flag, the block keeps only its input and
    recomputes its inside during backward (about 1/3 more compute for most of the activation memory).
    `self.aux_loss` holds the MoE load-balancing loss of the last forward (0 for a dense FFN).
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = Attention(config)
        self.ffn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.ffn = MoE(config) if config.n_expert else SwiGLU(config.n_embd, config.ffn_dim)
        self.resid_dropout = nn.Dropout(config.dropout)
        self.activation_checkpointing = config.activation_checkpointing
        self.aux_loss = torch.zeros(())

    def forward(self, x: torch.Tensor, cache: LayerKV | None = None) -> torch.Tensor:
        if self.activation_checkpointing and self.training and cache is None:
            x, aux_loss = checkpoint(self._residual_updates, x, None, use_reentrant=False)
        else:
            x, aux_loss = self._residual_updates(x, cache)
        if aux_loss is not None:
            self.aux_loss = aux_loss                   # recorded outside the checkpointed function
        return x

    def _residual_updates(self, x: torch.Tensor, cache: LayerKV | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block's math, free of side effects: (B, T, C) -> (B, T, C) and the MoE loss (None when dense)."""
        x = x + self.resid_dropout(self.attn(self.attn_norm(x), cache))
        aux_loss = None
        if isinstance(self.ffn, MoE):
            update, aux_loss = self.ffn(self.ffn_norm(x))
        else:
            update = self.ffn(self.ffn_norm(x))
        return x + self.resid_dropout(update), aux_loss


# ----------------------------------------------------------------------------------------------------------------
# The model
# ----------------------------------------------------------------------------------------------------------------

class GPT(nn.Module):
    """Decoder-only Transformer: embed -> blocks -> head. forward(idx, targets) -> (logits, loss)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight     # one (V, C) matrix reads tokens in and writes them out
        self.aux_loss = torch.zeros(())
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module):
        """N(0, 0.02) everywhere; residual-stream writers (wo, w2) get 0.02 / sqrt(2 * n_layer)."""
        std, residual_std = 0.02, 0.02 / math.sqrt(2 * self.config.n_layer)
        if isinstance(module, (Attention, SwiGLU)):
            out = module.wo if isinstance(module, Attention) else module.w2
            for linear in module.children():
                nn.init.normal_(linear.weight, 0.0, residual_std if linear is out else std)
        elif isinstance(module, MoE):
            nn.init.normal_(module.router.weight, 0.0, std)
            nn.init.normal_(module.w1, 0.0, std)
            nn.init.normal_(module.w3, 0.0, std)
            nn.init.normal_(module.w2, 0.0, residual_std)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, 0.0, std)
        elif isinstance(module, GPT) and not self.config.tie_embeddings:
            nn.init.normal_(module.lm_head.weight, 0.0, std)

    # Stage pieces: pipeline parallel runs embed on the first stage, blocks in between, head on the last.

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> residual stream (B, T, C). Checks the ids and the length (skipped while compiling)."""
        if not torch.compiler.is_compiling():
            self._check_input(idx)
        return self.emb_dropout(self.tok_emb(idx))

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Residual stream (B, T, C) -> logits (B, T, V): final RMSNorm then the LM head."""
        return self.lm_head(self.norm(x))

    def _check_input(self, idx: torch.Tensor):
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ConfigError(f"idx must be an integer tensor of shape (batch, time), got {tuple(idx.shape)} "
                              f"{idx.dtype}; pass token ids as torch.long")
        if idx.shape[1] > self.config.block_size:
            raise ConfigError(f"sequence length {idx.shape[1]} exceeds block_size={self.config.block_size}; "
                              f"crop the input to its last block_size tokens or use a config with a larger block_size")
        if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.config.vocab_size):
            raise ConfigError(f"token ids must lie in [0, vocab_size={self.config.vocab_size}), got "
                              f"[{int(idx.min())}, {int(idx.max())}]; set vocab_size to the tokenizer's size")

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None,
                kv_cache: KVCache | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) -> logits (B, T, V) and, with targets (B, T), the mean cross-entropy (ignore_index -1).

        The MoE load-balancing loss of this forward is left in `self.aux_loss` (0-dim; 0 for a dense model).
        With a kv_cache the tokens continue the cached sequence (generation); the cache is advanced by T.
        """
        if kv_cache is not None and kv_cache.max_len > self.config.block_size:
            raise ConfigError(f"a KV cache of {kv_cache.max_len} tokens would let attention reach past "
                              f"block_size={self.config.block_size}; make the cache block_size long at most")
        x = self.embed(idx)                                                    # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, None if kv_cache is None else kv_cache.layer(i))     # (B, T, C)
        if kv_cache is not None:
            kv_cache.length += idx.shape[1]
        if self.config.n_expert:
            self.aux_loss = torch.stack([block.aux_loss for block in self.blocks]).sum()
        logits = self.head(x)                                                  # (B, T, V)
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1)
        return logits, loss

    # Generation -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0, top_k: int | None = None,
                 generator: torch.Generator | None = None) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens sampled tokens -> (B, T + max_new_tokens), using a KV cache.

        temperature 0 picks the most likely token (greedy); top_k keeps only the k most likely before sampling;
        `generator` makes sampling reproducible. The prompt's last block_size tokens fill the cache in one forward,
        then each step feeds one token. Past block_size the cache window slides (see KVCache): every layer
        attends to the previous block_size tokens, one query per step at any length.
        """
        if max_new_tokens < 0:
            raise ConfigError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        if temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
        if top_k is not None and top_k < 1:
            raise ConfigError(f"top_k must be >= 1 or None, got {top_k}")
        was_training = self.training
        self.eval()
        cfg = self.config
        cache = KVCache(cfg.n_layer, idx.shape[0], self.blocks[0].attn.n_kv_head, cfg.block_size, cfg.head_dim,
                        device=idx.device, dtype=self.tok_emb.weight.dtype)
        pending = idx[:, -cfg.block_size:]                                     # ids not yet cached: the prompt
        for _ in range(max_new_tokens):
            logits, _ = self(pending, kv_cache=cache)
            next_token = sample(logits[:, -1, :], temperature, top_k, generator)   # (B, 1)
            idx = torch.cat((idx, next_token), dim=1)
            pending = next_token
        self.train(was_training)
        return idx

    # Accounting -------------------------------------------------------------------------------------------

    def num_params(self, non_embedding: bool = False, active: bool = False) -> int:
        """Count the actual tensors (a tied head is counted once). See GPTConfig.num_params for the closed form."""
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            total -= self.tok_emb.weight.numel()
            if self.lm_head.weight is not self.tok_emb.weight:
                total -= self.lm_head.weight.numel()
        if active and self.config.n_expert:
            E, k = self.config.n_expert, self.config.expert_top_k
            for block in self.blocks:
                expert_params = sum(w.numel() for w in (block.ffn.w1, block.ffn.w2, block.ffn.w3))
                total -= expert_params * (E - k) // E
        return total

    def flops_per_token(self, seq_len: int | None = None) -> int:
        """Training FLOPs per token (6N + 12 L T C_q), see GPTConfig.flops_per_token."""
        return self.config.flops_per_token(seq_len)

    def estimate_mfu(self, tokens_per_s: float, peak_flops: float, seq_len: int | None = None) -> float:
        """Model FLOPs utilisation: tokens/s * FLOPs/token / peak FLOP/s (a fraction, 0..1)."""
        return tokens_per_s * self.flops_per_token(seq_len) / peak_flops


def sample(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
           generator: torch.Generator | None = None) -> torch.Tensor:
    """Pick one token per row of logits (B, V) -> (B, 1). temperature 0 = argmax; top_k keeps the k best."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth_best = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


# ----------------------------------------------------------------------------------------------------------------
# Presets
# ----------------------------------------------------------------------------------------------------------------

PRESETS: dict[str, GPTConfig] = {
    # The default CPU run: trains to a visibly falling loss in a few minutes on 2 cores.
    "tiny": GPTConfig(vocab_size=4096, block_size=128, n_layer=4, n_head=4, n_kv_head=2, n_embd=128),
    # The scaling sweep: non-embedding parameters about 4x apart, small enough to train on a CPU.
    "sweep-1": GPTConfig(vocab_size=4096, block_size=128, n_layer=2, n_head=2, n_kv_head=2, n_embd=64),
    "sweep-2": GPTConfig(vocab_size=4096, block_size=128, n_layer=4, n_head=4, n_kv_head=4, n_embd=96),
    "sweep-3": GPTConfig(vocab_size=4096, block_size=128, n_layer=4, n_head=6, n_kv_head=6, n_embd=192),
    "sweep-4": GPTConfig(vocab_size=4096, block_size=128, n_layer=8, n_head=8, n_kv_head=8, n_embd=256),
    "10m": GPTConfig(vocab_size=8192, block_size=256, n_layer=6, n_head=6, n_kv_head=2, n_embd=384),
    # GPU sizes. 124m and 350m have GPT-2 small/medium shapes (SwiGLU at 8/3 C matches GPT-2's 4C MLP in size).
    "124m": GPTConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_kv_head=12, n_embd=768),
    "350m": GPTConfig(vocab_size=50304, block_size=1024, n_layer=24, n_head=16, n_kv_head=16, n_embd=1024),
    # Llama-3.2-1B's shape (GQA 32/8, FFN 8192) with the GPT-2 vocabulary.
    "1b": GPTConfig(vocab_size=50304, block_size=2048, n_layer=16, n_head=32, n_kv_head=8, n_embd=2048,
                    ffn_hidden=8192, rope_theta=500000.0),
}


def preset_table(presets: dict[str, GPTConfig] = PRESETS) -> str:
    """The presets as a text table: shape, parameters (total / non-embedding / active), FLOPs/token, memory."""
    header = (f"{'preset':<11} {'layers':>6} {'heads':>5} {'kv':>3} {'width':>5} {'ffn':>5} {'vocab':>6} "
              f"{'ctx':>5} {'params':>9} {'non-emb':>9} {'active':>9} {'FLOPs/tok':>10} {'train mem':>10}")
    rows = [header, "-" * len(header)]
    for name, c in presets.items():
        rows.append(f"{name:<11} {c.n_layer:>6} {c.n_head:>5} {c.n_kv_head:>3} {c.n_embd:>5} {c.ffn_dim:>5} "
                    f"{c.vocab_size:>6} {c.block_size:>5} {_human(c.num_params()):>9} "
                    f"{_human(c.num_params(non_embedding=True)):>9} {_human(c.num_params(active=True)):>9} "
                    f"{c.flops_per_token():>10.3g} {c.training_memory_bytes() / 1e9:>8.2f}GB")
    return "\n".join(rows)


def _human(n: int) -> str:
    """1234567 -> '1.23M'."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


# ----------------------------------------------------------------------------------------------------------------
# Devices: the one check of --device that every CLI (train, evaluate, ...) uses
# ----------------------------------------------------------------------------------------------------------------

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"


def resolve_device(name: str, error: type[Exception] = ValueError) -> torch.device:
    """A --device value as a torch.device, or `error` in one line naming --device and what this machine has.

    auto: CUDA (cuda:LOCAL_RANK under torchrun), else Apple's MPS, else the CPU. cuda:N must be a GPU that exists;
    "meta" (tensors without data: everything after the first forward fails) and anything else are refused.

    >>> resolve_device("cpu")
    device(type='cpu')
    >>> resolve_device("meta")
    Traceback (most recent call last):
    ValueError: --device meta: meta tensors hold no data to compute with; use auto, cpu, cuda, cuda:N or mps
    """
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if name == "auto":
        name = "cuda" if cuda else "mps" if mps else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise error(f"--device {name}: not a device; use {DEVICE_CHOICES}") from None
    if device.type == "cpu":
        return torch.device("cpu")
    if device.type == "cuda":
        if not cuda:
            raise error(f"--device {name}: no CUDA device here; use --device cpu (or auto)")
        index = int(os.environ.get("LOCAL_RANK", 0)) if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise error(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                        f"cuda:0 to cuda:{torch.cuda.device_count() - 1}")
        return torch.device("cuda", index)
    if device.type == "mps":
        if not mps:
            raise error(f"--device {name}: Apple's MPS backend is not available here; use --device cpu (or auto)")
        return device
    if device.type == "meta":
        raise error(f"--device {name}: meta tensors hold no data to compute with; use {DEVICE_CHOICES}")
    raise error(f"--device {name}: this project runs on {DEVICE_CHOICES}, not {device.type}")


# ----------------------------------------------------------------------------------------------------------------
# Taking the model elsewhere: the Hugging Face Llama layout (see "Exporting to Hugging Face" in the docstring)
# ----------------------------------------------------------------------------------------------------------------

# Our parameter names -> Hugging Face LlamaForCausalLM's: inside block i (HF's "model.layers.{i}."), and the
# others. wq and wk also need `interleaved_to_halves`; lm_head is absent from the file when the embeddings are tied.
HF_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wq.weight": "self_attn.q_proj.weight",
    "attn.wk.weight": "self_attn.k_proj.weight",
    "attn.wv.weight": "self_attn.v_proj.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn.w1.weight": "mlp.gate_proj.weight",
    "ffn.w3.weight": "mlp.up_proj.weight",
    "ffn.w2.weight": "mlp.down_proj.weight",
}
HF_GLOBAL_NAMES = {"tok_emb.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight",
                   "lm_head.weight": "lm_head.weight"}
INSTALL_HINT = "pip install safetensors transformers"


def hf_name(name: str) -> str:
    """Our parameter name -> HF's.

    >>> hf_name("blocks.3.attn.wq.weight")
    'model.layers.3.self_attn.q_proj.weight'
    """
    if name.startswith("blocks."):
        _, i, rest = name.split(".", 2)
        return f"model.layers.{i}.{HF_LAYER_NAMES[rest]}"
    return HF_GLOBAL_NAMES[name]


def rope_heads(name: str, config: GPTConfig) -> int | None:
    """The number of heads whose rows RoPE rotates in parameter `name` (wq: n_head, wk: n_kv_head), else None."""
    return {"attn.wq.weight": config.n_head, "attn.wk.weight": config.n_kv_head}.get(name.split(".", 2)[-1])


def rope_halves_order(head_dim: int) -> torch.Tensor:
    """Which of our features each of HF's features is, inside one head: the even ones, then the odd ones.

    >>> rope_halves_order(4)       # HF's [x_0, x_1 | x_2, x_3] are our [x_0, x_2 | x_1, x_3]
    tensor([0, 2, 1, 3])
    """
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))


def interleaved_to_halves(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the output rows of wq or wk (n_heads * head_dim, C) from our RoPE pairs to HF's, head by head."""
    head_dim = weight.shape[0] // n_heads
    return weight.view(n_heads, head_dim, -1)[:, rope_halves_order(head_dim)].reshape(weight.shape)


def halves_to_interleaved(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The inverse of interleaved_to_halves: HF's q_proj / k_proj rows back to our pair layout."""
    head_dim = weight.shape[0] // n_heads
    inverse = torch.argsort(rope_halves_order(head_dim))
    return weight.view(n_heads, head_dim, -1)[:, inverse].reshape(weight.shape)


def hf_config(config: GPTConfig, bos_eos_id: int | None) -> dict:
    """config.json of the equivalent LlamaForCausalLM. Every field HF would otherwise default is written out:
    HF's defaults differ from ours (rms_norm_eps 1e-6 vs our 1e-5, tie_word_embeddings False vs our True).
    rope_theta is written both the classic way (vLLM, llama.cpp, transformers 4) and as transformers 5's
    rope_parameters. bos/eos are <|endoftext|>: data.py starts every document with it."""
    if config.n_expert:
        raise ConfigError("cannot export a Mixture of Experts: model.py weighs the top-k experts by their full-softmax "
                          "probabilities while Mixtral renormalises them over the k, so the logits would differ; "
                          "export a dense model (n_expert=0)")
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": config.vocab_size, "hidden_size": config.n_embd, "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layer, "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head, "head_dim": config.head_dim, "hidden_act": "silu",
        "max_position_embeddings": config.block_size, "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "rope_scaling": None, "tie_word_embeddings": config.tie_embeddings,
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": 0.02,
        "bos_token_id": bos_eos_id, "eos_token_id": bos_eos_id, "torch_dtype": "float32", "use_cache": True,
    }


def hf_state_dict(model: "GPT") -> dict[str, torch.Tensor]:
    """Our weights under HF's names, q/k rows permuted to the halves layout, fp32, contiguous."""
    cfg, out = model.config, {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_embeddings:
            continue                                       # tied: HF re-ties it to embed_tokens on load
        if rope_heads(name, cfg):
            tensor = interleaved_to_halves(tensor, rope_heads(name, cfg))
        out[hf_name(name)] = tensor.detach().to("cpu", torch.float32).contiguous()
    return out


def check_new_directory(out_dir) -> pathlib.Path:
    """out_dir as a Path, if it does not exist or is an empty directory (export never mixes into old files)."""
    out_dir = pathlib.Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ConfigError(f"--to {out_dir} already exists and is not an empty directory; choose a new directory")
    return out_dir


def hf_tokenizer_files(tokenizer, block_size: int) -> dict[str, dict]:
    """tokenizer.json (bpe.Tokenizer.to_hf) and tokenizer_config.json, what AutoTokenizer reads. No BOS is
    added to encoded text (GPT-2's convention, and ours: ids equal `tokenizer.encode(text, allowed_special="all")`);
    decoding keeps spaces as they are."""
    eot = tokenizer.eot_id
    eot_text = None if eot is None else tokenizer.vocab[eot].decode("utf-8")
    return {"tokenizer.json": tokenizer.to_hf(),
            "tokenizer_config.json": {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": eot_text,
                                      "eos_token": eot_text, "model_max_length": block_size,
                                      "clean_up_tokenization_spaces": False}}


def export_hf(model: "GPT", tokenizer, out_dir) -> pathlib.Path:
    """Write a Hugging Face LlamaForCausalLM directory: config.json, model.safetensors, generation_config.json,
    tokenizer.json (tokenizer: a bpe.Tokenizer, via its to_hf) and tokenizer_config.json. All files go to a
    temporary directory that is renamed to out_dir at the end, so out_dir is complete or absent."""
    try:
        from safetensors.torch import save_file
    except ImportError:
        raise ConfigError(f"export needs the safetensors package: {INSTALL_HINT}") from None
    out_dir = check_new_directory(out_dir)
    if len(tokenizer) > model.config.vocab_size:
        raise ConfigError(f"the tokenizer has {len(tokenizer)} ids but the model only {model.config.vocab_size}")
    eot = tokenizer.eot_id
    files = {"config.json": hf_config(model.config, eot),
             "generation_config.json": {"bos_token_id": eot, "eos_token_id": eot,
                                        "max_length": model.config.block_size},
             **hf_tokenizer_files(tokenizer, model.config.block_size)}
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp"))
    try:
        for name, doc in files.items():
            (tmp / name).write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        save_file(hf_state_dict(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        umask = os.umask(0)
        os.umask(umask)                                    # mkdtemp made the directory private: use the umask
        for path in (tmp, *tmp.iterdir()):
            path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


VERIFY_TEXT = ("Once upon a time, a naïve café served Ελληνικά, русский, 中文 and 日本語 🙂👩‍👩‍👧 at 12:34.<|endoftext|>"
               "def f(x):\n    return x ** 2  # it's done\n")


def verify_hf(model: "GPT", tokenizer, hf_dir, new_tokens: int = 16) -> dict:
    """Load hf_dir with transformers and compare it with (model, tokenizer), the oracle of tests/test_hf.py:
    the largest |logit difference| on random ids and on VERIFY_TEXT (fp32), whether greedy decoding gives the
    same tokens, and whether AutoTokenizer gives our ids for VERIFY_TEXT."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"--verify needs the transformers package: {INSTALL_HINT}") from None
    theirs = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ids = tokenizer.encode(VERIFY_TEXT, allowed_special="all")
    same_ids = transformers.AutoTokenizer.from_pretrained(hf_dir)(VERIFY_TEXT, verbose=False)["input_ids"] == ids
    T = model.config.block_size
    random_ids = torch.randint(0, model.config.vocab_size, (2, T), generator=torch.Generator().manual_seed(0))
    text_ids = torch.tensor([ids[:T]])
    model = model.eval()
    with torch.no_grad():
        diff = max((model(x)[0] - theirs(x).logits).abs().max().item() for x in (random_ids, text_ids))
    prompt = text_ids[:, :8]
    n = min(new_tokens, T - prompt.shape[1])
    theirs.generation_config.eos_token_id = None               # compare n tokens even past an <|endoftext|>
    theirs.generation_config.pad_token_id = 0
    hf_greedy = theirs.generate(prompt, max_new_tokens=n, do_sample=False, max_length=None)
    return {"max_abs_logit_diff": diff, "logit_positions": random_ids.numel() + text_ids.numel(),
            "greedy_tokens": n, "greedy_equal": torch.equal(model.generate(prompt, n, temperature=0), hf_greedy),
            "tokenizer_ids_equal": same_ids}


def config_from_hf(hf: dict, source: str = "config.json") -> GPTConfig:
    """GPTConfig of a LlamaForCausalLM config.json, refusing in one line what model.py cannot express."""
    def refuse(what: str):
        raise ConfigError(f"{source}: {what}, which model.py cannot express; it loads plain LlamaForCausalLM only")
    architectures = hf.get("architectures")
    if architectures != ["LlamaForCausalLM"] and (architectures or hf.get("model_type") != "llama"):
        refuse(f"architecture {architectures or hf.get('model_type')}")
    rope = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or rope               # transformers 4 writes rope_scaling, 5 rope_parameters
    if scaling.get("rope_type", scaling.get("type", "default")) != "default":
        refuse(f"RoPE scaling {scaling.get('rope_type', scaling.get('type'))!r}")
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        refuse("biases in the linear layers")
    if hf.get("hidden_act", "silu") != "silu":
        refuse(f"activation {hf['hidden_act']!r} (model.py's SwiGLU uses silu)")
    try:
        n_embd, n_head = int(hf["hidden_size"]), int(hf["num_attention_heads"])
    except KeyError as e:
        raise ConfigError(f"{source} lacks {e.args[0]!r}; it is not a LlamaForCausalLM config") from None
    if hf.get("head_dim") not in (None, n_embd // n_head):
        refuse(f"head_dim {hf['head_dim']} != hidden_size / num_attention_heads = {n_embd // n_head}")
    try:
        return GPTConfig(vocab_size=int(hf["vocab_size"]), block_size=int(hf.get("max_position_embeddings", 2048)),
                         n_layer=int(hf["num_hidden_layers"]), n_head=n_head,
                         n_kv_head=int(hf.get("num_key_value_heads") or n_head), n_embd=n_embd,
                         ffn_hidden=_explicit_ffn_hidden(int(hf["intermediate_size"]), n_embd),
                         rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
                         norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
                         tie_embeddings=bool(hf.get("tie_word_embeddings", False)))
    except KeyError as e:
        raise ConfigError(f"{source} lacks {e.args[0]!r}; it is not a LlamaForCausalLM config") from None
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def _explicit_ffn_hidden(intermediate_size: int, n_embd: int) -> int:
    """0 (auto) when HF's intermediate_size is what GPTConfig would derive, so a round trip gives the same config.

    >>> _explicit_ffn_hidden(384, 128), _explicit_ffn_hidden(8192, 2048)
    (0, 8192)
    """
    return 0 if intermediate_size == GPTConfig(n_embd=n_embd, n_head=1, n_kv_head=1).ffn_dim else intermediate_size


def _read_safetensors(hf_dir: pathlib.Path) -> dict[str, torch.Tensor]:
    """Every tensor of model.safetensors, or of the shards listed in model.safetensors.index.json."""
    try:
        from safetensors.torch import load_file
    except ImportError:
        raise ConfigError(f"reading a Hugging Face model needs the safetensors package: {INSTALL_HINT}") from None
    index = hf_dir / "model.safetensors.index.json"
    try:
        files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() \
            else ["model.safetensors"]
    except (ValueError, KeyError, AttributeError) as e:
        raise ConfigError(f"{index} is damaged ({type(e).__name__}: {e}); it must map tensor names to files") from None
    tensors = {}
    for name in files:
        if not (hf_dir / name).is_file():
            raise ConfigError(f"{hf_dir / name} not found; the directory must hold the weights as safetensors")
        try:
            tensors.update(load_file(str(hf_dir / name)))
        except Exception as e:                 # safetensors' own error type: a truncated or foreign file
            raise ConfigError(f"{hf_dir / name} is not a readable safetensors file ({e})") from None
    return tensors


def load_hf(hf_dir) -> tuple["GPT", object]:
    """(GPT in eval mode, bpe.Tokenizer or None) from a Hugging Face LlamaForCausalLM directory (one `export_hf`
    wrote, or any Llama checkpoint on disk in safetensors). Weights become fp32; q/k rows go back to our RoPE
    layout. What model.py cannot express (another architecture, RoPE scaling, biases, tensors whose shapes
    disagree with config.json) fails with one ConfigError line. The tokenizer (bpe.py, imported here) comes from
    tokenizer.json when present and must be byte-level BPE."""
    hf_dir = pathlib.Path(hf_dir)
    if not (hf_dir / "config.json").is_file():
        raise ConfigError(f"{hf_dir / 'config.json'} not found; --from must be a Hugging Face model directory")
    try:
        config = config_from_hf(json.loads((hf_dir / "config.json").read_text(encoding="utf-8")),
                                str(hf_dir / "config.json"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{hf_dir / 'config.json'} is not valid JSON ({e})") from None
    tensors = {k: v for k, v in _read_safetensors(hf_dir).items() if not k.endswith("rotary_emb.inv_freq")}
    with torch.device("meta"):
        model = GPT(config)
    state = {}
    for name, ours in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_embeddings:
            continue
        theirs = hf_name(name)
        if theirs not in tensors:
            raise ConfigError(f"{hf_dir}: the weights lack {theirs}, which config.json implies; "
                              f"the directory is incomplete or not a LlamaForCausalLM")
        tensor = tensors.pop(theirs)
        if tuple(tensor.shape) != tuple(ours.shape):
            raise ConfigError(f"{hf_dir}: {theirs} has shape {tuple(tensor.shape)} but config.json implies "
                              f"{tuple(ours.shape)}; the weights and config.json disagree")
        if rope_heads(name, config):
            tensor = halves_to_interleaved(tensor, rope_heads(name, config))
        state[name] = tensor.to(torch.float32)
    if config.tie_embeddings:
        tensors.pop("lm_head.weight", None)                # some tied checkpoints store the copy anyway
        state["lm_head.weight"] = state["tok_emb.weight"]
    if tensors:
        raise ConfigError(f"{hf_dir}: tensor {sorted(tensors)[0]} (and {len(tensors) - 1} more) has no place in "
                          f"model.py's Llama (a bias, an extra module), which model.py cannot express")
    model = GPT(config)
    model.load_state_dict(state)
    tokenizer = None
    if (hf_dir / "tokenizer.json").is_file():
        import bpe
        try:
            tokenizer = bpe.Tokenizer.from_hf(json.loads((hf_dir / "tokenizer.json").read_text(encoding="utf-8")),
                                              str(hf_dir / "tokenizer.json"))
        except (bpe.TokenizerError, json.JSONDecodeError) as e:
            raise ConfigError(str(e)) from None
        if len(tokenizer) > config.vocab_size:
            raise ConfigError(f"{hf_dir}: tokenizer.json has {len(tokenizer)} ids but vocab_size is "
                              f"{config.vocab_size}; the tokenizer belongs to another model")
    return model.eval(), tokenizer


def save_imported_checkpoint(model: "GPT", tokenizer, path, source: str) -> pathlib.Path:
    """Write a checkpoint in train.py's format (version 1: model, model_config, tokenizer_json, step 0), which
    evaluate.py samples from and `train.py --init-from` starts a run from. train.py's own atomic writer does it
    (imported here only: the format and its checksum belong to train.py)."""
    import train
    path = pathlib.Path(path)
    ckpt = {"version": 1, "step": 0, "model": model.state_dict(), "model_config": model.config.to_dict(),
            "tokenizer_json": tokenizer.to_json(), "imported_from": source}
    path.parent.mkdir(parents=True, exist_ok=True)
    train.atomic_save(ckpt, path)
    return path


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------

def demo_kv_cache(name: str, new_tokens: int, seed: int) -> str:
    """Greedy decoding from an untrained preset, with the KV cache and without it (a full forward over the last
    block_size tokens at every step): the time each took and where their ids agree. Within block_size they must
    be equal; past it the cache slides its window (see KVCache), so a deeper model may pick other tokens."""
    torch.manual_seed(seed)
    model = GPT(PRESETS[name]).eval()
    prompt_len, window = 8, model.config.block_size
    prompt = torch.randint(0, model.config.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    start = time.perf_counter()
    cached = model.generate(prompt, new_tokens, temperature=0)
    cached_s = time.perf_counter() - start
    start = time.perf_counter()
    idx = prompt
    with torch.no_grad():
        for _ in range(new_tokens):
            logits, _ = model(idx[:, -window:])
            idx = torch.cat((idx, logits[:, -1].argmax(-1, keepdim=True)), dim=1)
    full_s = time.perf_counter() - start
    inside = min(new_tokens, window - prompt_len)             # tokens predicted from a window that is not full
    past = new_tokens - inside
    lines = [f"{name}: {model.num_params():,} parameters, {new_tokens} greedy tokens, block_size {window}",
             f"  with KV cache   {cached_s:6.2f} s",
             f"  without cache   {full_s:6.2f} s  ({full_s / cached_s:.1f}x the cached time)",
             f"  same ids within block_size: {torch.equal(cached[:, :prompt_len + inside], idx[:, :prompt_len + inside])}"]
    if past:
        agree = int((cached[0, -past:] == idx[0, -past:]).sum())
        lines.append(f"  past block_size (sliding window vs cropped recompute): {agree} of {past} ids agree")
    return "\n".join(lines)


def export_checkpoint(ckpt_path: str, out_dir: str, verify: bool = False) -> str:
    """`python model.py export`: a train.py checkpoint (or run directory) -> a Hugging Face directory.

    The checkpoint is read by train.py's own loader (newest good checkpoint of a run directory, weights_only
    torch.load), imported here and only here: the format belongs to train.py, and a second reader would drift
    from it, while importing train.py at the top would tie this torch-only file to data.py and numpy."""
    import train
    check_new_directory(out_dir)
    if not pathlib.Path(ckpt_path).exists():
        raise ConfigError(f"--ckpt {ckpt_path} not found; pass a checkpoint file or a run directory of train.py")
    try:
        ckpt = train.load_checkpoint(ckpt_path, log=lambda message: print(message, file=sys.stderr))
        model, tokenizer = train.model_from_checkpoint(ckpt)
    except (train.TrainError, KeyError, ValueError, RuntimeError) as e:
        raise ConfigError(f"--ckpt {ckpt_path}: cannot load it ({str(e).splitlines()[0]})") from None
    export_hf(model, tokenizer, out_dir)
    report = (f"wrote {out_dir}: LlamaForCausalLM, {model.num_params():,} parameters, vocab {len(tokenizer)}, "
              f"from {ckpt['path']} (step {ckpt.get('step')})")
    if verify:
        v = verify_hf(model, tokenizer, out_dir)
        report += (f"\nverified with transformers: max |logit diff| {v['max_abs_logit_diff']:.2e} over "
                   f"{v['logit_positions']} positions (fp32); greedy {v['greedy_tokens']} tokens "
                   f"{'identical' if v['greedy_equal'] else 'DIFFERENT'}; AutoTokenizer ids "
                   f"{'identical' if v['tokenizer_ids_equal'] else 'DIFFERENT'}")
    return report


def import_hf_checkpoint(hf_dir: str, ckpt_path: str) -> str:
    """`python model.py import-hf`: a Hugging Face Llama directory -> a train.py-format checkpoint."""
    if pathlib.Path(ckpt_path).is_dir():
        raise ConfigError(f"--to {ckpt_path} is a directory; give a checkpoint file name such as "
                          f"{pathlib.Path(ckpt_path) / 'imported.pt'}")
    model, tokenizer = load_hf(hf_dir)
    if tokenizer is None:
        raise ConfigError(f"{pathlib.Path(hf_dir) / 'tokenizer.json'} not found; a checkpoint needs its tokenizer")
    save_imported_checkpoint(model, tokenizer, ckpt_path, str(hf_dir))
    return f"wrote {ckpt_path}: {model.num_params():,} parameters, vocab {len(tokenizer)}, from {hf_dir}"


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument in one line (exit code 2), without the usage block."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _in_range(kind=int, low=None, high=None, low_open=False, high_open=False):
    """argparse type: a finite int or float within the bounds (open ends with low_open/high_open).

    >>> _in_range(float, 0.0, 1.0, low_open=True)("0.5")
    0.5
    >>> _in_range(int, 0)("-1")
    Traceback (most recent call last):
    argparse.ArgumentTypeError: must be an integer >= 0, got '-1'
    """
    def show(x):
        return f"{x:g}" if isinstance(x, float) else str(x)
    bounds = [f"{'>' if low_open else '>='} {show(low)}" if low is not None else "",
              f"{'<' if high_open else '<='} {show(high)}" if high is not None else ""]
    rule = ("an integer " if kind is int else "a number ") + " and ".join(filter(None, bounds))

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            value = None
        if (value is None or not math.isfinite(value)
                or low is not None and (value < low or low_open and value == low)
                or high is not None and (value > high or high_open and value == high)):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text!r}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="model.py", description="The model: print the presets, time generation with a KV cache, "
                                                  "export to / import from the Hugging Face Llama layout.")
    parser.set_defaults(moe=8, top_k=2)
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    presets = sub.add_parser("presets", help="table of presets (the default): shape, parameters, FLOPs, memory")
    presets.add_argument("--moe", type=_in_range(int, 0, 4096), default=8, metavar="E",
                         help="also show each preset as a Mixture of Experts with E experts (0: don't)")
    presets.add_argument("--top-k", type=_in_range(int, 1, 4096), default=2, help="experts per token in that table")
    demo = sub.add_parser("demo", help="greedy generation from an untrained preset, with and without the KV cache")
    demo.add_argument("--model", choices=list(PRESETS), default="tiny")
    demo.add_argument("--tokens", type=_in_range(int, 1, 10_000), default=100,
                      help="new tokens (the uncached side recomputes the window per token: 1e4 is minutes on a CPU)")
    demo.add_argument("--seed", type=_in_range(int, 0, 2**32 - 1), default=0)
    export = sub.add_parser("export", help="write a checkpoint as a Hugging Face LlamaForCausalLM directory")
    export.add_argument("--ckpt", required=True, help="a train.py checkpoint file, or a run directory (its newest)")
    export.add_argument("--to", required=True, help="the directory to create (must not exist, or be empty)")
    export.add_argument("--verify", action="store_true", help="load the result with transformers and compare "
                        "logits, greedy tokens and tokenizer ids with ours")
    import_hf = sub.add_parser("import-hf", help="read a Hugging Face Llama directory into a train.py checkpoint")
    import_hf.add_argument("--from", dest="hf_dir", required=True, help="directory with config.json, "
                           "model.safetensors and tokenizer.json")
    import_hf.add_argument("--to", required=True, help="the checkpoint file to write")
    args = parser.parse_args(argv)
    if args.moe and args.top_k > args.moe:
        parser.error(f"argument --top-k: {args.top_k} experts per token, but --moe gives only {args.moe}")
    try:
        if args.command in (None, "presets"):
            print(preset_table())
            if args.moe:
                print(f"\nThe same presets as Mixtures of Experts: every FFN becomes {args.moe} experts, "
                      f"{args.top_k} active per token (memory of all, compute of the active):")
                print(preset_table({f"{k}-moe": dataclasses.replace(v, n_expert=args.moe, expert_top_k=args.top_k)
                                    for k, v in PRESETS.items()}))
            print("\nparams counts a tied LM head once; non-emb leaves out the token embedding and an untied head;"
                  "\nFLOPs/tok = 6 x (active matmul params) + 12 L T C, training, at T = ctx; "
                  f"train mem = {TRAINING_BYTES_PER_PARAM} B/param\n(AdamW, mixed precision), activations excluded.")
        elif args.command == "demo":
            print(demo_kv_cache(args.model, args.tokens, args.seed))
        elif args.command == "export":
            print(export_checkpoint(args.ckpt, args.to, args.verify))
        elif args.command == "import-hf":
            print(import_hf_checkpoint(args.hf_dir, args.to))
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:                          # unwritable --to, full disk: one line, not a traceback
        print(f"error: {e.filename or ''}: {e.strerror or e}; check the path and its permissions", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
