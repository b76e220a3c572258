"""A modern decoder-only Transformer in one file, read top to bottom.

The core comes first: GPTConfig, RMSNorm, RoPE, grouped-query attention, SwiGLU, the block, GPT
with forward and generate. Then the KV cache, Mixture of Experts, FlashAttention by hand, linear
attention and hybrids, the config's checks. docs/model.md tells why.

Depends on torch only (no sibling files).

Pretraining maximises log P(x_t | x_<t) at every position. The network that computes P is a stack of
L identical blocks over a residual stream of width C (`n_embd`):

    x = tok_emb[idx]                        # (B, T, C)  no position embedding: RoPE brings position
    for each block:
        x = x + attn(rmsnorm(x))            # tokens talk to earlier tokens
        x = x + ffn(rmsnorm(x))             # each token thinks on its own
    logits = lm_head(rmsnorm(x))            # (B, T, V)

Each choice is the one Llama-class models settled on:

* RMSNorm before each sub-layer, y = x / sqrt(mean(x^2) + eps) * g: the residual path stays an
  identity from the loss to the embeddings. [3, 4] has mean square 12.5: [0.849, 1.131].
* RoPE rotates each pair of q and k features by pos * theta^(-2i/d), so q.k depends on m - n only.
* Grouped-query attention: n_head query heads share n_kv_head K/V heads; the KV cache shrinks by
  n_head / n_kv_head. SwiGLU, w2(silu(w1 x) * w3 x), at 8/3 C costs what a 4 C MLP did.
* Mixture of Experts: E FFNs, top-k per token: the memory of all E, the compute of k.
* FlashAttention: exact attention over tiles with an online softmax, memory O(T), not O(T^2).
  Linear attention: a d x d state per head instead of a growing KV cache; "LLLA" mixes both.
* Stability, off by default: QK-norm (each head's q and k RMS-normalised: a bounded logit), a tanh
  soft-cap on the output logits, PaLM's z-loss holding log Z near 0 (docs/model.md#stability).

Accounting (scaling.py's count_params and count_flops_per_token): the 124m preset has 12 * 12 *
768^2 = 85M block parameters plus 50304 * 768 = 39M embedding parameters = 124M; training costs 6
FLOPs per parameter and token plus 12 L T C for the attention scores. `python model.py` prints
every preset of machinery/presets.py so.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class ConfigError(ValueError):
    """A model configuration or input that cannot work; the message names the field and the fix."""


# --------------------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class GPTConfig:
    """Shape and options of the model. Validated on creation, so a bad config fails before any
    tensor exists.

    >>> GPTConfig(n_layer=2, n_head=4, n_kv_head=2, n_embd=64).head_dim
    16
    >>> GPTConfig(n_embd=128).ffn_dim      # 8/3 * 128 = 341.3, rounded up to a multiple of 64
    384
    """

    vocab_size: int = 4096
    block_size: int = 256  # the longest sequence the model is trained on (and may see)
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 4  # = n_head: multi-head attention; 1: multi-query; in between: GQA
    n_embd: int = 128
    ffn_hidden: int = 0  # 0 = auto: 8/3 * n_embd rounded up to ffn_multiple_of
    ffn_multiple_of: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tie_embeddings: bool = True
    dropout: float = 0.0
    n_expert: int = 0  # 0 = dense FFN; E > 0 = Mixture of Experts with E experts per layer
    expert_top_k: int = 2
    # slots per expert = factor * tokens * k / E; 0 = never drop a token
    moe_capacity_factor: float = 1.25
    moe_aux_coef: float = 0.01  # train.py adds moe_aux_coef * model.aux_loss to the loss
    activation_checkpointing: bool = False
    attention: str = "sdpa"  # "sdpa": the fused kernel; "flash": FlashAttention2 by hand (a lesson)
    layer_pattern: str = ""  # "" = all attention; else A (attention) / L (linear), tiled: "LLLA"
    qk_norm: bool = False  # RMSNorm each head's q and k before RoPE (Attention says why)
    logit_softcap: float = 0.0  # 0 = off; c > 0: logits = c * tanh(logits / c) (Gemma 2: 30)
    z_loss: float = 0.0  # 0 = off; loss += z_loss * mean(logsumexp(logits)^2) (PaLM: 1e-4)

    def __post_init__(self):
        check_config(self)  # the rules and their messages: see the appendix

    # Derived sizes ----------------------------------------------------------------------------

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def ffn_dim(self) -> int:
        """Hidden width of one SwiGLU FFN (or of one expert)."""
        if self.ffn_hidden:
            return self.ffn_hidden
        multiple = self.ffn_multiple_of
        return math.ceil(8 * self.n_embd / 3 / multiple) * multiple  # rounded up: 341.3 -> 384

    @property
    def layer_kinds(self) -> str:
        """One letter per layer, the pattern tiled: A attention, L linear attention.

        >>> GPTConfig(n_layer=4, layer_pattern="LA").layer_kinds
        'LALA'
        """
        pattern = self.layer_pattern or "A"
        return pattern * (self.n_layer // len(pattern))

    # Checkpoint round trip --------------------------------------------------------------------

    @classmethod
    def from_dict(cls, d: dict) -> "GPTConfig":
        """Inverse of dataclasses.asdict (a checkpoint's); an unknown key means another model's."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"GPTConfig: unknown field(s) {unknown}; known: {sorted(known)}")
        return cls(**d)


# --------------------------------------------------------------------------------------------------
# Building blocks, in the order of the lesson
# --------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x^2) + eps) * weight on the last dim; mean square in fp32, y in x's dtype.

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
        return normed.type_as(x) * self.weight.type_as(x)


def rope_angles(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the RoPE angles pos * theta^(-2i/head_dim) for i < head_dim/2, each (T,
    head_dim/2), computed on the fly in fp32: no buffer to keep in sync with device, dtype or cache.

    >>> cos, sin = rope_angles(torch.tensor([0, 1]), 4, 10000.0)    # 1 and 0.01 rad per position
    >>> sin
    tensor([[0.0000, 0.0000],
            [0.8415, 0.0100]])
    """
    inv_freq = theta ** (
        -torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    )
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (T, head_dim/2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate each adjacent pair (x_2i, x_2i+1) of x (B, T, heads, head_dim) by its angle (cos, sin:
    (T, head_dim/2)).

    Interleaved pairs, as in RoFormer, Llama and CS336 (Hugging Face rotates the halves (x_i,
    x_{i+d/2}): the same after permuting wq's and wk's features, see machinery/hf.py).

        [x0, x1] at angle a  ->  [x0 cos a - x1 sin a,  x0 sin a + x1 cos a]
    """
    B, T, n, d = x.shape
    pairs = x.float().reshape(B, T, n, d // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]  # (B, T, n, d/2)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, T, 1, d/2)
    rotated = torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1)
    return rotated.reshape(B, T, n, d).type_as(x)


def fused_linear(x: torch.Tensor, *linears: nn.Module) -> tuple[torch.Tensor, ...]:
    """Bias-free linears that read the same x, as one matmul on their stacked weights; the output is
    split by their row counts (a TP shard's own). The parameters stay apart, as checkpoints want.

    >>> a, b, x = nn.Linear(4, 2, bias=False), nn.Linear(4, 3, bias=False), torch.randn(5, 4)
    >>> [torch.allclose(y, linear(x)) for y, linear in zip(fused_linear(x, a, b), (a, b))]
    [True, True]
    """
    weights = [linear.weight for linear in linears]
    return F.linear(x, torch.cat(weights)).split([w.shape[0] for w in weights], dim=-1)


# Where F.scaled_dot_product_attention reads grouped K/V heads in place (enable_gqa=True: query
# head j reads kv head j // group, nothing copied): device type -> (the dtypes it does so for,
# whether with an explicit mask too). Elsewhere causal_attention copies K/V to n_head heads first
# (read off torch 2.13's dispatch: docs/model.md says which kernel takes the groups where).
SDPA_GQA_IN_PLACE = {
    "cpu": ((torch.float32, torch.float64, torch.bfloat16, torch.float16), True),
    "cuda": ((torch.float16, torch.bfloat16), False),
}


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v with q (..., h, Tq, d) and k, v (..., h_kv, Tk, d), Tq <=
    Tk, e.g. (B, h, T, d); h_kv divides h (GQA: query head j reads kv head j // (h / h_kv)).

    `mask`: boolean, broadcastable to (..., Tq, Tk), True where a query may see a key; None means
    causal, the queries being the last Tq of the Tk positions (a KV cache holds the first Tk - Tq):
    Tq == Tk is is_causal, Tq == 1 needs no mask, else a bottom-right-aligned mask. K/V are copied
    to h heads only where SDPA_GQA_IN_PLACE says the kernel would not read the groups in place: 8
    query heads over 2 kv heads on a GPU in fp32 copy 2 x 4 heads of K/V, on the CPU none.
    """
    Tq, Tk, group = q.shape[-2], k.shape[-2], q.shape[-3] // k.shape[-3]
    if mask is None and 1 < Tq < Tk:
        query_pos = torch.arange(Tk - Tq, Tk, device=q.device)[:, None]
        key_pos = torch.arange(Tk, device=q.device)[None, :]
        mask = key_pos <= query_pos
    dtypes, with_mask = SDPA_GQA_IN_PLACE.get(q.device.type, ((), False))
    if group > 1 and not (q.dtype in dtypes and (with_mask or mask is None)):
        # (..., h, Tk, d); with an int, repeat_interleave is a stride-0 expand and one plain copy
        k, v = (t.repeat_interleave(group, dim=-3) for t in (k, v))
    is_causal = mask is None and Tq == Tk
    enable_gqa = k.shape[-3] != q.shape[-3]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, enable_gqa=enable_gqa
    )


class Attention(nn.Module):
    """Causal self-attention with RoPE and grouped-query heads.

    `n_head`, `n_kv_head` and `head_dim` are plain attributes read by forward, so a tensor-parallel
    copy that keeps a slice of the heads only has to shrink wq/wk/wv/wo and set its local head
    counts.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim, self.rope_theta = config.head_dim, config.rope_theta
        self.dropout = config.dropout
        self.flash = config.attention == "flash"
        C = config.n_embd
        self.wq = nn.Linear(C, self.n_head * self.head_dim, bias=False)
        self.wk = nn.Linear(C, self.n_kv_head * self.head_dim, bias=False)
        self.wv = nn.Linear(C, self.n_kv_head * self.head_dim, bias=False)
        self.wo = nn.Linear(self.n_head * self.head_dim, C, bias=False)
        # Context parallel (model_parallel.py) sets both: the absolute positions (T,) of this rank's
        # tokens, and ring attention for causal_attention, fed K/V at n_kv_head heads: less to send.
        self.positions, self.attend = None, None
        # QK-norm: with unit gains |q| = |k| = sqrt(d), so |q.k| / sqrt(d) <= sqrt(d): 4 at d = 16,
        # where one key at 4 among 127 at 0 gets only e^4 / (e^4 + 127) = 0.30 of the attention
        # (a parameter-free QK-norm cost Muon 0.13 nats in issue 48's pilot). The learned gains
        # (head_dim,), shared by the heads, are the logit scale that lifts the bound.
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            self.q_norm, self.k_norm = (RMSNorm(self.head_dim, config.norm_eps) for _ in range(2))

    def forward(self, x: torch.Tensor, cache: LayerKV | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        qkv = fused_linear(x, self.wq, self.wk, self.wv)  # one matmul
        q, k, v = (t.view(B, T, -1, self.head_dim) for t in qkv)  # (B, T, h or h_kv, d)
        v = v.contiguous()  # its own bytes: saved as a view of qkv, it would keep all of qkv alive
        if self.q_norm is not None:  # before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        positions = self.positions
        if positions is None:
            start = 0 if cache is None else cache.start
            positions = torch.arange(start, start + T, device=x.device)
        cos, sin = rope_angles(positions, self.head_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, heads, T, d)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, h_kv, start + T, d)
        if self.attend is not None:
            y = self.attend(q, k, v)  # (B, h, T, d)
        elif self.flash and cache is None:
            # GQA without a copy: the query heads as (B, h_kv, group, T, d) against K/V
            # (B, h_kv, 1, T, d), which the tiles' matmuls broadcast over the group
            y = flash_attention(
                q.unflatten(1, (self.n_kv_head, -1)), k.unsqueeze(2), v.unsqueeze(2), True
            ).flatten(1, 2)  # (B, h, T, d)
        else:
            y = causal_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return self.wo(y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim))


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x), silu(z) = z sigmoid(z): a gated feed-forward layer (Shazeer 2020)."""

    def __init__(self, n_embd: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(n_embd, hidden, bias=False)  # gate
        self.w3 = nn.Linear(n_embd, hidden, bias=False)  # value
        self.w2 = nn.Linear(hidden, n_embd, bias=False)  # back to the residual stream

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, value = fused_linear(x, self.w1, self.w3)  # one matmul
        return self.w2(F.silu(gate) * value)


class Block(nn.Module):
    """x + attn(attn_norm(x)), then x + ffn(ffn_norm(x)): self-contained (RoPE comes from the
    positions), the unit pipeline parallel moves. Activation checkpointing keeps only the input and
    recomputes the inside in backward (~1/3 more compute for most of the activation memory).
    `self.aux_loss`: the MoE load-balancing loss of the last forward (0 when dense)."""

    def __init__(self, config: GPTConfig, kind: str = "A"):
        super().__init__()
        self.attn_norm = RMSNorm(config.n_embd, config.norm_eps)
        self.attn = LinearAttention(config) if kind == "L" else Attention(config)
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
            self.aux_loss = aux_loss  # recorded outside the checkpointed function
        return x

    def _residual_updates(
        self, x: torch.Tensor, cache: LayerKV | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block's math, side-effect free: (B, T, C) -> (B, T, C), MoE loss (None if dense)."""
        x = x + self.resid_dropout(self.attn(self.attn_norm(x), cache))
        aux_loss = None
        if isinstance(self.ffn, MoE):
            update, aux_loss = self.ffn(self.ffn_norm(x))
        else:
            update = self.ffn(self.ffn_norm(x))
        return x + self.resid_dropout(update), aux_loss


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------


class GPT(nn.Module):
    """Decoder-only Transformer, embed -> blocks -> head: forward(idx, targets) -> logits, loss."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.n_embd)
        self.emb_dropout = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, kind) for kind in config.layer_kinds)
        self.norm = RMSNorm(config.n_embd, config.norm_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight  # one (V, C) matrix: tokens in and out
        self.aux_loss = torch.zeros(())
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module):
        """N(0, 0.02) everywhere; residual-stream writers (wo, w2) get 0.02 / sqrt(2 * n_layer)."""
        std, residual_std = 0.02, 0.02 / math.sqrt(2 * self.config.n_layer)
        if isinstance(module, (Attention, LinearAttention, SwiGLU, MoE)):
            for name, weight in module.named_parameters():  # "wq.weight", ...; MoE's "w1", ...
                if weight.dim() > 1:  # not the gate bias (set there) nor QK-norm's gains (ones)
                    writes_residual = name.split(".")[0] in ("wo", "w2")
                    nn.init.normal_(weight, 0.0, residual_std if writes_residual else std)
        elif isinstance(module, nn.Embedding) or (
            module is self.lm_head and not self.config.tie_embeddings
        ):
            nn.init.normal_(module.weight, 0.0, std)  # the embedding, and an untied head

    # Stage pieces for pipeline parallel: embed (first stage), blocks (between), head (last stage).

    def embed(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids (B, T) -> residual stream (B, T, C), in bf16 under bf16 autocast like every
        activation between matmuls. Checks the ids and the length (skipped while compiling)."""
        if not torch.compiler.is_compiling():
            self._check_input(idx)
        x = self.emb_dropout(self.tok_emb(idx))  # (B, T, C)
        device = idx.device.type
        if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
            x = x.to(torch.get_autocast_dtype(device))  # "meta" has no autocast
        return x

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Residual stream (B, T, C) -> logits (B, T, V): final RMSNorm then the LM head; with
        logit_softcap c, c * tanh(logits / c): |logits| < c, near the identity well below c."""
        logits = self.lm_head(self.norm(x))
        cap = self.config.logit_softcap
        return cap * torch.tanh(logits / cap) if cap else logits

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """idx (B, T) -> logits (B, T, V) and, with targets (B, T), the mean cross-entropy
        (ignore_index -1), plus the z-loss when config.z_loss > 0 and the model is training.

        The MoE load-balancing loss of this forward is left in `self.aux_loss` (0-dim; 0 for a dense
        model). With a kv_cache the tokens continue the cached sequence (generation); the cache is
        advanced by T.
        """
        if kv_cache is not None:
            self._check_cache(kv_cache)
        x = self.embed(idx)  # (B, T, C)
        for i, block in enumerate(self.blocks):
            x = block(x, None if kv_cache is None else kv_cache.layers[i])  # (B, T, C)
        if kv_cache is not None:
            kv_cache.length += idx.shape[1]
        if self.config.n_expert:
            self.aux_loss = torch.stack([block.aux_loss for block in self.blocks]).sum()
        logits = self.head(x)  # (B, T, V)
        loss = None
        if targets is not None:
            # The loss's one fp32 copy of the logits (B, T, V), kept on purpose: in bf16 the loss
            # itself would round to bf16's spacing, 1/32 for a loss between 4 and 8 (0.06 off at
            # loss 9.5 over 4,096 ids, measured). Under autocast cross_entropy would make this very
            # cast itself; in fp32 it is no copy. The logits returned stay in the compute dtype.
            flat = logits.float().view(-1, logits.size(-1))  # (B*T, V)
            loss = F.cross_entropy(flat, targets.reshape(-1), ignore_index=-1)
            if self.config.z_loss and self.training:  # eval: the cross-entropy alone, comparable
                # PaLM's z-loss: softmax ignores a shift of all logits, so log Z may drift (at init
                # log Z = ln 4096 = 8.3, costing 1e-4 * 8.3^2 = 0.007 nats); z log Z^2 pins it at 0
                log_z = flat.logsumexp(-1)[targets.reshape(-1) != -1]  # (positions with a target,)
                loss = loss + self.config.z_loss * log_z.pow(2).mean()
        return logits, loss

    # Generation
    # -------------------------------------------------------------------------------------------

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend idx (B, T) by max_new_tokens sampled tokens -> (B, T + max_new_tokens), KV-cached.

        temperature 0 is greedy; top_k keeps the k most likely. The prompt's last block_size tokens
        fill the cache in one forward, then each step feeds one token; past block_size the window
        slides (see KVCache).
        """
        for bad, message in (
            (max_new_tokens < 0, f"max_new_tokens must be >= 0, got {max_new_tokens}"),
            (temperature < 0, f"temperature must be >= 0 (0 = greedy), got {temperature}"),
            (top_k is not None and top_k < 1, f"top_k must be >= 1 or None, got {top_k}"),
        ):
            if bad:
                raise ConfigError(message)
        was_training = self.training
        self.eval()
        cfg, batch, dtype = self.config, idx.shape[0], self.tok_emb.weight.dtype
        kv_heads = next((b.attn.n_kv_head for b in self.blocks if isinstance(b.attn, Attention)), 1)
        kinds = cfg.layer_kinds  # buffers for the attention layers, a state for the linear ones
        cache = KVCache(
            cfg.n_layer, batch, kv_heads, cfg.block_size, cfg.head_dim, idx.device, dtype, kinds
        )
        pending = idx[:, -cfg.block_size :]  # ids not yet cached: the prompt
        for _ in range(max_new_tokens):
            logits, _ = self(pending, kv_cache=cache)
            next_token = sample(logits[:, -1, :], temperature, top_k, generator)  # (B, 1)
            idx = torch.cat((idx, next_token), dim=1)
            pending = next_token
        self.train(was_training)
        return idx

    # The input checks of embed and forward
    # -------------------------------------------------------------------------------------------

    def _check_input(self, idx: torch.Tensor):
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ConfigError(
                f"idx must be an integer tensor of shape (batch, time), got {tuple(idx.shape)} "
                f"{idx.dtype}; pass token ids as torch.long"
            )
        if idx.shape[1] > self.config.block_size:
            raise ConfigError(
                f"sequence length {idx.shape[1]} exceeds block_size={self.config.block_size}; "
                f"crop the input to its last block_size tokens or use a larger block_size"
            )
        # The id range is checked where the ids already live on the host. On a GPU, reading min and
        # max back would stop the CPU twice per forward until the GPU catches up (two device-to-host
        # syncs), so the queue of kernels runs dry every step; there an out-of-range id stops the
        # embedding with CUDA's device-side assert (the tokenizer that set vocab_size made the ids).
        if idx.device.type == "cpu" and idx.numel():
            low, high = (int(v) for v in torch.aminmax(idx))
            if low < 0 or high >= self.config.vocab_size:
                raise ConfigError(
                    f"token ids must lie in [0, vocab_size={self.config.vocab_size}), got "
                    f"[{low}, {high}]; set vocab_size to the tokenizer's size"
                )

    def _check_cache(self, kv_cache: KVCache):
        if kv_cache.max_len > self.config.block_size:
            raise ConfigError(
                f"a KV cache of {kv_cache.max_len} tokens would let attention reach past "
                f"block_size={self.config.block_size}; make the cache block_size long at most"
            )

    def num_params(self, non_embedding: bool = False) -> int:
        """Parameters counted on the built tensors (a tied head once): the oracle of the closed
        form, scaling.count_params (tests/test_model.py counts a MoE's active ones from these)."""
        total = sum(p.numel() for p in self.parameters())
        if non_embedding:
            # the embedding and an untied head; a set holds a tied (V, C) matrix once
            total -= sum(w.numel() for w in {self.tok_emb.weight, self.lm_head.weight})
        return total


def sample(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """One token per row of logits (B, V) -> (B, 1). temperature 0 = argmax; top_k: the k best."""
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    logits = logits.float() / temperature
    if top_k is not None:
        kth_best = torch.topk(logits, min(top_k, logits.size(-1)), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)


# --------------------------------------------------------------------------------------------------
# Generation's memory: the KV cache (and a linear layer's state)
# --------------------------------------------------------------------------------------------------


class KVCache:
    """Keys and values of the last `max_len` tokens of one sequence batch, one entry per layer: a
    rolling window.

    Each layer's buffer is (B, n_kv_head, max_len, head_dim), allocated once (n_kv_head, not
    n_head: GQA's saving). Position p lives in slot p % max_len: a ring buffer, nothing is copied.
    Keys are stored already rotated at their absolute positions and q.k depends on m - n only, so
    the window slides without recomputing: sliding-window attention past block_size (docs/model.md).

    >>> cache = KVCache(n_layer=1, batch=1, n_kv_head=1, max_len=4, head_dim=1)
    >>> layer, prompt = cache.layers[0], torch.arange(4.0).view(1, 1, 4, 1)    # positions 0..3
    >>> _ = layer.append(prompt, prompt)
    >>> cache.length = 4                        # what GPT.forward does after the prompt
    >>> k, v = layer.append(torch.full((1, 1, 1, 1), 4.0), prompt[:, :, :1])
    >>> k.flatten()                             # position 4 took slot 4 % 4 = 0, position 0's
    tensor([4., 1., 2., 3.])
    """

    def __init__(
        self,
        n_layer: int,
        batch: int,
        n_kv_head: int,
        max_len: int,
        head_dim: int,
        device=None,
        dtype=torch.float32,
        kinds: str | None = None,
    ):
        # one view per layer; only attention layers get buffers (kinds: GPTConfig.layer_kinds)
        shape = (batch, n_kv_head, max_len, head_dim)
        self.layers = [
            LayerKV(self, shape if kind == "A" else None, device, dtype)
            for kind in kinds or "A" * n_layer
        ]
        self.max_len = max_len
        self.length = 0  # tokens seen so far, i.e. the absolute position of the next token


class LayerKV:
    """One layer's part of a KVCache: an attention layer's key/value buffers (`append` adds new
    ones, returns all), or a linear layer's recurrent `state` (B, h, d, d), None at first."""

    def __init__(self, cache: KVCache, shape: tuple | None, device=None, dtype=torch.float32):
        self.cache = cache
        # an attention layer's two (B, n_kv_head, max_len, head_dim) buffers; none in a linear one
        self.k, self.v = [
            None if shape is None else torch.zeros(shape, device=device, dtype=dtype)
            for _ in range(2)
        ]
        self.state = None

    @property
    def start(self) -> int:
        """Absolute position of the first new token (RoPE rotates by it)."""
        return self.cache.length

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: (B, n_kv_head, T_new, head_dim) -> the keys/values held, (B, n_kv_head, min(start +
        T_new, max_len), d).

        Several tokens at once must fit the window in order (a prompt); one token at a time may wrap
        around.
        """
        cache, T_new = self.cache, k.shape[2]
        if T_new > 1 and self.start + T_new > cache.max_len:
            raise ConfigError(
                f"KV cache holds {cache.max_len} tokens and {self.start} are cached: {T_new} new "
                f"ones at once do not fit; feed them one at a time (the window slides) or start a "
                f"new cache"
            )
        lo = self.start % cache.max_len  # the slot; = start while the window is not yet full
        self.k[:, :, lo : lo + T_new] = k
        self.v[:, :, lo : lo + T_new] = v
        held = min(self.start + T_new, cache.max_len)
        return self.k[:, :, :held], self.v[:, :, :held]


# --------------------------------------------------------------------------------------------------
# Mixture of Experts: E FFNs, k of them per token
# --------------------------------------------------------------------------------------------------


class MoE(nn.Module):
    """A Mixture of Experts in place of the FFN: E SwiGLU experts, top-k routing per token, fixed
    capacity.

    Routing: p = softmax(router(x)); each token goes to its k most probable experts, their outputs
    summed with weights p (not renormalised: with k = 1 the router still gets a gradient).
    Capacity: each expert takes at most ceil(factor * N * k / E) of the N tokens, first choices
    first; the rest are dropped (the residual passes through). Fixed capacity keeps every shape
    static: one graph, one batched matmul (E, capacity, C). factor 0 and eval mode drop nothing.
    Load balancing (Switch): aux = E * sum_e f_e * P_e, 1 when uniform, E when collapsed; forward
    returns it (a pure function checkpoints under torch.compile), the Block records it.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        C, H, E = config.n_embd, config.ffn_dim, config.n_expert
        self.n_expert, self.top_k = E, config.expert_top_k
        self.capacity_factor = config.moe_capacity_factor
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
        return min(
            n_tokens, math.ceil(self.capacity_factor * n_tokens * self.top_k / self.n_expert)
        )

    def experts(self, x: torch.Tensor) -> torch.Tensor:
        """Every expert on its slots, one batched matmul: (E, cap, C) -> (E, cap, C). Expert
        parallel (model_parallel.py) puts an all-to-all on each side, over the rank's experts."""
        return (F.silu(x @ self.w1) * (x @ self.w3)) @ self.w2  # hidden (E, cap, H)

    def balance_stats(
        self, fraction: torch.Tensor, mean_prob: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """f_e and P_e of this batch; expert parallel averages them over every rank's batch."""
        return fraction, mean_prob

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> (output (B, T, C), load-balancing loss (0-dim))."""
        B, T, C = x.shape
        E, k = self.n_expert, self.top_k
        tokens = x.reshape(B * T, C)  # (N, C)
        N = tokens.shape[0]
        probs = F.softmax(self.router(tokens).float(), dim=-1)  # (N, E)
        gate, expert = probs.topk(k, dim=-1)  # (N, k) each

        # Order the N*k assignments choice-major (all first choices, then all second choices), so a
        # full expert drops second choices before first ones.
        expert = expert.t().reshape(-1)  # (k*N,)
        gate = gate.t().reshape(-1)  # (k*N,)
        chosen = F.one_hot(expert, E)  # (k*N, E)
        slot_in_expert = (chosen.cumsum(0) * chosen).sum(-1) - 1  # rank of this assignment, (k*N,)
        cap = self.capacity(N) if self.training else N  # inference never drops
        kept = slot_in_expert < cap
        # Flat slot in an (E * cap + 1, C) buffer; dropped assignments land in the spare last row.
        slot = torch.where(kept, expert * cap + slot_in_expert, torch.full_like(expert, E * cap))

        inputs = tokens.new_zeros(E * cap + 1, C)
        inputs.index_copy_(0, slot, tokens.repeat(k, 1))  # kept slots are unique
        expert_out = self.experts(inputs[:-1].view(E, cap, C))  # (E, cap, C)
        expert_out = torch.cat((expert_out.view(E * cap, C), tokens.new_zeros(1, C)))  # +1 row
        weighted = expert_out[slot] * (gate * kept).unsqueeze(-1).to(x.dtype)  # (k*N, C)
        y = weighted.view(k, N, C).sum(0)

        # f_e and P_e, each summing to 1
        fraction, mean_prob = self.balance_stats(chosen.float().mean(0), probs.mean(0))
        aux_loss = E * (fraction * mean_prob).sum()
        return y.view(B, T, C), aux_loss


# --------------------------------------------------------------------------------------------------
# Attention's cost: FlashAttention by hand, linear attention (see the docstring's section)
# --------------------------------------------------------------------------------------------------


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernel keeps its sums in: fp32 for bf16/fp16/fp32 inputs, fp64 for fp64. A bf16
    running sum stops growing once it is 256 times the next term (8 bits of mantissa), so the real
    kernels read bf16 tiles but accumulate in fp32 registers and round once, at the end."""
    return torch.promote_types(dtype, torch.float32)


def _key_tiles(i: int, Tk: int, tile: int, is_causal: bool) -> range:
    """Starts of the key tiles the query tile at i needs: all, or (causal) those not after it."""
    return range(0, min(Tk, i + tile) if is_causal else Tk, tile)


def _tile_scores(q_tile: torch.Tensor, k: torch.Tensor, i: int, j: int, tile: int, is_causal: bool):
    """Scores of the (already scaled) query tile at i against the key tile at j: (..., bq, bk), in
    q_tile's dtype (k's tile cast to it); causal masks keys after their query (SDPA's is_causal)."""
    s = q_tile @ k[..., j : j + tile, :].to(q_tile.dtype).transpose(-1, -2)  # (..., bq, bk)
    if is_causal and j + tile > i:
        rows = torch.arange(i, i + s.shape[-2], device=s.device)[:, None]
        cols = torch.arange(j, j + s.shape[-1], device=s.device)[None, :]
        s = s.masked_fill(cols > rows, -math.inf)
    return s


def online_softmax_update(
    m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor, s: torch.Tensor, v_tile: torch.Tensor
):
    """One key tile's step of the online softmax: the running max m (..., bq), the running sum l
    (..., bq) of exp(s - m) and the running output acc (..., bq, d) of exp(s - m) v, all in the
    accumulator dtype, updated with the scores s (..., bq, bk) of this tile's keys and their values
    v_tile (..., bk, d), cast to acc's dtype. Every row needs a finite score in its first tile (else
    exp(-inf - -inf) is nan). Start at m = -inf, l = 0, acc = 0; end with online_softmax_result."""
    m_new = torch.maximum(m, s.amax(-1))
    p = torch.exp(s - m_new[..., None])  # (..., bq, bk)
    rescale = torch.exp(m - m_new)  # the old sums were relative to the old max
    l = rescale * l + p.sum(-1)
    acc = rescale[..., None] * acc + p @ v_tile.to(acc.dtype)
    return m_new, l, acc


def online_softmax_result(m: torch.Tensor, l: torch.Tensor, acc: torch.Tensor):
    """acc / l (..., bq, d), the weighted output, and m + log l (..., bq): backward's lse."""
    return acc / l[..., None], m + torch.log(l)


# The two loops as custom operators: torch.compile sees each as one opaque node instead of unrolling
# the tiles, which grows the graph as (T / tile)^2 (4,150 forward and 9,524 backward nodes at T =
# 1,024). FlashAttention2 below is their derivative: neither operator has one of its own. Each
# `register_fake` gives the compiler its outputs' shapes and dtypes (empty tensors, no arithmetic).
@torch.library.custom_op("pretrain::flash_attention_forward", mutates_args=())
def _flash_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, tile: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tiled forward: out (..., Tq, d) in q's dtype, lse (..., Tq) in the accumulator dtype."""
    scale, Tq, Tk = q.shape[-1] ** -0.5, q.shape[-2], k.shape[-2]
    dtype = accumulator_dtype(q.dtype)
    out = q.new_empty(q.shape)
    lse = q.new_empty(q.shape[:-1], dtype=dtype)
    for i in range(0, Tq, tile):
        q_tile = q[..., i : i + tile, :].to(dtype) * scale  # (..., bq, d)
        m = q_tile.new_full(q_tile.shape[:-1], -math.inf)
        l = q_tile.new_zeros(q_tile.shape[:-1])
        acc = torch.zeros_like(q_tile)
        for j in _key_tiles(i, Tk, tile, is_causal):
            s = _tile_scores(q_tile, k, i, j, tile, is_causal)  # (..., bq, bk)
            m, l, acc = online_softmax_update(m, l, acc, s, v[..., j : j + tile, :])
        out_tile, lse_tile = online_softmax_result(m, l, acc)
        # rounded to the input dtype once, here
        out[..., i : i + tile, :] = out_tile
        lse[..., i : i + tile] = lse_tile
    return out, lse


@_flash_forward.register_fake
def _flash_forward_shapes(q, k, v, is_causal, tile):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=accumulator_dtype(q.dtype))


@torch.library.custom_op("pretrain::flash_attention_backward", mutates_args=())
def _flash_backward(
    d_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    is_causal: bool,
    tile: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """With P = exp(S - lse) recomputed per tile: dV = P^T dO, dP = dO V^T,
    dS = P * (dP - rowsum(dO * O)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d)
    (rowsum(dP * P) = rowsum(dO * O): one number per query). The three gradients are summed over
    the tiles in the accumulator dtype and rounded to their inputs' dtypes at the end."""
    scale, dtype = q.shape[-1] ** -0.5, accumulator_dtype(q.dtype)
    delta = (d_out.to(dtype) * out.to(dtype)).sum(-1)  # (..., Tq)
    dq, dk, dv = (torch.zeros(x.shape, dtype=dtype, device=x.device) for x in (q, k, v))
    for i in range(0, q.shape[-2], tile):
        rows = slice(i, i + tile)
        q_tile = q[..., rows, :].to(dtype) * scale  # (..., bq, d)
        d_out_tile = d_out[..., rows, :].to(dtype)  # (..., bq, d)
        for j in _key_tiles(i, k.shape[-2], tile, is_causal):
            cols = slice(j, j + tile)
            p = torch.exp(
                _tile_scores(q_tile, k, i, j, tile, is_causal)  # P, recomputed
                - lse[..., rows, None]
            )
            # GQA (k, v (..., 1, Tk, d), q (..., group, Tq, d)): sum_to_size adds up a group's terms
            dv[..., cols, :] += (p.transpose(-1, -2) @ d_out_tile).sum_to_size(
                dv[..., cols, :].shape
            )
            # dS = P (dP - D)
            ds = p * (
                d_out_tile @ v[..., cols, :].to(dtype).transpose(-1, -2) - delta[..., rows, None]
            )
            dq[..., rows, :] += ds @ k[..., cols, :].to(dtype) * scale
            dk[..., cols, :] += (ds.transpose(-1, -2) @ q_tile).sum_to_size(dk[..., cols, :].shape)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@_flash_backward.register_fake
def _flash_backward_shapes(d_out, q, k, v, out, lse, is_causal, tile):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


class FlashAttention2(torch.autograd.Function):
    """softmax(q k^T / sqrt(d)) v over tiles, never holding the T x T matrix (FlashAttention-2).

    q (..., Tq, d), k and v (..., Tk, d), which may have size 1 where q has more (GQA's q (B, h_kv,
    group, T, d) over k, v (B, h_kv, 1, T, d): no copy). Saved for backward: q, k, v, the output and
    one log-sum-exp per query, O(T). Sums in the accumulator dtype; results in the inputs' dtypes.

    >>> q, k, v = torch.randn(3, 1, 2, 5, 4).unbind(0)
    >>> fused = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    >>> torch.allclose(flash_attention(q, k, v, True, 2), fused, atol=1e-6)
    True
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal: bool = False, tile: int = 64):
        out, lse = _flash_forward(q, k, v, is_causal, tile)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal, ctx.tile = is_causal, tile
        return out

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _flash_backward(d_out, q, k, v, out, lse, ctx.is_causal, ctx.tile)
        return dq, dk, dv, None, None


flash_attention = FlashAttention2.apply


def linear_attention_recurrent(q, k, v, log_a, state=None):
    """Linear attention token by token (generation): S_t = a_t S_t-1 + k_t^T v_t, o_t = q_t S_t

    q, k, v (B, h, T, d), log_a (B, h, T) the log of the forget gate a_t in (0, 1), state (B, h, d,
    d) or None -> (o (B, h, T, d), the last state). The state is all the layer remembers: d x d
    numbers per head.
    """
    S = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if state is None else state
    outs = []
    for t in range(q.shape[2]):
        # (B, h, d, d)
        S = log_a[:, :, t, None, None].exp() * S + k[:, :, t, :, None] * v[:, :, t, None, :]
        outs.append((q[:, :, t, None, :] @ S).squeeze(2))  # (B, h, d)
    return torch.stack(outs, dim=2), S


def linear_attention_chunked(q, k, v, log_a, state=None, chunk: int = 64):
    """The same outputs a chunk at a time (what training runs): matmuls, not T sequential steps.

    Inside a chunk, with b_t = log a_c + ... + log a_t the cumulative log gate from its start c:
        o_t = sum_{s <= t} (q_t . k_s) exp(b_t - b_s) v_s + exp(b_t) q_t S_prev
        S = exp(b_last) S_prev + sum_s exp(b_last - b_s) k_s^T v_s      (the next chunk's state)
    """
    S = q.new_zeros(*q.shape[:2], q.shape[-1], v.shape[-1]) if state is None else state
    outs = []
    for c in range(0, q.shape[2], chunk):
        qc, kc, vc = (t[:, :, c : c + chunk] for t in (q, k, v))  # (B, h, n, d)
        b = log_a[:, :, c : c + chunk].cumsum(-1)  # (B, h, n)
        n = b.shape[-1]
        later = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)  # s > t: the future
        # (B, h, n, n)
        decay = (b[..., :, None] - b[..., None, :]).masked_fill(later, -math.inf).exp()
        outs.append(((qc @ kc.transpose(-1, -2)) * decay) @ vc + (qc * b[..., None].exp()) @ S)
        S = (
            b[..., -1, None, None].exp() * S
            + (kc * (b[..., -1:] - b).exp()[..., None]).transpose(-1, -2) @ vc
        )  # (B, h, d, d)
    return torch.cat(outs, dim=2), S


class LinearAttention(nn.Module):
    """Gated linear attention, one forget gate per head and token (the scalar gate of Mamba-2,
    RetNet with a learned decay, GLA simplified). Why this form: plain linear attention never
    forgets, so its state fills with noise; a data-dependent scalar gate is the smallest fix, and
    being a scalar per token keeps the chunked form a masked matmul (DeltaNet's better recall needs
    a WY-transform to chunk). q and k are L2-normalised (no softmax bounds them); no RoPE: the
    gate's decay is what tells near from far.
    """

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head, self.head_dim = config.n_head, config.head_dim
        C, width = config.n_embd, config.n_head * config.head_dim
        self.wq, self.wk, self.wv = (nn.Linear(C, width, bias=False) for _ in range(3))
        self.wg = nn.Linear(C, self.n_head)  # forget gate logits; bias 3: a = 0.95 at the start
        self.wo = nn.Linear(width, C, bias=False)
        nn.init.constant_(self.wg.bias, 3.0)

    def forward(self, x: torch.Tensor, cache: LayerKV | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q, k, v = (
            t.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
            for t in fused_linear(x, self.wq, self.wk, self.wv)
        )  # (B, h, T, d)
        log_a = F.logsigmoid(self.wg(x).float()).transpose(1, 2)  # (B, h, T), < 0
        form = linear_attention_recurrent if T == 1 else linear_attention_chunked
        y, state = form(
            F.normalize(q, dim=-1),
            F.normalize(k, dim=-1),
            v,
            log_a.type_as(self.wg.weight),  # fp32 under autocast: the gates' sums need it
            None if cache is None else cache.state,
        )  # (B, h, T, d)
        if cache is not None:
            cache.state = state
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))


# --------------------------------------------------------------------------------------------------
# The config's checks (GPTConfig.__post_init__ runs them)
# --------------------------------------------------------------------------------------------------


def check_config(c: GPTConfig) -> None:
    """The first rule broken, as one ConfigError naming the field and the fix.

    >>> GPTConfig(dropout=1.0)
    Traceback (most recent call last):
    model.ConfigError: GPTConfig.dropout: must be in [0, 1), got 1.0
    """
    # The integers first: the rules below divide by them (0 = auto FFN width; 0 = dense FFN).
    positive = "vocab_size block_size n_layer n_head n_kv_head n_embd ffn_multiple_of".split()
    for field in positive + ["ffn_hidden", "n_expert"]:
        value, low = getattr(c, field), int(field in positive)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ConfigError(f"GPTConfig.{field}: must be an integer >= {low}, got {value!r}")
    pattern, n_kinds = c.layer_pattern, max(1, len(c.layer_pattern))
    top_k_fits = c.n_expert == 0 or 1 <= c.expert_top_k <= c.n_expert
    rules = [  # (field, the rule holds, what is wrong and the fix)
        ("n_embd", c.n_embd % c.n_head == 0, f"{c.n_embd} is not a multiple of n_head={c.n_head}"),
        ("n_kv_head", c.n_head % c.n_kv_head == 0, f"{c.n_kv_head} does not divide n_head"),
        ("n_head", c.head_dim % 2 == 0, f"head size {c.head_dim} is odd; RoPE rotates pairs"),
        ("rope_theta", c.rope_theta > 0, f"must be > 0, got {c.rope_theta}"),
        ("norm_eps", c.norm_eps > 0, f"must be > 0, got {c.norm_eps}"),
        ("dropout", 0 <= c.dropout < 1, f"must be in [0, 1), got {c.dropout}"),
        ("expert_top_k", top_k_fits, f"{c.expert_top_k} is not in 1..n_expert={c.n_expert}"),
        ("moe_capacity_factor", c.moe_capacity_factor >= 0, "must be >= 0 (0 = never drop)"),
        ("moe_aux_coef", c.moe_aux_coef >= 0, f"must be >= 0, got {c.moe_aux_coef}"),
        ("logit_softcap", 0 <= c.logit_softcap < math.inf, "must be >= 0 and finite (0 = off)"),
        ("z_loss", 0 <= c.z_loss < math.inf, "must be >= 0 and finite (0 = off)"),
        ("attention", c.attention in ("sdpa", "flash"), "must be 'sdpa' or 'flash'"),
        ("attention", c.attention == "sdpa" or c.dropout == 0, "'flash' has no attention dropout"),
        ("layer_pattern", set(pattern) <= set("AL"), f"{pattern!r} has a kind other than A and L"),
        (
            "layer_pattern",
            c.n_layer % n_kinds == 0,
            f"{pattern!r} (length {len(pattern)}) does not tile n_layer={c.n_layer}",
        ),
    ]
    for field, holds, problem in rules:
        if not holds:
            raise ConfigError(f"GPTConfig.{field}: {problem}")


if __name__ == "__main__":
    from machinery.commands import model as command

    raise SystemExit(command.main())
