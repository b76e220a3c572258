"""train.py: the training loop: forward, loss, backward, update, for tens of thousands of steps.

The lecture's budget: 1.2e20 FLOPs, N = 1e9 parameters, D = 2e10 tokens at 5e5
tokens per step: 40,000 optimizer steps, a day on 8 GPUs. A run that long needs a handful of
standard safety measures, each a numbered section of this file; `train_loop` runs them each step:

1. Tokens per step = sequences x length x accumulation steps x data-parallel ranks: 16 sequences x
   1,024 tokens x 4 micro-batches x 8 GPUs ~= 5e5. Each micro-batch loss is divided by 4 and the
   gradients add up: the gradient of the mean loss over all 64 sequences of a rank.
2. Learning-rate schedule: warm up to the peak, then a cosine down to 10% of it,
   lr(t) = lr_min + 1/2 (lr_max - lr_min) (1 + cos(pi * progress)); 2,000 warmup steps to 3e-4,
   3e-5 at step 40,000, 1.65e-4 half way (step 21,000). Or WSD: hold the peak, decay at the end.
3. AdamW with betas (0.9, 0.95) and weight decay 0.1 on weight matrices only (not on norm gains).
   Width transfer: hidden matrices' lr x base / width (64 / 256: x 1/4), tuned small, used wide.
4. Gradient clipping: if the global norm ||g|| > c, multiply every gradient by c / ||g|| (norm 4.0,
   threshold 1.0: every gradient x 0.25, direction kept).
5. Mixed precision: bf16 autocast for the compute, fp32 master weights and AdamW moments (in bf16,
   1.0 + 1e-4 is still 1.0: the update would be lost); fp16 adds a loss scaler. fp32 on a CPU.
6. Checkpoints written atomically (temp file, fsync, rename) with a sha256 inside, loaded with
   weights_only=True; they hold all a resume needs (model, optimizer, step, random generators,
   loader position): a run killed at any moment resumes with the losses of one never interrupted.
7. Loss-spike guard: skip a batch whose loss is NaN/Inf or far above the recent median; several
   in a row: roll back to the last good checkpoint with a lower learning rate (PaLM's recipe).
8. Watching the run: MFU, the model FLOP/s a run achieves over the device's peak.
9. Muon (--optimizer muon): a hidden matrix steps by its orthogonalised momentum (USV^T -> UV^T).

Run it:
    python train.py                     # pydocs corpus, `tiny` model, a few minutes on a laptop CPU
    python train.py --resume            # continue the run in out/ exactly where it stopped
    torchrun --standalone --nproc_per_node=8 train.py --model 124m --data ...   # data parallel

Worked numbers, the default run, the tests: docs/train.md. The run's wiring (flags, out-dir, resume,
locks, dataset, distribution, metrics) is machinery/run.py, which builds train_loop's `run`.

Depends on: torch, model.py (the GPT), bpe.py (the tokenizer a checkpoint carries).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import pathlib
import re
import statistics
import time
from collections import deque

import torch

import model as model_lib


class TrainError(Exception):
    """A problem with a run's settings, data or files, in the library's terms: a setting is named
    as its TrainConfig field in backquotes (`out_dir`), which the command line shows as its flag."""


# --------------------------------------------------------------------------------------------------
# 1. Tokens per step -> gradient accumulation
# --------------------------------------------------------------------------------------------------


def plan_accumulation(
    total_batch_tokens: int, batch_size: int, block_size: int, world_size: int = 1
) -> int:
    """Micro-batches per rank per optimizer step, so that the step sees exactly `total_batch_tokens`
    tokens.

    One micro-step on all ranks sees batch_size x block_size x world_size tokens.
    >>> plan_accumulation(524_288, 16, 1024, world_size=8)   # the lecture's 5e5 tokens/step, 8 GPUs
    4
    >>> plan_accumulation(0, 16, 1024)                       # 0: no accumulation
    1
    """
    per_micro_step = batch_size * block_size * world_size
    if total_batch_tokens == 0:
        return 1
    if total_batch_tokens < per_micro_step or total_batch_tokens % per_micro_step:
        raise TrainError(
            f"`total_batch_tokens` {total_batch_tokens} is not a multiple of batch_size x "
            f"block_size x world_size = {batch_size} x {block_size} x {world_size} = "
            f"{per_micro_step}; use a multiple such as "
            f"{max(1, total_batch_tokens // per_micro_step) * per_micro_step}"
        )
    return total_batch_tokens // per_micro_step


# --------------------------------------------------------------------------------------------------
# 2. Learning-rate schedules (plain functions of the step)
# --------------------------------------------------------------------------------------------------


def warmup_lr(step: int, max_lr: float, warmup_steps: int) -> float:
    """Linear warmup: step 0 gets max_lr / warmup (not 0, which would waste the step), step warmup-1
    gets max_lr."""
    return max_lr * (step + 1) / warmup_steps


def cosine_lr(
    step: int, max_lr: float, warmup_steps: int, total_steps: int, min_lr: float
) -> float:
    """Warmup, then cosine from max_lr down to min_lr at total_steps (and min_lr after).

    >>> cosine_lr(2_000, 3e-4, 2_000, 40_000, 3e-5), cosine_lr(40_000, 3e-4, 2_000, 40_000, 3e-5)
    (0.0003, 3e-05)
    """
    if step < warmup_steps:
        return warmup_lr(step, max_lr, warmup_steps)
    if step >= total_steps:
        return min_lr
    progress = (step - warmup_steps) / (total_steps - warmup_steps)  # 0 -> 1
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def wsd_lr(
    step: int,
    max_lr: float,
    warmup_steps: int,
    total_steps: int,
    min_lr: float,
    decay_fraction: float = 0.2,
) -> float:
    """Warmup-stable-decay: warmup, hold max_lr, then a linear decay to min_lr over the last
    `decay_fraction`. Until its decay a run does not depend on total_steps, so one run kept to step
    320 branches into runs of 200, 300 and 400 steps (--resume its checkpoints at 160, 240, 320 with
    those --max-steps): 500 steps, not 900 (docs/recipe.md: each ends ~0.2 nats below a cosine run).

    >>> [round(wsd_lr(s, 1.0, 10, 100, 0.1), 3) for s in (5, 50, 80, 90, 100)]
    [0.6, 1.0, 1.0, 0.55, 0.1]
    """
    if step < warmup_steps:
        return warmup_lr(step, max_lr, warmup_steps)
    decay_start = total_steps - int(round(decay_fraction * total_steps))
    if step < decay_start:
        return max_lr
    if step >= total_steps:
        return min_lr
    progress = (step - decay_start) / (total_steps - decay_start)
    return max_lr + (min_lr - max_lr) * progress


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The configured schedule at `step` (before any rollback multiplier)."""
    min_lr = cfg.lr * cfg.min_lr_ratio
    if cfg.schedule == "wsd":
        return wsd_lr(step, cfg.lr, cfg.warmup_steps, cfg.max_steps, min_lr, cfg.decay_fraction)
    return cosine_lr(step, cfg.lr, cfg.warmup_steps, cfg.max_steps, min_lr)


# --------------------------------------------------------------------------------------------------
# 3. AdamW(0.9, 0.95), weight decay on matrices only; width transfer (--lr-base-width)
#
# Adam moves every weight by about lr a step, whatever the width. A hidden (C, C) matrix sums C
# inputs, and its update is built from those inputs, so they add up: the layer's output moves by
# about lr x C. At width 256 a step moves it 4x as far as at 64, and the best lr falls as the model
# widens. Measured (docs/train.md, 2 layers, 250 steps): plain AdamW's best is 4e-3 at width 64 but
# 2e-3 at 256, where 4e-3 costs 0.38 nats. muP's rule (Yang et al. 2022) for Adam: the hidden
# matrices' lr x base / width. With base 64, width 256 steps them at 4e-3 x 64/256 = 1e-3, and the
# rate tuned at 64 costs 0.03 nats at 256 (best there: 8e-3, on the flat side, not over a cliff).
# The embedding keeps the full lr: one row is read per token, no sum over C; so do the norm gains.
# The tied head does sum over C, but muP's fix, logits x base/width, held 4e-3 at 0.43 nats worse,
# and every lr x 1/4 (the sweep's rule: the tied matrix's and the gains' too) 0.05 worse at best.
# --------------------------------------------------------------------------------------------------


def param_groups(model: torch.nn.Module, weight_decay: float, lr_base_width: int = 0) -> list[dict]:
    """Three groups: hidden weight matrices and the embedding (a tied head is the same parameter:
    parameters() lists it once) decay; vectors (norm gains, biases) do not. Each carries "lr_mult",
    the factor the loop multiplies the schedule's lr by: base / width for the hidden matrices when
    `lr_base_width` is set (width transfer, above), 1 for the rest.
    """
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    hidden_mult = lr_base_width / model.config.n_embd if lr_base_width else 1.0
    hidden = [p for name, p in named if is_hidden_matrix(name, p)]
    embedding = [p for name, p in named if p.dim() >= 2 and not is_hidden_matrix(name, p)]
    return [
        {"params": hidden, "weight_decay": weight_decay, "lr_mult": hidden_mult},
        {"params": embedding, "weight_decay": weight_decay, "lr_mult": 1.0},
        {"params": [p for _, p in named if p.dim() < 2], "weight_decay": 0.0, "lr_mult": 1.0},
    ]


def is_hidden_matrix(name: str, param: torch.nn.Parameter) -> bool:
    """A 2-D weight of a hidden layer: not the token embedding / head (tied), not a norm or bias."""
    return param.dim() == 2 and "tok_emb" not in name and "lm_head" not in name


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device_type: str):
    """AdamW with the fused kernel where this torch has one for the device (one kernel for all
    parameters); or Muon (section 9) for the hidden matrices, AdamW's groups for the rest."""
    fused = device_type in ("cuda", "cpu")
    groups = param_groups(model, cfg.weight_decay, cfg.lr_base_width)
    betas = (cfg.beta1, cfg.beta2)
    if cfg.optimizer == "muon":
        groups[0]["muon"] = True  # the hidden matrices
        return Muon(groups, lr=cfg.lr, betas=betas)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=betas, eps=1e-8, fused=fused)


# --------------------------------------------------------------------------------------------------
# 4. Gradient clipping
# --------------------------------------------------------------------------------------------------


def clip_gradients(parameters, max_norm: float) -> torch.Tensor:
    """Scale all gradients by max_norm / ||g|| when the global norm ||g|| exceeds max_norm; return
    ||g|| before, a 0-dim tensor on the gradients' device (reading it on the host would wait for
    the device: the loop reads it once per step, with the loss).

    ||g|| is the L2 norm of every gradient flattened into one vector: grads (2, 0) and (0, 2, 2, 2)
    have norm 4. With max_norm 1.0 each gradient is multiplied by 0.25. max_norm 0 only measures.
    """
    parameters = [p for p in parameters if p.grad is not None]
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return torch.nn.utils.get_total_norm([p.grad for p in parameters])


# --------------------------------------------------------------------------------------------------
# 5. Precision: autocast for the compute, fp32 for the weights and the optimizer
# --------------------------------------------------------------------------------------------------


def autocast(device: torch.device, dtype: torch.dtype):
    """The forward/backward context: low-precision matmuls, fp32 parameters untouched."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


# --------------------------------------------------------------------------------------------------
# 6. Checkpoints: atomic writes, keep the last K, safe loading, fall back past a damaged file
# --------------------------------------------------------------------------------------------------

CKPT_PATTERN = re.compile(r"^ckpt_(\d{7})\.pt$")


def checkpoint_path(out_dir, step: int) -> pathlib.Path:
    """OUT_DIR/ckpt_{step:07d}.pt"""
    return pathlib.Path(out_dir) / f"ckpt_{step:07d}.pt"


def list_checkpoints(out_dir) -> list[pathlib.Path]:
    """Checkpoint files in `out_dir`, newest (highest step) first; temp files of interrupted writes
    are ignored."""
    out_dir = pathlib.Path(out_dir)
    found = [p for p in out_dir.iterdir() if CKPT_PATTERN.match(p.name)] if out_dir.is_dir() else []
    return sorted(found, key=lambda p: int(CKPT_PATTERN.match(p.name).group(1)), reverse=True)


def atomic_save(obj, path, save=torch.save) -> pathlib.Path:
    """`save(obj, file)` (torch.save; the run's machinery/checkpoints.py adds a sha256 inside) to a
    temp file beside `path`, fsync it, rename it over `path`, then fsync the directory so that the
    rename itself is on disk.

    A crash at any moment leaves either the old file or the complete new one, never half a
    checkpoint: the rename is atomic. The next run removes a temp file a kill left behind.
    """
    path = pathlib.Path(path)
    temp = path.with_name(f".{path.name}.tmp")  # same folder: the rename stays on one disk
    try:
        with open(temp, "wb") as f:
            save(obj, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes on disk before the name points there
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)  # a failed write leaves nothing behind
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # make the rename itself durable
    finally:
        os.close(dir_fd)
    return path


def prune_checkpoints(out_dir, keep: int) -> None:
    """Delete all but the `keep` newest checkpoints."""
    for old in list_checkpoints(out_dir)[max(1, keep) :]:
        old.unlink(missing_ok=True)


def load_checkpoint(path_or_dir, log=print, verify=None) -> dict:
    """Load a checkpoint with torch.load(weights_only=True) (no arbitrary pickle code can run).

    Given a directory, the newest checkpoint that loads is returned; a damaged newer one is reported
    and skipped. `verify(path)` raises for a damaged file before torch.load reads it (the run's:
    machinery/checkpoints.py's sha256). The returned dict gets one extra key, "path".
    """
    path = pathlib.Path(path_or_dir)
    candidates = list_checkpoints(path) if path.is_dir() else [path]
    if not candidates and (path / "config.json").is_file():
        raise TrainError(
            f"{path} is a Hugging Face model directory, not a checkpoint; convert it first with "
            f"model.py's import-hf command, then pass the .pt file it writes"
        )
    if not candidates:
        raise TrainError(
            f"no checkpoint (ckpt_*.pt) in {path}; train first or pass a checkpoint file"
        )
    problems = []
    for candidate in candidates:
        try:
            if verify:  # before torch.load: zeros inside load silently
                verify(candidate)
            ckpt = torch.load(candidate, map_location="cpu", weights_only=True)
            check_checkpoint_fields(ckpt)
        # truncated zip, bad checksum, bad pickle, wrong content: all mean "damaged"
        except Exception as e:
            first_line = (str(e).splitlines() or [""])[0]
            problems.append(f"{candidate.name}: {type(e).__name__}: {first_line}")
            if len(candidates) > 1:
                damaged = f"checkpoint {candidate} is damaged ({problems[-1]})"
                log(f"{damaged}; falling back to the previous one")
            continue
        ckpt["path"] = str(candidate)
        return ckpt
    raise TrainError(f"no loadable checkpoint in {path}: " + "; ".join(problems))


# A context longer than any Llama-format model's (Llama 3.1: 131,072): a KV cache or a mask of
# 10**13 positions is an allocation of petabytes, so a larger block_size is damage, not a plan.
MAX_BLOCK_SIZE = 2**20


# What a checkpoint, its weights and each of its fields must be: (type, what it must be, a check of
# the value). The last five fields are what a resume restores; an imported checkpoint (model.py
# import-hf) has none of them, and a field that is absent is skipped.
IS_CHECKPOINT = (dict, "a checkpoint of version 1, with a model", lambda c: c.get("version") == 1)
IS_WEIGHTS = (dict, "a dict of weights", lambda weights: True)
IS_FLOAT_DTYPE = (torch.dtype, "a floating-point dtype", lambda dtype: dtype.is_floating_point)
# the spike guard never saves a NaN: one here is damage
IS_FINITE = (torch.Tensor, "finite weights (no NaN or inf)", lambda w: torch.isfinite(w).all())
CHECKPOINT_FIELDS = {
    "model_config": (dict, "an object of GPTConfig fields", lambda config: True),
    "tokenizer_json": (str, "a tokenizer JSON string", lambda text: True),
    "step": (int, "a step number >= 0", lambda step: step >= 0),
    "optimizer": (dict, "an optimizer state_dict", lambda s: {"state", "param_groups"} <= s.keys()),
    "train_config": (dict, "an object of train.py settings", lambda config: True),
    "rng": (list, "a list of random states, one per rank", lambda states: len(states) > 0),
    "loader": (list, "a list of loader states, one per rank", lambda states: len(states) > 0),
    "metrics": (
        dict,
        "tokens, lr_scale and guard",
        lambda m: {"tokens", "lr_scale", "guard"} <= m.keys(),
    ),
}


def check_field(value, where: str, rule: tuple, error=ValueError):
    """`value` if it is of the rule's type (a bool is no number) and passes its check, else `error`
    naming the field: "step is 'x', not a step number >= 0; the file is damaged or ..."."""
    kind, shape, ok = rule
    is_kind = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not is_kind or not ok(value):
        fix = "the file is damaged or hand-edited: use a checkpoint train.py wrote"
        raise error(f"{where} is {str(value)[:40]!r}, not {shape}; {fix}")
    return value


def check_checkpoint_fields(ckpt) -> None:
    """What torch.load gave, checked field by field before anything uses it: a dict of version 1
    with a "model", a dict of finite floating-point tensors (int64 or NaN weights would train,
    evaluate and export as garbage), then CHECKPOINT_FIELDS. A bad one raises ValueError naming the
    field, which load_checkpoint reports with the file's name (a run directory falls back to its
    previous checkpoint)."""
    check_field(ckpt, "the checkpoint", IS_CHECKPOINT)
    check_field(ckpt.get("model"), "model", IS_WEIGHTS)
    for name, weight in ckpt["model"].items():
        check_field(getattr(weight, "dtype", weight), f"model[{name!r}].dtype", IS_FLOAT_DTYPE)
        check_field(weight, f"model[{name!r}]", IS_FINITE)
    for key, rule in CHECKPOINT_FIELDS.items():
        if key in ckpt:
            check_field(ckpt[key], key, rule)


def model_from_checkpoint(ckpt: dict, device="cpu"):
    """(GPT in eval mode with the checkpoint's weights, bpe.Tokenizer) from a load_checkpoint()
    dict."""
    import bpe

    gpt = model_lib.GPT(checkpoint_config(ckpt))
    gpt.load_state_dict(ckpt["model"])
    return gpt.to(device).eval(), bpe.Tokenizer.from_json(ckpt["tokenizer_json"])


def checkpoint_config(ckpt: dict):
    """The checkpoint's GPTConfig, once every weight's shape is checked against it (a model built on
    the meta device: no memory): a config that disagrees with its weights is one ConfigError line,
    not load_state_dict's traceback of size mismatches."""
    config = model_lib.GPTConfig.from_dict(ckpt["model_config"])
    shape = f"a context of at most {MAX_BLOCK_SIZE:,} positions"
    where = f"{ckpt['path']}: model_config.block_size"
    rule = (int, shape, lambda block_size: block_size <= MAX_BLOCK_SIZE)
    check_field(config.block_size, where, rule, error=model_lib.ConfigError)
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in model_lib.GPT(config).state_dict().items()}
    have = {k: tuple(getattr(v, "shape", ())) for k, v in ckpt["model"].items()}
    mismatched = sorted(want.keys() ^ have.keys()) or [k for k in want if want[k] != have[k]]
    if mismatched:
        name = mismatched[0]
        raise model_lib.ConfigError(
            f"{ckpt['path']}: weight {name} has shape {have.get(name, 'missing')} but its "
            f"model_config implies {want.get(name, 'none')}; the file is damaged or "
            f"hand-edited: use the checkpoint train.py wrote"
        )
    return config


# --------------------------------------------------------------------------------------------------
# 7. Loss-spike guard
# --------------------------------------------------------------------------------------------------


class SpikeGuard:
    """Decide, per step, whether a loss is fine ("ok"), a spike to skip ("skip"), or one spike too
    many ("rollback").

    A spike is a non-finite loss, or one above `factor` x the median of the last `window` good
    losses (once at least `min_history` are known). `patience` spikes in a row ask for a rollback.
    >>> g = SpikeGuard(factor=2.0, window=5, patience=2, min_history=3)
    >>> [g.check(x) for x in (4.0, 3.9, 3.8, 9.0, 3.7, float("nan"), 50.0)]
    ['ok', 'ok', 'ok', 'skip', 'ok', 'skip', 'rollback']
    """

    def __init__(
        self, factor: float = 2.0, window: int = 50, patience: int = 3, min_history: int = 10
    ):
        self.factor, self.patience, self.min_history = factor, patience, min_history
        self.history: deque[float] = deque(maxlen=window)
        self.in_a_row = 0

    def is_spike(self, loss: float) -> bool:
        """NaN/Inf, or above factor x the median of the recent good losses."""
        if not math.isfinite(loss):
            return True
        return len(self.history) >= self.min_history and loss > self.factor * statistics.median(
            self.history
        )

    def check(self, loss: float) -> str:
        """Record a step's loss and return "ok", "skip" or "rollback"."""
        if not self.is_spike(loss):
            self.history.append(loss)
            self.in_a_row = 0
            return "ok"
        self.in_a_row += 1
        if self.in_a_row >= self.patience:
            self.in_a_row = 0
            return "rollback"
        return "skip"

    def state_dict(self) -> dict:
        return {"history": list(self.history), "in_a_row": self.in_a_row}

    def load_state_dict(self, state: dict) -> None:
        self.history.clear()
        self.history.extend(state["history"])
        self.in_a_row = state["in_a_row"]


# --------------------------------------------------------------------------------------------------
# 8. Watching the run: MFU
# --------------------------------------------------------------------------------------------------


def model_flops_utilization(
    tokens_per_s: float, flops_per_token: float, peak_flops: float, devices: int
) -> float:
    """MFU of one device (a fraction): the model FLOP/s each device achieves over its peak.

    `tokens_per_s` counts every rank's tokens; `devices` is every process of the run (dp x tp x pp),
    since each one computes its share of the 6N FLOPs per token. 2 GPUs at 2,925 tokens/s each
    (5,850 in all) on a model of 1e9 FLOPs/token with a 1e13 FLOP/s peak: 5,850 x 1e9 / (2 x 1e13) =
    29.25%, what each GPU does.
    >>> round(model_flops_utilization(5_850, 1e9, 1e13, devices=2), 4)
    0.2925
    """
    return tokens_per_s * flops_per_token / (peak_flops * devices)


# --------------------------------------------------------------------------------------------------
# 9. Muon: orthogonalised momentum for the hidden weight matrices (--optimizer muon)
#
# AdamW scales each weight's step by its own history; Muon treats a (rows, cols) weight as a matrix
# and replaces its momentum M = U S V^T by U V^T: every direction of the step gets the same size, so
# the few directions with large singular values no longer drown the rest. An SVD per step is too
# slow; five Newton-Schulz iterations of x -> a x + b (x x^T) x + c (x x^T)^2 x (matmuls only)
# push every singular value towards 1. Embeddings, the head and the norm gains keep AdamW: a row of
# an embedding is one token's vector, not a direction of a linear map. Width transfer (section 3)
# scales Muon's matrices too: width 64's best, 1.6e-2, gives 3.408 at 256 under the rule, 3.435
# plain; the best there is one step up (3.2e-2: 3.368) and one down (8e-3: 3.399), docs/train.md.
# --------------------------------------------------------------------------------------------------

# (a, b, c) of the quintic p(s) = a s + b s^3 + c s^5 applied to every singular value s. a = 3.4445
# is the slope at 0: a small s (a direction the gradient barely touches) grows 3.4x per iteration,
# so one of 0.002 (of the norm) reaches 0.86 in five. The price: p(1) = 0.70, and the values settle
# in a band around 1 (about 0.7-1.2), not on 1 exactly, which training does not notice.
NEWTON_SCHULZ_COEFFICIENTS = (3.4445, -4.7750, 2.0315)


def newton_schulz(update: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """About U V^T of a (rows, cols) matrix U S V^T: the same shape, singular values ~0.7-1.2.

    Divided by its Frobenius norm first (>= the largest singular value, so every s <= 1, where the
    quintic converges). bf16 on CUDA (tensor cores; the band is wide anyway), fp32 elsewhere.
    """
    a, b, c = NEWTON_SCHULZ_COEFFICIENTS
    x = update.to(torch.bfloat16 if update.is_cuda else torch.float32)
    wide = x.mT if x.size(0) > x.size(1) else x  # (short, long): x x^T is the small Gram matrix
    wide = wide / (wide.norm() + 1e-7)
    for _ in range(steps):
        gram = wide @ wide.mT  # (short, short)
        wide = a * wide + (b * gram + c * gram @ gram) @ wide
    result = wide.mT if x.size(0) > x.size(1) else wide
    return result.to(update.dtype)


def muon_scale(rows: int, cols: int) -> float:
    """0.2 sqrt(max(rows, cols)): makes the update's RMS 0.2, AdamW's typical one, so the AdamW
    learning rate and weight decay carry over. An orthogonal (rows, cols) matrix has min(rows,
    cols) unit singular values, RMS sqrt(min / (rows cols)) = 1 / sqrt(max): (256, 1024) -> 6.4.

    >>> muon_scale(256, 1024)
    6.4
    """
    return 0.2 * math.sqrt(max(rows, cols))


class Muon(torch.optim.AdamW):
    """Muon (Nesterov momentum 0.95, orthogonalised) on the groups with "muon": True, AdamW on the
    others: one optimizer, so the loop's lr schedule, checkpoints and the spike guard see one.

    Every data-parallel rank steps the same all-reduced gradient of the full matrix: the same
    update everywhere. ZeRO's flat shards replace `orthogonalise` (parallel.py, section 4); TP's
    slices of a matrix cannot.
    """

    def __init__(self, groups: list[dict], lr=3e-4, betas=(0.9, 0.95), momentum: float = 0.95):
        groups = [{"muon": False, "momentum": momentum, **group} for group in groups]
        super().__init__(groups, lr=lr, betas=betas, eps=1e-8)

    @torch.no_grad()
    def step(self) -> None:
        for group in (group for group in self.param_groups if group["muon"]):
            for p in (p for p in group["params"] if p.grad is not None):
                state = self.state[p]  # a "step" too, as AdamW's load_state_dict expects
                if not state:
                    state.update(step=torch.zeros(()), momentum=torch.zeros_like(p))
                state["step"] += 1
                buffer = state["momentum"]
                buffer.lerp_(p.grad, 1 - group["momentum"])  # m <- 0.95 m + 0.05 g
                nesterov = p.grad.lerp(buffer, group["momentum"])  # look ahead: 0.05 g + 0.95 m
                update = self.orthogonalise(p, nesterov)  # (rows, cols); ZeRO: a flat slice
                p.mul_(1 - group["lr"] * group["weight_decay"])  # decoupled decay, as AdamW's
                p.add_(update, alpha=-group["lr"])
                p.grad = None  # stepped: AdamW's step below skips a parameter without a gradient
        super().step()

    def orthogonalise(self, weight: torch.Tensor, nesterov: torch.Tensor) -> torch.Tensor:
        """The update of one whole (rows, cols) matrix: its momentum orthogonalised, scaled."""
        return newton_schulz(nesterov) * muon_scale(*weight.shape)


# --------------------------------------------------------------------------------------------------
# Configuration: every setting of a run, one dataclass (machinery/commands/train.py makes each
# field a flag, machinery/run.py checks them)
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class TrainConfig:
    """Every setting of a run, plain values as in nanoGPT: each field is also a command-line flag
    (`max_steps` -> `--max-steps`) and a key of a --config file."""

    # data and model
    data: str = "pydocs"  # sources to prepare (comma-separated), or a prepared dataset
    val_data: str = ""  # held-out file(s) used verbatim as the validation split
    cleaning: str = "auto"  # data.py's cleaning: auto | web | keep
    vocab_size: int = 0  # BPE size if data.py trains one (0 = default)
    model: str = "tiny"  # a preset of machinery/presets.py
    model_args: str = ""  # preset overrides, 'n_layer=2,n_embd=32'
    out_dir: str = "out"  # checkpoints, metrics.jsonl, loss.png
    seed: int = 0  # model init, data order, sampling
    # batch
    batch_size: int = 16  # sequences per forward per rank (the micro-batch)
    block_size: int = 0  # tokens per sequence (0 = the model's)
    total_batch_tokens: int = 0  # per optimizer step, all ranks (0 = one micro-batch per rank)
    # optimisation
    max_steps: int = 600  # optimizer steps: the schedule's total
    lr: float = 2e-3  # peak learning rate
    min_lr_ratio: float = 0.1  # final lr / peak
    warmup_steps: int = 30
    schedule: str = "cosine"  # cosine | wsd
    decay_fraction: float = 0.2  # wsd: the decaying fraction of the steps
    optimizer: str = "adamw"  # adamw | muon (section 9: hidden matrices Muon, the rest AdamW)
    weight_decay: float = 0.1  # AdamW, weight matrices only
    lr_base_width: int = 0  # width transfer (section 3): hidden matrices' lr x this / n_embd
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # global grad-norm limit (0 = off)
    # precision and speed
    device: str = "auto"  # auto | cpu | cuda | mps
    dtype: str = "auto"  # auto | fp32 | bf16 | fp16
    compile: bool = False  # torch.compile
    activation_checkpointing: bool = False  # recompute block activations in backward
    peak_flops: float = 0.0  # the hardware's peak FLOP/s for MFU (0 = datasheet or measured)
    # checkpoints and evaluation
    eval_interval: int = 100
    eval_batches: int = 10  # micro-batches per validation estimate
    eval_at_start: bool = True  # evaluate at step 0 (about ln(vocab))
    ckpt_interval: int = 250
    keep_checkpoints: int = 3
    resume: str | None = None  # "latest" (bare --resume) or a checkpoint file
    init_from: str = ""  # a checkpoint whose weights, shape and tokenizer start a new run
    overwrite: bool = False  # delete the run in out_dir and start over
    log_interval: int = 10  # steps between progress lines
    plot: bool = True  # draw loss.png at the end
    # loss-spike guard
    spike_factor: float = 2.0  # a spike: a loss over this x the median
    spike_window: int = 50  # recent losses the median is taken over
    spike_patience: int = 3  # spikes in a row before a rollback
    rollback_lr_factor: float = 0.5
    # samples at the end
    num_samples: int = 2
    sample_tokens: int = 120
    temperature: float = 0.8
    top_k: int = 40  # 0 = all tokens
    prompt: str = ""  # empty = the start of a document
    # parallelism (parallel.py, model_parallel.py; machinery/run.py's wrap_for_distribution)
    zero: int = 0  # ZeRO stage 0-3
    zero_reduce_dtype: str = "fp32"  # zero 3 in bf16: the dtype gradients are reduce-scattered in
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    pp_schedule: str = "1f1b"  # afab | 1f1b
    micro_batches: int = 0  # pipeline micro-batches per step (0 = the accumulation steps)


# --------------------------------------------------------------------------------------------------
# The training loop: every numbered section above, once per optimizer step
# --------------------------------------------------------------------------------------------------


def train_loop(run, steps: int | None = None, batches=None) -> dict:
    """Optimizer steps until cfg.max_steps (or `steps` more), or until a signal stops every process
    (see `stop` below); returns the last step's record (its metrics.jsonl line). `batches` (tests):
    one list of (x, y) micro-batches per step, instead of the loader's.

    `run` is the run's state, built by machinery/run.py's Trainer: cfg (TrainConfig), model,
    raw_model, optimizer, scaler, step, tokens, lr_scale, guard (SpikeGuard), device, dtype, dist,
    and the methods that read batches, log, evaluate and save. `run.model` is a parallel.Layout
    whatever the layout (one process, DP, ZeRO, TP/PP, EP, CP), so the loop calls the same methods
    everywhere: no_sync, finish_gradient_sync, and under pp > 1 pipeline_step (the schedule runs
    every micro-batch's forward and backward itself).
    """
    cfg, model, optimizer, scaler = run.cfg, run.model, run.optimizer, run.scaler
    if batches is not None:  # one step per list of micro-batches
        steps, batches = len(batches), iter(batches)
    done, record = 0, {}
    while run.step < cfg.max_steps and not run.stopping and done != steps:  # never on a local flag
        t0, done = time.perf_counter(), done + 1
        micro_batches = next(batches) if batches else run.next_micro_batches()  # §1: (B, T) each
        lr = lr_at(run.step, cfg) * run.lr_scale  # §2
        for group in optimizer.param_groups:  # §3: width transfer's multipliers (1 when off)
            group["lr"] = lr * group["lr_mult"]
        n = len(micro_batches)
        loss_sum = torch.zeros((), device=run.device)
        if model.pipelined:  # pp > 1: all micro-batches in one pass
            with autocast(run.device, run.dtype):  # §5: bf16 compute as without pp
                loss_sum += model.pipeline_step(micro_batches, cfg.micro_batches) * n
            micro_batches = []
        for i, (x, y) in enumerate(micro_batches):
            # §1: gradients add up over the micro-batches; only the last backward communicates
            with contextlib.nullcontext() if i == n - 1 else model.no_sync():
                with autocast(run.device, run.dtype):
                    _, loss = model(x, y)  # mean cross-entropy over (B, T)
                objective = loss
                if run.model_config.n_expert:  # MoE: + the load-balancing loss
                    objective = loss + run.model_config.moe_aux_coef * run.raw_model.aux_loss
                objective = objective / n  # the mean over all n micro-batches
                if scaler:  # fp16: scaled, so small ones survive
                    objective = scaler.scale(objective)
                objective.backward()
            loss_sum += loss.detach().float()
        model.finish_gradient_sync()
        if scaler:
            scaler.unscale_(optimizer)
        # §4: a whole model (one process, data parallel) clips with clip_gradients; a model split
        # over ranks (ZeRO, TP, PP) adds its shards' squared norms up first (parallel.py)
        if run.split:
            grad_norm = model.clip_grad_norm_(cfg.grad_clip)
        else:
            grad_norm = clip_gradients(run.raw_model.parameters(), cfg.grad_clip)  # 0-dim
        # A signal sets this process's flag; the run stops only once the flag has been all-reduced,
        # so that every process stops after the same step (a process leaving on its own flag leaves
        # the others waiting in the next step's collectives). Over every process, not only the
        # data-parallel group: under --tp/--pp the signal may reach one pipeline stage and not the
        # other. The loss is the same on every tp and pp rank of a data-parallel rank, so the mean
        # over the world is the dp mean. The step's one host read: loss, flag and norm in one
        # .tolist() (each read waits for the GPU to finish the queue; one per step is the least a
        # progress line needs, tests/test_train.py counts them).
        # torch.full, a fill kernel: torch.tensor(flag, device=...) would be a blocking upload,
        # a second sync per step on a GPU.
        stop = torch.full((), float(run.stop_requested), device=run.device)
        reduced = run.mean_over_processes(torch.stack([loss_sum / n, stop]))
        loss_value, stop_any, grad_norm = torch.cat([reduced, grad_norm.view(1)]).tolist()
        run.stopping = stop_any > 0  # every rank stops after this step
        bad_grad = not math.isfinite(grad_norm) and scaler is None  # fp16: the scaler's job
        verdict = run.guard.check(float("nan") if bad_grad else loss_value)  # §7
        if verdict == "ok" and scaler:
            scaler.step(optimizer)
            scaler.update()
        elif verdict == "ok":
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.tokens += run.tokens_per_step
        record = {
            "step": run.step,
            "loss": loss_value,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens": run.tokens,
        }
        run.step += 1
        if verdict != "ok":
            run.skip_batch(record)
        if verdict == "rollback":
            run.rollback()  # §7: the last good state, lower lr
        # §8: watching the run
        run.time_step(record, time.perf_counter() - t0)  # tok/s, MFU, the smoothed step time
        run.metrics.write(record)
        if run.step % cfg.log_interval == 0 or run.step == cfg.max_steps:
            run.log(run.step_line(record))
        if run.step % cfg.eval_interval == 0 or run.step == cfg.max_steps:
            run.evaluate()
        if run.dist.devices == 1:  # alone, a late signal counts too
            run.stopping = run.stopping or run.stop_requested
        if run.step % cfg.ckpt_interval == 0 or run.step == cfg.max_steps or run.stopping:
            run.log(f"saved {run.save_checkpoint()}")  # §6
    return record


if __name__ == "__main__":
    from machinery.commands import train as command

    raise SystemExit(command.main())
