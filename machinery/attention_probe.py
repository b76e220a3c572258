"""The largest attention logit of a model.py GPT: the number that grows before a too-high learning
rate diverges, and that QK-norm bounds (docs/model.md#stability). No lesson here: it reads the
scores model.py's own forward computes.

Serves: the learning-rate sensitivity report (issue 48) and tests/test_model.py. Depends on
model.py and torch.
"""

from __future__ import annotations

import math

import torch

import model as model_lib


@torch.no_grad()
def max_attention_logit(model: model_lib.GPT, idx: torch.Tensor) -> float:
    """The largest q.k / sqrt(d) over every attention layer, head and causal (query, key) pair of an
    eval-mode forward on ids (B, T): exactly the scores softmax sees (after QK-norm and RoPE). For a
    whole GPT on one process (context parallel's ring bypasses causal_attention)."""
    largest = []

    def recording(q, k, v, dropout_p=0.0, mask=None):
        # q (B, h, Tq, d), k (B, h_kv, Tk, d): query head j reads kv head j // (h / h_kv)
        group, (Tq, Tk) = q.shape[-3] // k.shape[-3], (q.shape[-2], k.shape[-2])
        keys = k.float().repeat_interleave(group, dim=-3)
        scores = q.float() @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, h, Tq, Tk)
        # the queries are the last Tq of the Tk positions (causal_attention's rule)
        visible = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
        visible = visible if mask is None else mask
        largest.append(scores.masked_fill(~visible, -math.inf).amax())
        return original(q, k, v, dropout_p, mask)

    # Attention.forward looks the global causal_attention up at each call, so replacing it for one
    # forward records every layer's scores without a second copy of that forward. A flash layer
    # (the same scores, in tiles) goes through causal_attention for this forward too.
    original = model_lib.causal_attention
    flash = [block.attn for block in model.blocks if getattr(block.attn, "flash", False)]
    was_training = model.training
    model_lib.causal_attention = recording
    for attn in flash:
        attn.flash = False
    try:
        model.eval()(idx)
    finally:
        model_lib.causal_attention = original
        for attn in flash:
            attn.flash = True
        model.train(was_training)
    if not largest:
        raise model_lib.ConfigError("max_attention_logit: the model has no attention layer")
    return max(float(t) for t in largest)
