"""train.py: the training loop. Forward, loss, backward, update, for tens of thousands of steps,
without blowing up.

Pretraining optimises the same objective as any small language model (predict the next token,
cross-entropy loss); what changes is the length of the run. The lecture's worked budget: 1.2e20
FLOPs, N = 1e9 parameters, D = 2e10 tokens, 5e5 tokens per step, so 2e10 / 5e5 = 40,000 optimizer
steps over about a day on 8 GPUs. A run that long needs a handful of standard safety measures, and
each one is a section of this file:

1. Tokens per step. The batch is counted in tokens: tokens/step = sequences x sequence length x
   accumulation steps (x data-parallel ranks). 5e5 tokens/step on 8 GPUs is 62,500 tokens per GPU,
   e.g. 16 sequences x 1,024 tokens x 4 accumulation steps ~= 65,536. When memory holds only 16
   sequences at a time we run 4 micro-batches, divide each micro-batch loss by 4 and let the
   gradients add up: the sum is the gradient of the mean loss over all 64 sequences, exactly as if
   they had fitted in memory together.

2. Learning-rate schedule. Warm up from ~0 to the peak (random weights give large, noisy gradients;
   a full step then would throw the model somewhere bad), then decay along a cosine to 10% of the
   peak:
       lr(t) = lr_min + 1/2 (lr_max - lr_min) (1 + cos(pi * progress)),
       progress = (t - warmup) / (total - warmup)
   The lecture's numbers: 2,000 warmup steps up to 3e-4, cosine down to 3e-5 at step 40,000 (half
   way, step 21,000, sits at 1.65e-4). The cosine shape depends on the total, so the token budget is
   fixed before the run starts. WSD (warmup-stable-decay) keeps the peak for most of the run and
   decays only in the last stretch, so a checkpoint from the stable phase can branch into runs of
   different lengths.

3. AdamW with the standard settings. betas (0.9, 0.95), weight decay 0.1 on weight matrices only
   (embeddings and linear layers). Norm gains start at 1 and set the scale of a normalised vector;
   pulling them towards 0 fights the normalisation and regularises nothing, so vectors (gains,
   biases) are not decayed.

4. Gradient clipping. Flatten every gradient into one long vector g; if ||g|| > c, multiply every
   gradient by c / ||g||. Threshold 1.0 and a step whose norm is 4.0: every gradient is multiplied
   by 0.25 (direction kept).

5. Mixed precision with fp32 master weights. bf16 has 7 mantissa bits, so between 1 and 2 its
   numbers are 2^-7 ~= 0.0078 apart: a weight of 1.0 plus an update of 1e-4 is still 1.0 in bf16 and
   the update is lost. So the forward and backward run under bf16 autocast while the parameters and
   AdamW's moments stay fp32 and the update is added there. fp16 has a narrower range as well, so
   its loss is scaled up before backward (a gradient scaler) to keep small gradients from flushing
   to zero. On a CPU, fp32 throughout (bf16 matmuls are ~100x slower here).

6. Checkpoints and exact resume. Every few hundred steps the whole state goes to disk atomically
   (write a temp file, fsync, rename: a crash mid-write leaves the previous checkpoint intact):
   model, optimizer moments, the step (which fixes the learning rate), the random generators and the
   data loader's position. A run killed at any moment (even SIGKILL) and resumed then produces
   exactly the losses of a run that was never interrupted.

7. Loss-spike guard. A batch whose loss is NaN/Inf or far above the recent median is skipped (no
   update). Several in a row means the model itself went bad: roll back to the last good checkpoint,
   lower the learning rate, and continue on fresh data (the recipe PaLM describes). Every
   intervention is logged.

8. Watching the run. A progress line (step, loss, lr, grad norm, tokens/s, MFU, ETA), validation
   loss and bits-per-byte every few hundred steps (bpb = loss / ln 2 / bytes-per-token, comparable
   across tokenizers), metrics.jsonl for every step, a loss-curve PNG and a few samples at the end.

Run it:
    python train.py                     # pydocs corpus, `tiny` model, a few minutes on a laptop CPU
    python train.py --resume            # continue the run in out/ exactly where it stopped
    python train.py --model 10m --max-steps 5000 \
        --data ../shared/data/tinystories/TinyStories-train-head-2MiB.txt
    python train.py --data my.txt --val-data my_held_out.txt    # your text, validated on that file
    torchrun --standalone --nproc_per_node=8 train.py --model 124m --data ...   # data parallel

Depends on: torch, numpy and the sibling files data.py (corpus, tokenizer, batches),
data_at_scale.py (prepares --data: data.py's reference engine for small inputs, else the
streaming one; imported only then), model.py (the GPT, the check of --device), bpe.py (the
tokenizer a checkpoint carries), fileio.py (reading --config; checkpoints and the loss PNG written
whole) and, under torchrun, parallel.py (the mesh, data parallel) and model_parallel.py
(`parallelize`: ZeRO, tensor and pipeline parallel).
matplotlib draws the loss curve (imported only then); cli.py (the shared parser) only in
build_parser().
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import math
import os
import pathlib
import random
import re
import signal
import stat
import statistics
import sys
import time
from collections import deque

import numpy as np
import torch

import data as data_lib
from machinery import fileio
import model as model_lib


class TrainError(Exception):
    """A problem with the user's input or environment; the CLI prints it as one line and exits with
    code 2."""


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
            f"--total-batch-tokens {total_batch_tokens} is not a multiple of batch-size x "
            "block-size x "
            f"world-size = {batch_size} x {block_size} x {world_size} = {per_micro_step}; "
            "use a multiple such as "
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
    progress = (step - warmup_steps) / (total_steps - warmup_steps)      # 0 -> 1
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def wsd_lr(step: int, max_lr: float, warmup_steps: int, total_steps: int, min_lr: float,
           decay_fraction: float = 0.2) -> float:
    """Warmup-stable-decay: warmup, hold max_lr, then a linear decay to min_lr over the last
    `decay_fraction`.

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
# 3. AdamW(0.9, 0.95), weight decay on matrices only
# --------------------------------------------------------------------------------------------------

def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Two groups: weight matrices (dim >= 2: embeddings, linears) decay; vectors (norm gains,
    biases) do not.

    A tied lm_head/embedding weight is one parameter and appears once (parameters() removes
    duplicates).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device_type: str) -> torch.optim.AdamW:
    """AdamW with the fused kernel where this torch has one for the device (one kernel for all
    parameters)."""
    fused = device_type in ("cuda", "cpu")
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=1e-8,
        fused=fused,
    )


# --------------------------------------------------------------------------------------------------
# 4. Gradient clipping
# --------------------------------------------------------------------------------------------------

def clip_gradients(parameters, max_norm: float) -> float:
    """Scale all gradients by max_norm / ||g|| when the global norm ||g|| exceeds max_norm; return
    ||g|| before.

    ||g|| is the L2 norm of every gradient flattened into one vector: grads (2, 0) and (0, 2, 2, 2)
    have norm 4.
    With max_norm 1.0 each gradient is multiplied by 0.25. max_norm 0 only measures.
    """
    parameters = [p for p in parameters if p.grad is not None]
    if max_norm > 0:
        return float(torch.nn.utils.clip_grad_norm_(parameters, max_norm))
    return float(torch.nn.utils.get_total_norm([p.grad for p in parameters]))


# --------------------------------------------------------------------------------------------------
# 5. Precision: autocast for the compute, fp32 for the weights and the optimizer
# --------------------------------------------------------------------------------------------------

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    """auto: CUDA if present (this rank's GPU under torchrun), else Apple MPS, else CPU; model.py's
    one check of --device (meta, a missing GPU or an unknown name is one TrainError line)."""
    return model_lib.resolve_device(name, TrainError)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on a CUDA GPU with bf16 tensor cores (Ampere and later), fp16 on an older GPU,
    fp32 on CPU/MPS (bf16 is slow there). An older GPU (a V100, a T4) reports bf16 as supported
    because it emulates it in fp32 arithmetic, about as slow as fp32 and far from the bf16 peak MFU
    is measured against: it gets fp16."""
    if name != "auto":
        return DTYPES[name]
    if device.type == "cuda":
        return (
            torch.bfloat16
            if torch.cuda.is_bf16_supported(including_emulation=False)
            else torch.float16
        )
    return torch.float32


def autocast(device: torch.device, dtype: torch.dtype):
    """The forward/backward context: low-precision matmuls, fp32 parameters untouched."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


# --------------------------------------------------------------------------------------------------
# 6. Checkpoints: atomic writes, keep the last K, safe loading, fall back past a damaged file
# --------------------------------------------------------------------------------------------------

CKPT_PATTERN = re.compile(r"^ckpt_(\d{7})\.pt$")
# every setting of the run, as a --config file (the screen shows a summary)
CONFIG_FILE = "train_config.json"
# fileio.write_atomic's, in flight
TEMP_PATTERN = re.compile(r"^\.(ckpt_\d{7}\.pt|loss\.png|train_config\.json)\.\w+\.tmp$")


def checkpoint_path(out_dir, step: int) -> pathlib.Path:
    """OUT_DIR/ckpt_{step:07d}.pt"""
    return pathlib.Path(out_dir) / f"ckpt_{step:07d}.pt"


def list_checkpoints(out_dir) -> list[pathlib.Path]:
    """Checkpoint files in `out_dir`, newest (highest step) first; temp files of interrupted writes
    are ignored."""
    out_dir = pathlib.Path(out_dir)
    found = [p for p in out_dir.iterdir() if CKPT_PATTERN.match(p.name)] if out_dir.is_dir() else []
    return sorted(found, key=lambda p: int(CKPT_PATTERN.match(p.name).group(1)), reverse=True)


def atomic_save(obj, path) -> None:
    """torch.save with a checksum to a temp file in the same directory, fsync it, then rename over
    `path` (fileio.write_atomic), and fsync the directory so that the rename itself is on disk.

    A crash at any moment leaves either the old file or the complete new one, never half a
    checkpoint; a temp file left by a kill is removed by the next run (remove_stale_temp_files). A
    full disk is one line (TrainError).
    """
    def save(f) -> None:
        hashing = HashingWriter(f)
        torch.save(obj, hashing)
        append_checksum(hashing)
    path = fileio.write_atomic(path, save, error=TrainError, fix="choose another --out-dir")
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)                  # make the rename itself durable
    finally:
        os.close(dir_fd)


def remove_stale_temp_files(out_dir, log=print) -> None:
    """Delete the temp files (.ckpt_*.pt.XXXX.tmp, .loss.png.XXXX.tmp) of writes that a kill
    interrupted."""
    for stale in pathlib.Path(out_dir).iterdir():
        if TEMP_PATTERN.match(stale.name):
            stale.unlink(missing_ok=True)
            log(f"removed {stale}, left by an interrupted write")


def check_writable_dir(path) -> None:
    """Raise TrainError unless `path` is a writable directory or could be created as one. Writes
    nothing."""
    problem = fileio.output_path_problem(path)
    if problem:
        raise TrainError(f"--out-dir: {problem}; choose another --out-dir")
    path = pathlib.Path(path)
    try:
        # one stat: between an exists() and an is_dir() another rank may remove its empty folder
        is_folder = stat.S_ISDIR(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_folder = True                # not there (yet): the check below names what is in the way
    if not is_folder:
        raise TrainError(f"--out-dir {path} is a file; choose a directory")
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise TrainError(
            f"--out-dir {path} is not writable ({existing} is "
            f"{'not a directory' if not existing.is_dir() else 'read-only'}); choose another "
            "--out-dir"
        )


def prune_checkpoints(out_dir, keep: int) -> None:
    """Delete all but the `keep` newest checkpoints."""
    for old in list_checkpoints(out_dir)[max(1, keep):]:
        old.unlink(missing_ok=True)


def load_checkpoint(path_or_dir, log=print) -> dict:
    """Load a checkpoint with torch.load(weights_only=True) (no arbitrary pickle code can run).

    Given a directory, the newest checkpoint that loads is returned; a damaged newer one is reported
    and skipped. The returned dict gets one extra key, "path".
    """
    path = pathlib.Path(path_or_dir)
    candidates = list_checkpoints(path) if path.is_dir() else [path]
    if not candidates and (path / "config.json").is_file():
        raise TrainError(
            f"{path} is a Hugging Face model directory, not a checkpoint; convert it first: python "
            f"model.py import-hf --from {path} --to imported.pt, then pass imported.pt"
        )
    if not candidates:
        raise TrainError(
            f"no checkpoint (ckpt_*.pt) in {path}; train first or pass a checkpoint file"
        )
    problems = []
    for candidate in candidates:
        try:
            # before torch.load: zeros inside load silently
            verify_checksum(candidate)
            ckpt = torch.load(candidate, map_location="cpu", weights_only=True)
            check_checkpoint_fields(ckpt)
        # truncated zip, bad checksum, bad pickle, wrong content: all mean "damaged"
        except Exception as e:
            problems.append(
                f"{candidate.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            )
            if len(candidates) > 1:
                log(
                    f"checkpoint {candidate} is damaged ({problems[-1]}); falling back to the "
                    "previous one"
                )
            continue
        ckpt["path"] = str(candidate)
        return ckpt
    raise TrainError(f"no loadable checkpoint in {path}: " + "; ".join(problems))


# A context longer than any Llama-format model's (Llama 3.1: 131,072): a KV cache or a mask of
# 10**13 positions is an allocation of petabytes, so a larger block_size is damage, not a plan.
MAX_BLOCK_SIZE = 2**20


# What each field of a checkpoint must be, beside "model" (a dict of floating-point weights):
# (type, what it must be, a check of the value). The last five are what --resume restores; an
# imported checkpoint (model.py import-hf) has none of them, and a field that is absent is skipped.
CHECKPOINT_FIELDS = {
    "model_config": (dict, "an object of GPTConfig fields", lambda config: True),
    "tokenizer_json": (str, "a tokenizer JSON string", lambda text: True),
    "step": (int, "a step number >= 0", lambda step: step >= 0),
    "optimizer": (dict, "an optimizer state_dict (state, param_groups)",
                  lambda state: {"state", "param_groups"} <= state.keys()),
    "train_config": (dict, "an object of train.py settings", lambda config: True),
    "rng": (list, "a list of random states, one per rank", lambda states: len(states) > 0),
    "loader": (list, "a list of loader states, one per rank", lambda states: len(states) > 0),
    "metrics": (dict, "an object with tokens, lr_scale and guard",
                lambda metrics: {"tokens", "lr_scale", "guard"} <= metrics.keys()),
}


def check_checkpoint_fields(ckpt) -> None:
    """What torch.load gave, checked field by field before anything uses it (fileio.expect): a
    dict of version 1, its "model" a dict of finite floating-point tensors (int64 or NaN weights
    would train, evaluate and export as garbage), then CHECKPOINT_FIELDS. A bad one raises
    ValueError naming the field, e.g. "step is 'x', not a step number >= 0", which load_checkpoint
    reports with the file's name (a run directory falls back to its previous checkpoint)."""
    fix = "the file is damaged or hand-edited: use a checkpoint train.py wrote"
    fileio.expect(ckpt, dict, "the checkpoint", "a train.py checkpoint (version 1, with a model)",
                  fix=fix, ok=lambda ckpt: ckpt.get("version") == 1 and "model" in ckpt)
    weights = fileio.expect(ckpt["model"], dict, "model", "a dict of weights", fix=fix)
    for name, weight in weights.items():
        fileio.expect(getattr(weight, "dtype", weight), torch.dtype, f"model[{name!r}].dtype",
                      "a floating-point dtype", fix=fix, ok=lambda dtype: dtype.is_floating_point)
        # the spike guard never saves a NaN: one here is damage
        fileio.expect(weight, torch.Tensor, f"model[{name!r}]", "finite weights (no NaN or inf)",
                      fix=fix, ok=lambda weight: bool(torch.isfinite(weight).all()))
    for key in (key for key in CHECKPOINT_FIELDS if key in ckpt):
        kind, shape, ok = CHECKPOINT_FIELDS[key]
        fileio.expect(ckpt[key], kind, key, shape, fix=fix, ok=ok)


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
    fileio.expect(config.block_size, int, f"{ckpt['path']}: model_config.block_size",
                  f"a context of at most {MAX_BLOCK_SIZE:,} positions", model_lib.ConfigError,
                  "the file is damaged or hand-edited", lambda size: size <= MAX_BLOCK_SIZE)
    with torch.device("meta"):
        want = {k: tuple(v.shape) for k, v in model_lib.GPT(config).state_dict().items()}
    have = {k: tuple(getattr(v, "shape", ())) for k, v in ckpt["model"].items()}
    for name in sorted(want.keys() ^ have.keys()) or [k for k in want if want[k] != have[k]][:1]:
        raise model_lib.ConfigError(
            f"{ckpt['path']}: weight {name} has shape {have.get(name, 'missing')} but its "
            f"model_config implies {want.get(name, 'none')}; the file is damaged or "
            f"hand-edited: use the checkpoint train.py wrote"
        )
    return config


def rng_state() -> dict:
    """Every random generator the run touches, as plain tensors/lists (weights_only-loadable). On
    CUDA, only the generator of this rank's GPU (the current device: parallel.init_distributed sets
    it): each rank saves its own, and a resume where a process sees fewer GPUs (one per process, as
    under many schedulers) still finds it."""
    np_state = np.random.get_state()
    state = {"python": random.getstate(),
             "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    """Inverse of rng_state(): the CUDA generator goes back to this rank's GPU (a checkpoint of an
    older train.py holds a list, one per visible GPU: not restored)."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, *rest = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and torch.is_tensor(state.get("cuda")):
        torch.cuda.set_rng_state(state["cuda"])


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
# 8. Watching the run: MFU, metrics.jsonl, loss curve
# --------------------------------------------------------------------------------------------------

# Dense peak FLOP/s per GPU, from the vendors' datasheets, keyed by the exact name
# torch.cuda.get_device_name() reports (a substring match would give "NVIDIA L40S" the L4's figure
# and the H100 PCIe the SXM's). NVIDIA's datasheets print tensor-core figures "with sparsity" (2:4
# structured); dense, which training runs, is half.
#   bf16: bf16/fp16 tensor cores (fp32 accumulate)   tf32: fp32 matmuls on tensor cores (torch's
#   set_float32_matmul_precision("high"))   fp32: plain fp32 (torch's default "highest" precision)
# Sources: NVIDIA H100 datasheet (SXM / PCIe / NVL columns), H200 datasheet (SXM / NVL), A100
# datasheet (40 and 80 GB, PCIe and SXM have the same peaks), L4, L40, L40S and A10 datasheets, the
# HGX B200 datasheet (per GPU; no dense fp32/tf32 figure we could confirm, so none is given), Ada
# whitepaper (RTX 4090, fp32 accumulate), AMD Instinct MI300X datasheet (AMD prints dense figures).
_H100_SXM = {"bf16": 989e12, "tf32": 494.5e12, "fp32": 67e12}
_A100 = {"bf16": 312e12, "tf32": 156e12, "fp32": 19.5e12}
GPU_PEAK_FLOPS = {
    **dict.fromkeys(["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GH200 480GB"], _H100_SXM),
    "NVIDIA H100 PCIe": {"bf16": 756.5e12, "tf32": 378e12, "fp32": 51e12},
    **dict.fromkeys(
        ["NVIDIA H100 NVL", "NVIDIA H200 NVL"], {"bf16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12}
    ),
    **dict.fromkeys(
        [
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100-PCIE-40GB",
            "NVIDIA A100 80GB PCIe",
        ],
        _A100,
    ),
    "NVIDIA B200": {"bf16": 2250e12},
    "NVIDIA L4": {"bf16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
    "NVIDIA L40": {"bf16": 181e12, "tf32": 90.5e12, "fp32": 90.5e12},
    "NVIDIA L40S": {"bf16": 362e12, "tf32": 183e12, "fp32": 91.6e12},
    "NVIDIA A10": {"bf16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12},
    "NVIDIA GeForce RTX 4090": {"bf16": 165.2e12, "tf32": 82.6e12, "fp32": 82.6e12},
    **dict.fromkeys(
        ["AMD Instinct MI300X", "AMD Instinct MI300X VF"],
        {"bf16": 1307.4e12, "tf32": 653.7e12, "fp32": 163.4e12},
    ),
}


def gpu_peak_flops(name: str, dtype: torch.dtype, tf32: bool = False) -> float | None:
    """The datasheet's dense peak for the GPU called `name` (exactly as torch reports it) computing
    in `dtype`; fp32 counts tensor cores only when `tf32` matmuls are allowed. None when the table
    does not know it.

    >>> bf16 = torch.bfloat16
    >>> gpu_peak_flops("NVIDIA L40S", bf16) / 1e12, gpu_peak_flops("NVIDIA L4", bf16) / 1e12
    (362.0, 121.0)
    >>> gpu_peak_flops("NVIDIA RTX 9999", torch.bfloat16) is None
    True
    """
    column = "bf16" if dtype in (torch.bfloat16, torch.float16) else "tf32" if tf32 else "fp32"
    return GPU_PEAK_FLOPS.get(name.strip(), {}).get(column)


def peak_flops(device: torch.device, dtype: torch.dtype) -> float | None:
    """Dense peak FLOP/s of the device: the GPU table (None for a GPU it does not know: pass
    --peak-flops); on a CPU or Apple GPU, measured with a 1024^3 matmul in fp32."""
    if device.type == "cuda":
        tf32 = (
            torch.get_float32_matmul_precision() != "highest"
            or torch.backends.cuda.matmul.allow_tf32
        )
        return gpu_peak_flops(torch.cuda.get_device_name(device), dtype, tf32)
    # a private generator: the run's RNG stays untouched
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(1024, 1024, device=device, generator=gen)
    b = torch.randn(1024, 1024, device=device, generator=gen)
    a @ b                                            # warm up
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        a @ b
        if device.type == "mps":
            torch.mps.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * 1024 ** 3 / best


class MetricsLog:
    """Append one JSON object per line to OUT_DIR/metrics.jsonl (flushed per line, so a crash loses
    nothing).

    A NaN or infinite number (a diverged loss) is written as null: JSON has no NaN, and a reader
    such as Python's json module would accept the file while jq, JavaScript or pandas refuse it.
    """

    def __init__(self, path, enabled: bool = True):
        self.path = pathlib.Path(path)
        self.file = open(self.path, "a") if enabled else None

    def write(self, record: dict) -> None:
        if self.file:
            record = {
                k: None if isinstance(v, float) and not math.isfinite(v) else v
                for k, v in record.items()
            }
            self.file.write(json.dumps(record, allow_nan=False) + "\n")
            self.file.flush()

    def close(self) -> None:
        if self.file:
            self.file.close()


def read_metrics(path) -> list[dict]:
    """All records of a metrics.jsonl (a torn last line from a kill is ignored)."""
    records = []
    for line in pathlib.Path(path).read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            records.append(json.loads(line))
    return records


def plot_loss_curve(metrics_path, png_path) -> pathlib.Path:
    """Train loss per step and validation loss per evaluation, drawn into a PNG (written
    atomically)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    train, val = {}, {}
    # a resumed run rewrites steps: keep the last value
    for r in read_metrics(metrics_path):
        if r.get("loss") is not None and "event" not in r:
            train[r["step"]] = r["loss"]
        if r.get("val_loss") is not None:
            val[r["step"]] = r["val_loss"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(list(train), list(train.values()), lw=0.8, alpha=0.6, label="train loss")
    ax.plot(list(val), list(val.values()), "o-", label="validation loss")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    try:
        return fileio.write_atomic(
            png_path,
            lambda f: fig.savefig(f, format="png", dpi=100, bbox_inches="tight"),
            error=TrainError,
            fix="choose another --out-dir",
        )
    finally:
        plt.close(fig)


def eval_plan(
    num_windows: int, batch_size: int, world_size: int, eval_batches: int
) -> tuple[int, int]:
    """(sequences per rank per batch, batches) for one validation estimate over a split of
    `num_windows` windows.

    Every rank reads distinct windows and the split is read at most once (never wrapped into a
    reshuffled second pass), so a rank's batch shrinks to what the split holds: the default pydocs
    val split has 22 windows of 1,025 tokens; 8 ranks x --batch-size 16 would need 128, so each rank
    reads 2 (16 of the 22 windows), once.
    >>> eval_plan(22, 16, 8, 10), eval_plan(1_000, 16, 2, 10), eval_plan(100, 16, 2, 10)
    ((2, 1), (16, 10), (16, 3))
    """
    if num_windows < world_size:
        raise TrainError(
            f"the val split has {num_windows} windows of block-size + 1 tokens, fewer than the "
            f"{world_size} data-parallel ranks that each need one; use a smaller --block-size or "
            f"more validation text (--val-data)"
        )
    batch = min(batch_size, num_windows // world_size)
    return batch, max(1, min(eval_batches, num_windows // (batch * world_size)))


def model_flops_utilization(
    tokens_per_s: float, flops_per_token: float, peak_flops: float, devices: int
) -> float:
    """MFU of one device: the model FLOP/s the run achieves per device over one device's peak (a
    fraction).

    `tokens_per_s` counts every rank's tokens; `devices` is every process of the run (dp x tp x pp),
    since each one computes its share of the 6N FLOPs per token. 2 GPUs at 2,925 tokens/s each
    (5,850 in all) on a model of 1e9 FLOPs/token with a 1e13 FLOP/s peak: 5,850 x 1e9 / (2 x 1e13) =
    29.25%, what each GPU does.
    >>> round(model_flops_utilization(5_850, 1e9, 1e13, devices=2), 4)
    0.2925
    """
    return tokens_per_s * flops_per_token / (peak_flops * devices)


def format_duration(seconds: float) -> str:
    """125 -> '2m05s'."""
    seconds = int(max(0, seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


# --------------------------------------------------------------------------------------------------
# Configuration: every setting of a run, one dataclass (the flags, their help and checks: the CLI at
# the end)
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class TrainConfig:
    """Every setting of a run: each field is a flag (`max_steps` -> `--max-steps`, its help in HELP
    by the CLI) and a key of a --config file."""
    # data and model
    # sources to prepare (comma-separated), or a prepared dataset directory
    data: str = "pydocs"
    val_data: str = ""              # held-out file(s) used verbatim as the validation split
    cleaning: str = "auto"          # data.py's cleaning: auto | web | keep
    vocab_size: int = 0             # BPE size if data.py trains one (0 = default)
    model: str = "tiny"             # a preset of model.PRESETS
    model_args: str = ""            # preset overrides, 'n_layer=2,n_embd=32'
    out_dir: str = "out"            # checkpoints, metrics.jsonl, loss.png
    seed: int = 0                   # model init, data order, sampling
    # batch
    batch_size: int = 16            # sequences per forward per rank (the micro-batch)
    block_size: int = 0             # tokens per sequence (0 = the model's)
    # tokens per optimizer step, all ranks (0 = one micro-batch per rank)
    total_batch_tokens: int = 0
    # optimisation
    max_steps: int = 600            # optimizer steps: the schedule's total
    lr: float = 2e-3                # peak learning rate
    min_lr_ratio: float = 0.1       # final lr / peak
    warmup_steps: int = 30
    schedule: str = "cosine"        # cosine | wsd
    decay_fraction: float = 0.2     # wsd: the decaying fraction of the steps
    weight_decay: float = 0.1       # AdamW, weight matrices only
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0          # global grad-norm limit (0 = off)
    # precision and speed
    device: str = "auto"            # auto | cpu | cuda | mps
    dtype: str = "auto"             # auto | fp32 | bf16 | fp16
    compile: bool = False           # torch.compile
    activation_checkpointing: bool = False   # recompute block activations in backward
    # the hardware's peak FLOP/s for MFU (0 = datasheet table or measured)
    peak_flops: float = 0.0
    # checkpoints and evaluation
    eval_interval: int = 100
    eval_batches: int = 10          # micro-batches per validation estimate
    eval_at_start: bool = True      # evaluate at step 0 (about ln(vocab))
    ckpt_interval: int = 250
    keep_checkpoints: int = 3
    resume: str | None = None       # "latest" (bare --resume) or a checkpoint file
    # a checkpoint whose weights, shape and tokenizer start a new run
    init_from: str = ""
    overwrite: bool = False         # delete the run in --out-dir and start over
    log_interval: int = 10          # steps between progress lines
    plot: bool = True               # draw loss.png at the end
    # loss-spike guard
    spike_factor: float = 2.0       # a spike: a loss over this x the median
    spike_window: int = 50          # recent losses the median is taken over
    spike_patience: int = 3         # spikes in a row before a rollback
    rollback_lr_factor: float = 0.5
    # samples at the end
    num_samples: int = 2
    sample_tokens: int = 120
    temperature: float = 0.8
    top_k: int = 40                 # 0 = all tokens
    prompt: str = ""                # empty = the start of a document
    # parallelism (parallel.py, model_parallel.py; see wrap_for_distribution)
    zero: int = 0                   # ZeRO stage 0-3
    zero_reduce_dtype: str = "fp32"  # --zero 3 in bf16: the dtype gradients are reduce-scattered in
    tp: int = 1
    pp: int = 1
    ep: int = 1
    cp: int = 1
    pp_schedule: str = "1f1b"       # afab | 1f1b
    micro_batches: int = 0          # pipeline micro-batches per step (0 = the accumulation steps)


# --------------------------------------------------------------------------------------------------
# Distribution: process group and the one place where model and optimizer are wrapped
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Dist:
    """Where this process sits: data-parallel rank among world_size ranks (rank 0 of 1 without
    torchrun).

    `mesh` is parallel.py's dp x tp x pp grid under torchrun (None in one process); `device` is the
    device torchrun assigned (one GPU per local rank) or None.
    """
    rank: int = 0
    world_size: int = 1
    mesh: object = None
    device: torch.device | None = None
    # with --tp/--pp several processes share a data-parallel rank; one logs
    global_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.global_rank == 0

    @property
    def devices(self) -> int:
        """Every process of the run (dp x tp x pp), one device each."""
        return self.mesh.world if self.mesh is not None else 1


def setup_distributed(cfg: TrainConfig) -> Dist:
    """Under torchrun (WORLD_SIZE > 1) join the process group and build the mesh through
    parallel.py.

    A process group that is already up (a caller such as parallel.launch started it) is used as it
    is.
    """
    import parallel
    joined = torch.distributed.is_available() and torch.distributed.is_initialized()
    try:                            # torchrun's variables are checked before a group starts
        world = torch.distributed.get_world_size() if joined else parallel.check_launch_env()[1]
        # `torchrun --nproc_per_node=1 train.py --zero 2` is a real layout (ZeRO's code path on one
        # GPU, the way a one-GPU bench checks it): a process that torchrun started joins a group
        # of one. A plain `python train.py --zero 2` has no process group to join.
        launched = joined or "RANK" in os.environ
        if world <= 1 and not (launched and uses_model_parallel(cfg)):
            if uses_model_parallel(cfg):
                flags = model_parallel_flags(cfg)          # the ones given: "--ep 2"
                raise TrainError(
                    f"{' '.join(flags)} need{'s' if len(flags) == 1 else ''} a process group: "
                    "launch with torchrun --nproc_per_node=N"
                    + (" (N=1 runs ZeRO's code path on one device)" if cfg.zero else ""))
            return Dist()
        _, _, device = parallel.init_distributed()
        parallel.check_combination(cfg.zero, cfg.tp, cfg.pp)
        mesh = parallel.Mesh.build(dp=-1, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp)
    except parallel.ParallelError as e:
        raise TrainError(str(e)) from e
    return Dist(
        rank=mesh.dp.rank, world_size=mesh.dp.size, mesh=mesh, device=device, global_rank=mesh.rank
    )


def uses_model_parallel(cfg: TrainConfig) -> bool:
    """ZeRO, tensor or pipeline parallel: the model and optimizer go through
    model_parallel.parallelize."""
    return bool(cfg.zero) or max(cfg.tp, cfg.pp, cfg.ep, cfg.cp) > 1


def model_parallel_flags(cfg: TrainConfig) -> list[str]:
    """The flags that make `uses_model_parallel` true, as given: ["--zero 2", "--cp 2"]."""
    given = [("--zero", cfg.zero)] if cfg.zero else []
    given += [(flag, size) for flag, size in
              (("--tp", cfg.tp), ("--pp", cfg.pp), ("--ep", cfg.ep), ("--cp", cfg.cp)) if size > 1]
    return [f"{flag} {size}" for flag, size in given]


def wrap_for_distribution(model: torch.nn.Module, optimizer, cfg: TrainConfig, dist: Dist,
                          dtype: torch.dtype = torch.float32):
    """The one place where the model and the optimizer are wrapped for distribution. Returns (model,
    optimizer).

    Data parallel: every rank holds the whole model (rank 0's initial weights are broadcast), sees
    different batches, and gradients are averaged before the update, so every rank makes the same
    update. The returned model has `no_sync()` (accumulation micro-batches skip the averaging) and
    `finish_gradient_sync()`. ZeRO-3 in bf16 (`dtype`) is FSDP's mixed precision: weights gathered
    in bf16, fp32 master shards.
    """
    import parallel
    if dist.mesh is None or (dist.world_size == 1 and not uses_model_parallel(cfg)):
        return parallel.Layout(model), optimizer      # one whole model: the interface's defaults
    import model_parallel
    if uses_model_parallel(cfg):
        if cfg.dtype == "fp16":
            raise TrainError(
                "--dtype fp16 with --zero/--tp/--pp: ranks holding different gradients would "
                "disagree "
                "on the loss scaler's overflow check; use --dtype bf16 or fp32"
            )
        # ZeRO / TP / PP: model_parallel.py splits the full model and optimizer over the mesh; the
        # returned pair keeps this loop's calls and saves checkpoints in the single-process format
        # (any layout can resume them).
        if (cfg.block_size or model.config.block_size) % (2 * cfg.cp):
            raise TrainError(f"--block-size is not a multiple of 2 x --cp {cfg.cp} (each rank "
                             f"holds two chunks of every sequence); use a multiple of {2 * cfg.cp}")
        mixed = {}
        if cfg.zero == 3 and dtype == torch.bfloat16:
            mixed = dict(compute_dtype=dtype, reduce_dtype=DTYPES[cfg.zero_reduce_dtype])
        try:
            return model_parallel.parallelize(
                model,
                optimizer,
                dist.mesh,
                zero=cfg.zero,
                schedule=cfg.pp_schedule,
                ep=cfg.ep,
                **mixed,
            )
        except parallel.ParallelError as e:
            raise TrainError(str(e)) from e
    return parallel.DataParallel(model, dist.mesh.dp), optimizer


def compile_model(model: torch.nn.Module, raw_model: torch.nn.Module,
                  per_block: bool) -> torch.nn.Module:
    """torch.compile with static shapes: an eval batch of another size gets a graph of its own
    instead of making the batch dimension dynamic. Under ZeRO/TP/PP (per_block) each block's
    forward is compiled, not the wrapper: ZeRO-3's hooks that gather a block's weights and free
    them (storage resized to 0) then run outside the compiled region (as in torchtitan), a
    pipeline stage's blocks are compiled (its step never calls the wrapper's forward), and a
    no_grad eval compiles its own block graph rather than rebuilding parameter views from a freed
    flat buffer. Env TRAIN_COMPILE_BACKEND: default inductor; "aot_eager" for fast CPU tests."""
    backend = os.environ.get("TRAIN_COMPILE_BACKEND", "inductor")
    compiled = functools.partial(torch.compile, backend=backend, dynamic=False)
    if not per_block:
        return compiled(model)
    for block in raw_model.blocks:
        if not isinstance(block, torch.nn.Identity):     # a pipeline stage's pruned block
            block.forward = compiled(block.forward)      # its hooks stay outside, in __call__
    return model


def all_reduce_mean(values: torch.Tensor, dist: Dist, over_world: bool = False) -> torch.Tensor:
    """Average a small float tensor over the data-parallel ranks, or with over_world over every
    process of the run (tp and pp ranks included); the identity in one process."""
    n = dist.devices if over_world else dist.world_size
    if n > 1:
        values = values.clone()
        torch.distributed.all_reduce(values, group=None if over_world else dist.mesh.dp.group)
        values /= n
    return values


def gather_objects(obj, dist: Dist) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if dist.world_size == 1:
        return [obj]
    out = [None] * dist.world_size
    torch.distributed.all_gather_object(out, obj, group=dist.mesh.dp.group)
    return out


# --------------------------------------------------------------------------------------------------
# The trainer: wires data.py, model.py and the pieces above
# --------------------------------------------------------------------------------------------------

def open_dataset(cfg: TrainConfig, dist: Dist, log=print):
    """A data.TokenData from --data: a prepared dataset directory as is, else
    data_at_scale.prepare(sources) (cached).

    Under torchrun rank 0 prepares first while the others wait, then they find it in the cache.
    """
    path = pathlib.Path(cfg.data)
    val_data = [s.strip() for s in cfg.val_data.split(",") if s.strip()]
    try:
        if (path / "manifest.json").is_file():
            if val_data or cfg.cleaning != "auto":
                raise TrainError(
                    f"--data {cfg.data} is a prepared dataset: --val-data and --cleaning apply "
                    "when "
                    f"train.py prepares the data; pass them to data.py prepare instead"
                )
            return data_lib.TokenData(path)
        sources = [s.strip() for s in cfg.data.split(",") if s.strip()]
        kwargs = {"vocab_size": cfg.vocab_size} if cfg.vocab_size else {}
        kwargs.update(
            val_data=val_data or None, clean_settings=data_lib.CleanSettings(cleaning=cfg.cleaning)
        )
        log(f"preparing data {sources} (cached after the first time)")
        if dist.mesh is not None and not dist.is_main:
            dist.mesh.wait_for_rank0()
        from machinery import data_at_scale            # the engines' entry: small inputs run data.build_in_memory
        # the dataset's notices (the cleaning note) are rank 0's to print: the other ranks find the
        # dataset in the cache, which prints them again, once per rank
        quiet = dist.mesh is not None and not dist.is_main
        with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            data_dir = data_at_scale.prepare(sources, engine="auto", **kwargs)
        if dist.mesh is not None and dist.is_main:
            dist.mesh.wait_for_rank0()
        return data_lib.TokenData(data_dir)
    except (ValueError, OSError, KeyError) as e:
        raise TrainError(f"cannot use --data {cfg.data!r}: {e}") from e


def parse_model_args(text: str) -> dict:
    """'n_layer=2,n_embd=32,dropout=0.1' -> {'n_layer': 2, 'n_embd': 32, 'dropout': 0.1}, typed by
    GPTConfig."""
    types = {f.name: str(f.type) for f in dataclasses.fields(model_lib.GPTConfig)}
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in types:
            raise TrainError(
                f"--model-args: {item!r} is not NAME=VALUE with NAME a GPTConfig field "
                f"({', '.join(types)})"
            )
        kind = next((k for k in ("bool", "int", "float") if k in types[key]), "str")
        try:
            out[key] = {
                "bool": lambda v: v.lower() in ("1", "true", "yes"),
                "int": int,
                "float": float,
                "str": str,
            }[kind](value)
            if kind == "float" and not math.isfinite(out[key]):
                raise ValueError(f"{value} is not a finite number")
        except ValueError as e:
            raise TrainError(f"--model-args: bad value in {item!r}: {e}") from e
    return out


def build_model_config(cfg: TrainConfig, vocab_size: int):
    """The preset, with --model-args, the tokenizer's vocab size and --activation-checkpointing
    applied."""
    if cfg.model not in model_lib.PRESETS:
        raise TrainError(
            f"unknown --model {cfg.model!r}; choose one of {', '.join(model_lib.PRESETS)}"
        )
    # the tokenizer decides
    overrides = {**parse_model_args(cfg.model_args), "vocab_size": vocab_size}
    if cfg.activation_checkpointing:
        overrides["activation_checkpointing"] = True
    try:
        return dataclasses.replace(model_lib.PRESETS[cfg.model], **overrides)
    except (ValueError, AssertionError) as e:
        raise TrainError(
            f"--model {cfg.model} --model-args {cfg.model_args!r} is not a valid model: {e}"
        ) from e


def check_fits(config, device: torch.device) -> None:
    """Refuse a model whose training state cannot fit: 16 bytes per parameter (fp32 weights and
    gradients, AdamW's two moments), spread at best over every process of the run, against the
    device's memory. Building it would only crash or swap after minutes of setup. Activations come
    on top, so passing is no promise."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    need = 16 * config.num_params() / processes
    try:
        have = (
            torch.cuda.get_device_properties(device).total_memory
            if device.type == "cuda"
            else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
            if device.type == "cpu"
            else None
        )
    # no sysconf (Windows): nothing to compare with
    except (ValueError, OSError, AttributeError):
        have = None
    if have and need > have:
        raise TrainError(
            f"--model/--model-args: {config.num_params():,} parameters need {need / 1e9:.1f} GB of "
            f"training state per process (16 bytes/param), more than the {have / 1e9:.1f} GB of "
            "this "
            f"{device.type}; choose a smaller model or more processes"
        )


class Trainer:
    """Holds the run's state (model, optimizer, loader, step, guard) and runs the loop. Build it,
    then .run()."""

    def __init__(self, cfg: TrainConfig, log=print):
        validate_config(cfg)
        # fail before the data is prepared; the tokenizer's vocab comes later
        if not cfg.init_from:
            build_model_config(
                cfg, model_lib.PRESETS.get(cfg.model, model_lib.GPTConfig()).vocab_size
            )
        self.dist = setup_distributed(cfg)
        self.log = log if self.dist.is_main else (lambda *a, **k: None)
        self.cfg = cfg = clamp_warmup(cfg, self.log)
        self.device = self.dist.device or resolve_device(cfg.device)
        self.dtype = resolve_dtype(cfg.dtype, self.device)
        # page-locked batches: .to(non_blocking=True) is async
        self.pin_memory = self.device.type == "cuda"
        self.out_dir = pathlib.Path(cfg.out_dir)
        resume_ckpt = self._prepare_out_dir()
        # before the data is prepared
        init_ckpt = self._load_init_checkpoint() if cfg.init_from else None
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed + self.dist.rank)

        self.data = open_dataset(cfg, self.dist, self.log)
        self.tokenizer = self.data.tokenizer
        if init_ckpt and init_ckpt.get("tokenizer_json") != self.tokenizer.to_json():
            raise TrainError(
                f"--init-from {cfg.init_from} has another tokenizer than --data {cfg.data!r}; "
                "prepare "
                "the data with its tokenizer: python data.py prepare --tokenizer TOKENIZER.json "
                "(an "
                f"exported or imported Hugging Face tokenizer.json works)"
            )
        self.model_config = (
            model_lib.GPTConfig.from_dict(
                {
                    **init_ckpt["model_config"],
                    "activation_checkpointing": cfg.activation_checkpointing,
                }
            )
            if init_ckpt
            else build_model_config(cfg, self.data.vocab_size)
        )
        self.block_size = cfg.block_size or self.model_config.block_size
        if self.block_size > self.model_config.block_size:
            raise TrainError(f"--block-size {self.block_size} exceeds the model's block_size "
                             f"{self.model_config.block_size}; use at most that")
        self.accum = plan_accumulation(
            cfg.total_batch_tokens, cfg.batch_size, self.block_size, self.dist.world_size
        )
        self.tokens_per_step = cfg.batch_size * self.block_size * self.accum * self.dist.world_size
        if cfg.pp > 1 and cfg.micro_batches and (cfg.batch_size * self.accum) % cfg.micro_batches:
            raise TrainError(
                f"--micro-batches {cfg.micro_batches} does not divide the "
                f"{cfg.batch_size * self.accum} "
                f"sequences per rank and step; choose a divisor of it"
            )

        check_fits(self.model_config, self.device)
        # fp32 master weights, always
        self.raw_model = model_lib.GPT(self.model_config).to(self.device)
        if init_ckpt and resume_ckpt is None:
            self.raw_model.load_state_dict(init_ckpt["model"])
        optimizer = make_optimizer(self.raw_model, cfg, self.device.type)
        self.model, self.optimizer = wrap_for_distribution(
            self.raw_model, optimizer, cfg, self.dist, self.dtype
        )
        if cfg.compile:
            self.model = compile_model(self.model, self.raw_model, uses_model_parallel(cfg))
        self.scaler = (
            torch.amp.GradScaler(self.device.type) if self.dtype == torch.float16 else None
        )
        try:
            self.loader = self.data.iterator(
                "train",
                cfg.batch_size,
                self.block_size,
                rank=self.dist.rank,
                world_size=self.dist.world_size,
                seed=cfg.seed,
                pin_memory=self.pin_memory,
            )
        except data_lib.DataError as e:
            raise TrainError(
                f"--batch-size {cfg.batch_size} x --block-size {self.block_size}: {e}"
            ) from e
        self.guard = SpikeGuard(cfg.spike_factor, cfg.spike_window, cfg.spike_patience)
        self.step, self.tokens, self.lr_scale = 0, 0, 1.0
        self.last_eval: dict = {}
        self.stop_requested = False          # a signal reached this process
        # every process agreed, in a step's all-reduce, to stop after it
        self.stopping = False
        self.step_time = None                # smoothed seconds per step
        self.compiled = False                # the first (compiling) step is done
        try:
            val_windows = self.data.iterator("val", 1, self.block_size).num_windows
        except data_lib.DataError as e:
            raise TrainError(f"--block-size {self.block_size}: {e}") from e
        self.eval_batch, self.eval_batch_count = eval_plan(
            val_windows, cfg.batch_size, self.dist.world_size, cfg.eval_batches
        )
        self.bytes_per_token = data_lib.bytes_per_token(self.data, "val")
        self._flops_per_token = self.raw_model.flops_per_token(self.block_size)
        self._peak = cfg.peak_flops or peak_flops(self.device, self.dtype)
        # measured, not a datasheet's
        self._peak_probed = not cfg.peak_flops and self.device.type != "cuda"
        if resume_ckpt is not None:
            self.restore(resume_ckpt, rollback=False)
        # every input is known good: only now is anything written
        self._make_out_dir(fresh=resume_ckpt is None)
        self.metrics = MetricsLog(self.out_dir / "metrics.jsonl", enabled=self.dist.is_main)
        if resume_ckpt is not None:
            self.metrics.write(
                {"step": self.step, "event": "resumed", "checkpoint": resume_ckpt["path"]}
            )

    # -- setup
    # ----------------------------------------------------------------------------------------------

    def _prepare_out_dir(self):
        """Check, without writing anything, that out-dir can be created or written; return the
        checkpoint to resume from (or None); refuse to mix runs."""
        check_writable_dir(self.out_dir)
        existing = list_checkpoints(self.out_dir)
        if self.cfg.resume:
            where = self.out_dir if self.cfg.resume == "latest" else self.cfg.resume
            ckpt = self._load_flag_checkpoint(
                "--resume", where, "train first (without --resume) or pass a checkpoint file"
            )
            # weights only: nothing of a run to continue
            if "optimizer" not in ckpt:
                raise TrainError(
                    f"--resume: {ckpt['path']} has no optimizer state (written by model.py "
                    "import-hf): "
                    f"start a new run from its weights with --init-from {ckpt['path']}"
                )
            return ckpt
        if existing and not self.cfg.overwrite:
            raise TrainError(
                f"{self.out_dir} already holds a run ({existing[0].name}); add --resume to "
                "continue it, "
                f"--overwrite to start over, or pick another --out-dir"
            )
        return None

    def _load_init_checkpoint(self) -> dict:
        """--init-from: the checkpoint whose weights start the run (its shape replaces
        --model/--model-args; a resumed run takes the same shape and then its own newer weights).
        Its tokenizer must be --data's."""
        ckpt = self._load_flag_checkpoint(
            "--init-from",
            self.cfg.init_from,
            "pass a checkpoint (python model.py import-hf writes one from a Hugging Face model)",
        )
        try:
            checkpoint_config(ckpt)
        except (model_lib.ConfigError, KeyError, TypeError, AttributeError) as e:
            raise TrainError(f"--init-from: {str(e).splitlines()[0]}") from None
        self.log(f"initialising from {ckpt['path']} (--model and --model-args are not used)")
        return ckpt

    def _load_flag_checkpoint(self, flag: str, path, fix: str) -> dict:
        """load_checkpoint for a flag's value, its errors named after the flag."""
        path = pathlib.Path(path)
        if not path.exists():
            raise TrainError(f"{flag}: {path} does not exist; {fix}")
        try:
            return load_checkpoint(path, self.log)
        except TrainError as e:
            raise TrainError(f"{flag}: {e}") from e

    def _make_out_dir(self, fresh: bool) -> None:
        """Create out-dir (every rank; the same directory) and sweep away temp files of writes
        killed mid-way. A `fresh` run (not resumed; --overwrite, where a run was there) deletes the
        previous run's checkpoints and metrics: only now, once the new run is fully built, so a typo
        in another flag never costs the old run."""
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TrainError(
                f"--out-dir {self.out_dir} is not writable ({e.strerror}); choose another --out-dir"
            )
        if self.dist.is_main:
            remove_stale_temp_files(self.out_dir, self.log)
        if self.dist.is_main and fresh:
            for old in list_checkpoints(self.out_dir):
                old.unlink()
            (self.out_dir / "metrics.jsonl").unlink(missing_ok=True)

    # -- checkpoints
    # ----------------------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """The checkpoint, version 1: plain tensors, numbers and strings that
        torch.load(weights_only=True) reads. "model" is the single-process state dict (fp32, CPU)
        and "optimizer" the single-process optimizer's state_dict, whatever the layout (any layout
        resumes any other); "model_config", "train_config", "tokenizer_json" and "data_dir" rebuild
        the run; "rng" and "loader" hold one entry per data-parallel rank; "metrics" the tokens
        seen, the rollback lr factor, the spike guard and the last evaluation."""
        ranks = gather_objects({"rng": rng_state(), "loader": self.loader.state_dict()}, self.dist)
        return {
            "version": 1,
            "step": self.step,
            "model": self.model.full_state_dict(),  # collective when the model is split
            "model_config": self.model_config.to_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler else None,
            "train_config": dataclasses.asdict(self.cfg),
            "tokenizer_json": self.tokenizer.to_json(),
            "data_dir": str(
                self.data.data_dir if hasattr(self.data, "data_dir") else self.cfg.data
            ),
            "rng": [r["rng"] for r in ranks],
            "loader": [r["loader"] for r in ranks],
            "metrics": {
                "tokens": self.tokens,
                "lr_scale": self.lr_scale,
                "guard": self.guard.state_dict(),
                "last_eval": self.last_eval,
            },
        }

    def save_checkpoint(self) -> pathlib.Path:
        """Write OUT_DIR/ckpt_{step}.pt atomically (rank 0) and prune old ones; every rank must call
        it."""
        # collective under torchrun: every rank calls it
        state = self.state_dict()
        path = checkpoint_path(self.out_dir, self.step)
        if self.dist.is_main:
            atomic_save(state, path)
            prune_checkpoints(self.out_dir, self.cfg.keep_checkpoints)
        if self.dist.mesh is not None:
            # not in the next step's collective, with its short timeout
            self.dist.mesh.wait_for_rank0()
        return path

    def restore(self, ckpt: dict, rollback: bool) -> None:
        """Load a checkpoint into this run. rollback=True keeps the data position and RNG (skip the
        bad stretch)."""
        # first: another vocab also changes the config
        if ckpt["tokenizer_json"] != self.tokenizer.to_json():
            raise TrainError(
                f"checkpoint {ckpt['path']} was trained with another tokenizer than --data "
                f"{self.cfg.data!r}; resume with the run's data ({ckpt['data_dir']})"
            )
        if ckpt["model_config"] != self.model_config.to_dict():
            diff = {
                k: (v, self.model_config.to_dict().get(k))
                for k, v in ckpt["model_config"].items()
                if self.model_config.to_dict().get(k) != v
            }
            raise TrainError(
                f"checkpoint {ckpt['path']} is for another model (checkpoint vs now: {diff}); "
                f"resume with the same --model/--model-args or start a new --out-dir"
            )
        # A split model slices the single-process state dict to this rank's pieces; a whole one
        # loads it as it is.
        self.model.load_full_state_dict(ckpt["model"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        if self.scaler and ckpt.get("scaler"):
            self.scaler.load_state_dict(ckpt["scaler"])
        self.step = ckpt["step"]
        self.guard.load_state_dict(ckpt["metrics"]["guard"])
        if rollback:
            self.lr_scale *= self.cfg.rollback_lr_factor
            return
        # The loader's state (epoch, windows consumed by all ranks) is the same on every rank, so a
        # run may resume on another number of processes; each rank's random generators come back
        # only on the same world size.
        same_world = len(ckpt["rng"]) == self.dist.world_size
        if not same_world:
            self.log(
                f"note: checkpoint written by {len(ckpt['rng'])} ranks, resuming on "
                f"{self.dist.world_size}: "
                f"same data order, fresh random generators (exact only with dropout 0)"
            )
        try:
            self.loader.load_state_dict(ckpt["loader"][0])
        except data_lib.DataError as e:
            raise TrainError(f"cannot resume {ckpt['path']}: {e}") from e
        if same_world:
            set_rng_state(ckpt["rng"][self.dist.rank])
        self.tokens = ckpt["metrics"]["tokens"]
        self.lr_scale = ckpt["metrics"]["lr_scale"]
        self.last_eval = ckpt["metrics"].get("last_eval", {})
        changed = {k: (v, getattr(self.cfg, k)) for k, v in ckpt["train_config"].items()
                   if k not in ("resume", "overwrite") and getattr(self.cfg, k, v) != v}
        self.log(f"resumed from {ckpt['path']} at step {self.step}"
                 + (f" (settings changed, checkpoint -> now: {changed})" if changed else ""))

    # -- called by the loop
    # -------------------------------------------------------------------------------------------

    def next_micro_batches(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The `accum` micro-batches of the next step, each (x, y) of shape (batch_size,
        block_size)."""
        return [
            tuple(t.to(self.device, non_blocking=True) for t in self.loader.next())
            for _ in range(self.accum)
        ]

    def skip_batch(self, record: dict) -> None:
        """The guard refused this step's update: say so in metrics.jsonl and on screen."""
        record["skipped"] = True
        median = statistics.median(self.guard.history) if self.guard.history else float("nan")
        self.metrics.write(
            {
                "step": record["step"],
                "event": "skipped_batch",
                "loss": record["loss"],
                "grad_norm": record["grad_norm"],
                "median": median,
            }
        )
        self.log(
            f"step {record['step']}: loss {record['loss']:.4f} is a spike (median {median:.4f}); "
            f"batch skipped"
        )

    def rollback(self) -> None:
        """Repeated spikes: reload the last good checkpoint, lower the learning rate, keep going on
        fresh data."""
        try:
            ckpt = load_checkpoint(self.out_dir, self.log)
        except TrainError:
            self.lr_scale *= self.cfg.rollback_lr_factor
            self.metrics.write(
                {"step": self.step, "event": "rollback", "to_step": None, "lr_scale": self.lr_scale}
            )
            self.log(
                f"step {self.step}: repeated spikes and no checkpoint yet; lr scaled to "
                f"x{self.lr_scale:g}"
            )
            return
        from_step = self.step
        self.restore(ckpt, rollback=True)
        self.metrics.write({"step": from_step, "event": "rollback", "to_step": self.step,
                            "lr_scale": self.lr_scale, "checkpoint": ckpt["path"]})
        self.log(
            f"step {from_step}: repeated spikes; rolled back to {ckpt['path']} (step {self.step}), "
            f"lr scaled to x{self.lr_scale:g}"
        )

    @torch.no_grad()
    def evaluate(self) -> dict:
        """Mean validation loss over the same windows every time (see eval_plan); bits-per-byte from
        it."""
        self.model.eval()
        batch, batches = self.eval_batch, self.eval_batch_count
        loader = self.data.iterator(
            "val",
            batch,
            self.block_size,
            rank=self.dist.rank,
            world_size=self.dist.world_size,
            seed=0,
            pin_memory=self.pin_memory,
        )
        total = torch.zeros((), device=self.device)
        for _ in range(batches):
            x, y = (t.to(self.device, non_blocking=True) for t in loader.next())
            with autocast(self.device, self.dtype):
                _, loss = (self.model if uses_model_parallel(self.cfg) else self.raw_model)(x, y)
            total += loss.float()
        self.model.train()
        val_loss = float(all_reduce_mean(total / batches, self.dist))
        self.last_eval = {"step": self.step, "val_loss": val_loss,
                          "val_bpb": val_loss / math.log(2) / self.bytes_per_token}
        self.metrics.write(dict(self.last_eval))
        self.log(
            f"step {self.step:>6} | val loss {val_loss:.4f} | val bpb "
            f"{self.last_eval['val_bpb']:.4f}"
        )
        return self.last_eval

    @torch.no_grad()
    def sample(self, model: torch.nn.Module) -> list[str]:
        """`num_samples` continuations of --prompt (or of a document start) by `model`, seeded by
        --seed."""
        if self.cfg.num_samples <= 0 or self.cfg.sample_tokens <= 0:
            return []
        generator = torch.Generator(device=self.device).manual_seed(self.cfg.seed)
        start = (self.tokenizer.encode(self.cfg.prompt, allowed_special="all") if self.cfg.prompt
                 # no prompt: "a new document starts here"
                 else [self.data.eot_id or 0])
        start = start[-self.model_config.block_size:]
        idx = torch.tensor([start] * self.cfg.num_samples, dtype=torch.long, device=self.device)
        model.eval()
        out = model.generate(idx, self.cfg.sample_tokens, temperature=self.cfg.temperature,
                             top_k=self.cfg.top_k or None, generator=generator)
        model.train()
        return [self.cfg.prompt + self.tokenizer.decode(row[len(start):].tolist()) for row in out]

    def mfu(self, tok_per_s: float) -> float:
        """MFU at this throughput. A peak probed at start (CPU, Apple GPU) is only the best that one
        matmul saw, on a machine that may have been busy then: the run's own FLOP/s, when higher,
        become the peak (the best seen), so the MFU never exceeds 100%."""
        mfu = model_flops_utilization(
            tok_per_s, self._flops_per_token, self._peak, self.dist.devices
        )
        if mfu > 1 and self._peak_probed:
            self._peak, mfu = self._peak * mfu, 1.0
        return mfu

    def summary_line(self) -> str:
        """'tiny: 1,311,872 parameters | 600 steps x 2,048 tokens = 1,228,800 tokens | cpu float32 |
        ETA on the step lines, from step 10': the run in one line, printed first."""
        cfg, steps = self.cfg, self.cfg.max_steps - self.step
        resumed = f" (from step {self.step:,})" if self.step else ""
        # train_loop's first progress line: the next multiple of --log-interval, or the last step
        first_line = min((self.step // cfg.log_interval + 1) * cfg.log_interval, cfg.max_steps)
        return (
            f"{cfg.model}: {self.raw_model.num_params():,} parameters | {steps:,} steps{resumed} x "
            f"{self.tokens_per_step:,} tokens = {steps * self.tokens_per_step:,} tokens | "
            f"{self.device} {str(self.dtype).split('.')[-1]} | ETA on the step lines, from step "
            f"{first_line:,}"
        )

    def progress_line(self, record: dict, tok_per_s: float, seconds_per_step: float) -> str:
        """'step 10/600 | loss 8.0344 | lr 6.67e-04 | grad norm 0.911 | 2,147 tok/s | MFU 58.89% |
        ETA 9m22s'"""
        mfu = f"{100 * self.mfu(tok_per_s):.2f}%" if self._peak else "n/a"
        eta = format_duration((self.cfg.max_steps - self.step) * seconds_per_step)
        return (
            f"step {record['step'] + 1:>6}/{self.cfg.max_steps} | loss {record['loss']:.4f} | "
            f"lr {record['lr']:.2e} | grad norm {record['grad_norm']:.3f} | {tok_per_s:,.0f} tok/s "
            "| "
            f"MFU {mfu} | ETA {eta}"
        )

    def run(self) -> dict:
        """Train to max_steps (or until Ctrl-C), evaluating, checkpointing and logging; then sample
        and plot."""
        cfg = self.cfg
        # the first screen: what runs, how much, where; every setting goes to a file, not the screen
        self.log(self.summary_line())
        if self.dist.is_main:
            settings = fileio.write_atomic(
                self.out_dir / CONFIG_FILE, json.dumps(dataclasses.asdict(cfg), indent=1) + "\n",
                error=TrainError, fix="pick another --out-dir")
            self.log(f"config: every setting in {settings} (python train.py --config {settings} "
                     "runs them again)")
        shape = self.model_config
        experts = f", {shape.n_expert} experts (top {shape.expert_top_k})" if shape.n_expert else ""
        self.log(f"model: {cfg.model}, {shape.n_layer} layers x {shape.n_embd} wide, "
                 f"{shape.n_head} heads ({shape.n_kv_head} kv), vocab {shape.vocab_size:,}, "
                 f"context {shape.block_size}{experts} (every field: a checkpoint's model_config)")
        # parallel.py's accounting
        layout = self.model.describe(cfg.micro_batches or self.accum)
        if layout:
            self.log(layout)
        self.log(
            f"{self.tokens_per_step:,} tokens/step = {cfg.batch_size} seq x {self.block_size} "
            f"tokens x {self.accum} accumulation x {self.dist.world_size} ranks"
        )
        if not self._peak:
            self.log(
                f"MFU n/a: pass --peak-flops (no dense {str(self.dtype).split('.')[-1]} peak for "
                f"{torch.cuda.get_device_name(self.device)!r} in train.GPU_PEAK_FLOPS)"
            )
        start_time = time.time()
        with stop_on_signals(self):
            if self.step == 0 and cfg.eval_at_start:
                self.evaluate()
            train_loop(self)
        summary = {
            "step": self.step,
            "interrupted": self.stopping,
            "seconds": time.time() - start_time,
            **{k: v for k, v in self.last_eval.items() if k != "step"},
            "checkpoint": str(checkpoint_path(self.out_dir, self.step)),
            "metrics": str(self.out_dir / "metrics.jsonl"),
        }
        if self.stopping:
            self.metrics.write(
                {"step": self.step, "event": "interrupted", "checkpoint": summary["checkpoint"]}
            )
            self.log(
                f"interrupted: checkpoint saved at step {self.step}; continue with the same "
                "command plus --resume"
            )
        else:
            # collective when split: every rank gathers the weights
            sample_model = self.model.full_model()
            if self.dist.is_main:
                summary["samples"] = self.sample(sample_model)
                for i, text in enumerate(summary["samples"]):
                    self.log(f"--- sample {i + 1} ---\n{text}")
                if cfg.plot:
                    summary["plot"] = str(
                        plot_loss_curve(self.out_dir / "metrics.jsonl", self.out_dir / "loss.png")
                    )
                self.log(
                    f"done in {format_duration(summary['seconds'])}: val loss "
                    f"{self.last_eval['val_loss']:.4f}, "
                    f"val bpb {self.last_eval['val_bpb']:.4f}\n  checkpoint "
                    f"{summary['checkpoint']}\n"
                    f"  metrics    {summary['metrics']}"
                    + (f"\n  loss curve {summary['plot']}" if cfg.plot else "")
                )
        if self.dist.mesh is not None:
            # rank 0 sampled and plotted; the others leave with it
            self.dist.mesh.wait_for_rank0()
        self.metrics.close()
        return summary


# --------------------------------------------------------------------------------------------------
# The training loop: every numbered section above, once per optimizer step
# --------------------------------------------------------------------------------------------------

def train_loop(run: Trainer, steps: int | None = None, batches=None) -> dict:
    """Optimizer steps until --max-steps (or `steps` more), or until a signal stops every process
    (see `stop` below); returns the last step's record (its metrics.jsonl line). `batches` (tests):
    one list of (x, y) micro-batches per step, instead of the loader's.

    `run.model` is a parallel.Layout whatever the layout (one process, DP, ZeRO, TP/PP, EP, CP), so
    the loop calls the same methods everywhere: no_sync, finish_gradient_sync, clip_grad_norm_, and
    under --pp pipeline_step (the schedule runs every micro-batch's forward and backward itself).
    """
    cfg, model, optimizer, scaler = run.cfg, run.model, run.optimizer, run.scaler
    if batches is not None:                                # one step per list of micro-batches
        steps, batches = len(batches), iter(batches)
    done, record = 0, {}
    while run.step < cfg.max_steps and not run.stopping and done != steps:   # never on a local flag
        t0, done = time.perf_counter(), done + 1
        micro_batches = next(batches) if batches else run.next_micro_batches()  # §1: (B, T) each
        lr = lr_at(run.step, cfg) * run.lr_scale                                  # §2
        for group in optimizer.param_groups:
            group["lr"] = lr
        n = len(micro_batches)
        loss_sum = torch.zeros((), device=run.device)
        if model.pipelined:                                 # --pp: all micro-batches in one pass
            with autocast(run.device, run.dtype):           # §5: bf16 compute as without --pp
                loss_sum += model.pipeline_step(micro_batches, cfg.micro_batches) * n
            micro_batches = []
        for i, (x, y) in enumerate(micro_batches):
            # §1: gradients add up over the micro-batches; only the last backward communicates
            with contextlib.nullcontext() if i == n - 1 else model.no_sync():
                with autocast(run.device, run.dtype):
                    _, loss = model(x, y)                   # mean cross-entropy over (B, T)
                objective = loss
                if run.model_config.n_expert:               # MoE: + the load-balancing loss
                    objective = loss + run.model_config.moe_aux_coef * run.raw_model.aux_loss
                objective = objective / n                   # the mean over all n micro-batches
                (scaler.scale(objective) if scaler else objective).backward()
            loss_sum += loss.detach().float()
        model.finish_gradient_sync()
        if scaler:
            scaler.unscale_(optimizer)
        grad_norm = model.clip_grad_norm_(cfg.grad_clip)    # §4: the full model's norm, 0-dim
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
        reduced = all_reduce_mean(torch.stack([loss_sum / n, stop]), run.dist, over_world=True)
        loss_value, stop_any, grad_norm = torch.cat([reduced, grad_norm.view(1)]).tolist()
        run.stopping = stop_any > 0                         # every rank stops after this step
        bad_grad = not math.isfinite(grad_norm) and scaler is None   # fp16: the scaler's job
        verdict = run.guard.check(float("nan") if bad_grad else loss_value)             # §7
        if verdict == "ok" and scaler:
            scaler.step(optimizer)
            scaler.update()
        elif verdict == "ok":
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        run.tokens += run.tokens_per_step
        record = {"step": run.step, "loss": loss_value, "lr": lr, "grad_norm": grad_norm,
                  "tokens": run.tokens}
        run.step += 1
        if verdict != "ok":
            run.skip_batch(record)
        if verdict == "rollback":
            run.rollback()                                  # §7: the last good state, lower lr
        # §8: watching the run
        dt = time.perf_counter() - t0
        if cfg.compile and not run.compiled:                # the compiling step is no rate
            run.compiled = True
        else:                                               # smoothed, for the ETA
            run.step_time = dt if run.step_time is None else 0.9 * run.step_time + 0.1 * dt
        record["tok_per_s"] = run.tokens_per_step / dt
        if run._peak:
            record["mfu"] = run.mfu(record["tok_per_s"])
        run.metrics.write(record)
        if run.step % cfg.log_interval == 0 or run.step == cfg.max_steps:
            seconds = run.step_time or dt
            run.log(run.progress_line(record, run.tokens_per_step / seconds, seconds)
                    + (" | compiling" if run.step_time is None else ""))
        if run.step % cfg.eval_interval == 0 or run.step == cfg.max_steps:
            run.evaluate()
        if run.dist.devices == 1:                           # alone, a late signal counts too
            run.stopping = run.stopping or run.stop_requested
        if run.step % cfg.ckpt_interval == 0 or run.step == cfg.max_steps or run.stopping:
            run.log(f"saved {run.save_checkpoint()}")         # §6
    return record


@contextlib.contextmanager
def stop_on_signals(run: Trainer):
    """Inside this block, Ctrl-C (SIGINT) or a scheduler's SIGTERM: finish the step, save a
    checkpoint, exit. A second one stops at once. The previous handlers come back on leaving it."""
    def on_signal(signum, frame):
        if run.stop_requested:
            raise KeyboardInterrupt
        run.stop_requested = True
        run.log(f"\n{signal.Signals(signum).name}: finishing this step and saving a checkpoint "
                f"(Ctrl-C again to abort)")
    signals = (signal.SIGINT, signal.SIGTERM) if threading_main() else ()
    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# --------------------------------------------------------------------------------------------------
# Appendix: the checkpoint checksum (section 6's atomic_save and load_checkpoint use it)
# --------------------------------------------------------------------------------------------------

CHECKSUM_TAG = b"sha256:"
CHECKSUM_LEN = len(CHECKSUM_TAG) + 64           # the zip comment: tag + hex digest


class HashingWriter:
    """A write-only file that feeds every byte torch.save streams into it to a sha256 as well, and
    keeps the last 22 bytes (the zip's end record, which append_checksum completes)."""

    def __init__(self, file):
        self.file, self.digest, self.tail = file, hashlib.sha256(), b""

    def write(self, data) -> int:
        self.digest.update(data)
        self.tail = (self.tail + bytes(memoryview(data).cast("B")[-22:]))[-22:]
        return self.file.write(data)

    def flush(self) -> None:
        self.file.flush()


def append_checksum(hashing: HashingWriter) -> None:
    """Store the sha256 of a torch.save zip inside it, as the zip's comment (the file's last bytes).

    torch.load checks no CRC, so 4 KiB of zeros inside the weights load silently as wrong numbers;
    the digest catches that. A zip ends with a 22-byte record whose last 2 bytes give the comment's
    length (0 after torch.save); we set it to 71 and append b"sha256:" + the 64 hex digits of the
    zip as torch.save wrote it. The file stays a valid zip, so torch.load (and any zip tool) still
    reads it as it is.
    """
    if hashing.tail[:4] != b"PK\x05\x06" or hashing.tail[-2:] != b"\x00\x00":
        raise ValueError("not a zip written by torch.save (no end record without a comment)")
    hashing.file.seek(-2, os.SEEK_END)
    hashing.file.write(
        CHECKSUM_LEN.to_bytes(2, "little") + CHECKSUM_TAG + hashing.digest.hexdigest().encode()
    )


def verify_checksum(path) -> None:
    """Raise ValueError when the sha256 stored by append_checksum does not match the file's bytes. A
    file without one (written by hand or an older train.py) passes: torch.load's own checks are all
    it gets."""
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if size < CHECKSUM_LEN + 22:
            return
        f.seek(size - CHECKSUM_LEN)
        stored = f.read()
        if not stored.startswith(CHECKSUM_TAG):
            return
        # the zip up to its comment length
        digest, remaining = hashlib.sha256(), size - CHECKSUM_LEN - 2
        f.seek(0)
        while remaining > 0:
            chunk = f.read(min(remaining, 1 << 24))
            digest.update(chunk)
            remaining -= len(chunk)
        # ... which torch.save wrote as 0
        digest.update(b"\x00\x00")
    if digest.hexdigest().encode() != stored[len(CHECKSUM_TAG):]:
        raise ValueError("sha256 mismatch: the file's bytes changed after it was written")


# --------------------------------------------------------------------------------------------------
# The command line: flags from TrainConfig, a --config file, validation of every setting
# --------------------------------------------------------------------------------------------------

HELP = {    # the --help text of each TrainConfig field
    "data": ("corpus: source names or paths to prepare (comma-separated), or a prepared dataset "
             "directory (holds manifest.json)"),
    "val_data": ("held-out file(s), comma-separated, used verbatim as the validation split "
                 "(data.py prepare --val-data)"),
    "cleaning": ("data.py's cleaning: auto (the funnel for web-like sources, local text files kept "
                 "whole), web (the funnel for all), keep (none); other data settings: run data.py "
                 "prepare, pass its --out as --data"),
    "vocab_size": "BPE size if data.py trains one (0 = default)",
    "model": "model preset from model.PRESETS",
    "model_args": "preset overrides, e.g. 'n_layer=2,n_embd=32'",
    "out_dir": "checkpoints, metrics.jsonl, loss-curve PNG",
    "seed": "seeds model init, data order and sampling",
    "batch_size": "micro-batch: sequences per forward per rank",
    "block_size": "sequence length in tokens (0 = the model's)",
    "total_batch_tokens": ("tokens per optimizer step over all ranks; sets gradient accumulation "
                           "(0 = one micro-batch per rank)"),
    "max_steps": "optimizer steps (the schedule's total)",
    "lr": "peak learning rate",
    "min_lr_ratio": "final lr as a fraction of the peak",
    "warmup_steps": "linear warmup steps",
    "schedule": "cosine | wsd",
    "decay_fraction": "wsd: fraction of steps spent decaying",
    "weight_decay": "AdamW decay (weight matrices only)",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "clip the global grad norm to this (0 = off)",
    "device": "auto | cpu | cuda | mps",
    "dtype": "auto (bf16 on capable CUDA, else fp32) | fp32 | bf16 | fp16",
    "compile": "torch.compile the model",
    "activation_checkpointing": ("recompute block activations in backward (less memory, ~1/3 more "
                                 "compute)"),
    "peak_flops": ("hardware peak FLOP/s for MFU (0 = known GPU table, or a measured fp32 matmul "
                   "on CPU)"),
    "eval_interval": "steps between validation evaluations",
    "eval_batches": "micro-batches per validation estimate",
    "eval_at_start": "evaluate at step 0 too (the loss at initialisation, about ln(vocab))",
    "ckpt_interval": "steps between checkpoints",
    "keep_checkpoints": "how many recent checkpoints to keep",
    "resume": ("continue from the newest good checkpoint in --out-dir (bare --resume) or from a "
               "given file"),
    "init_from": ("start a new run from this checkpoint's weights, shape and tokenizer (e.g. one "
                  "`python model.py import-hf` wrote); --data must use the same tokenizer"),
    "overwrite": "start fresh, deleting a run in --out-dir",
    "log_interval": "steps between progress lines",
    "plot": "draw loss.png at the end (imports matplotlib)",
    "spike_factor": "a spike: a loss over this x the median",
    "spike_window": "recent losses the median is taken over",
    "spike_patience": "spikes in a row before rolling back",
    "rollback_lr_factor": "lr multiplier after a rollback",
    "num_samples": "samples printed at the end",
    "sample_tokens": "tokens per sample",
    "temperature": "sampling temperature",
    "top_k": "sample among the k likeliest tokens (0 = all)",
    "prompt": "sample prompt (empty = start of a document)",
    "zero": "ZeRO stage",
    "zero_reduce_dtype": ("--zero 3 with --dtype bf16 gathers weights in bf16 and keeps fp32 "
                          "master shards; gradients are reduce-scattered in this dtype"),
    "tp": "tensor-parallel degree",
    "pp": "pipeline-parallel degree",
    "ep": "expert-parallel degree (MoE experts over ep of the data-parallel ranks)",
    "cp": "context-parallel degree (each sequence over cp ranks, ring attention)",
    "pp_schedule": "pipeline schedule",
    "micro_batches": "pipeline micro-batches per step (0 = the accumulation steps)",
}
CHOICES = {"cleaning": ("auto", "web", "keep"), "schedule": ("cosine", "wsd"),
           "dtype": ("auto", "fp32", "bf16", "fp16"), "zero": (0, 1, 2, 3),
           "zero_reduce_dtype": ("fp32", "bf16"), "pp_schedule": ("afab", "1f1b")}


def flag(name: str) -> str:
    """`max_steps` -> `--max-steps`."""
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field, plus --config FILE (JSON with the same keys; explicit flags
    win)."""
    from machinery.cli import Parser

    parser = Parser(
        prog="train.py",
        description="Pretrain a GPT: data.py -> model.py -> checkpoints, metrics.jsonl, samples.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--config", default=None, help="JSON file of settings (keys as below, '-' or '_')"
    )
    for field in dataclasses.fields(TrainConfig):
        kwargs = {"default": field.default, "help": HELP[field.name]}
        if field.type == "bool":
            kwargs["action"] = argparse.BooleanOptionalAction
        elif field.name == "resume":
            kwargs.update(nargs="?", const="latest", metavar="PATH")
        else:
            kwargs["type"] = {"int": int, "float": float, "str": str}[field.type]
        if field.name in CHOICES:
            kwargs["choices"] = CHOICES[field.name]
        parser.add_argument(flag(field.name), **kwargs)
    return parser


def read_config_file(path: str) -> dict:
    """Read a JSON settings file into {field: value}; keys may use '-' or '_'. Unknown keys are an
    error."""
    # fileio: a missing file, bad syntax or UTF-8, JSON nested thousands deep: one line each
    try:
        raw = fileio.read_json(path, TrainError, "pass a JSON object of train.py settings")
    except TrainError as e:
        raise TrainError(f"--config {e}") from None
    if not isinstance(raw, dict):
        raise TrainError(f"--config {path} must hold a JSON object like {{\"max_steps\": 100}}")
    names = {f.name for f in dataclasses.fields(TrainConfig)}
    settings = {k.replace("-", "_"): v for k, v in raw.items()}
    unknown = sorted(set(settings) - names)
    if unknown:
        raise TrainError(
            f"--config {path} has unknown settings {unknown}; see python train.py --help"
        )
    return settings


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Defaults < config file < explicit flags.

    >>> parse_config(["--max-steps", "7"]).max_steps
    7
    """
    parser = build_parser()
    known, _ = parser.parse_known_args(argv)
    if known.config:
        parser.set_defaults(**read_config_file(known.config))
    args = vars(parser.parse_args(argv))
    args.pop("config")
    return TrainConfig(**args)


SEED_MAX = 2**32 - 1        # numpy's generators take seeds in [0, 2^32)
# --num-samples x --sample-tokens: ~75,000 words, more than anyone reads at the end
SAMPLE_TOKENS_MAX = 100_000


def validate_config(cfg: TrainConfig) -> None:
    """Reject settings that cannot work before anything is built: one TrainError naming the flag and
    its range.

    Every number must be finite and of its field's type (a --config file can hold anything).
    >>> validate_config(TrainConfig(eval_interval=0))
    Traceback (most recent call last):
    train.TrainError: --eval-interval must be >= 1, got 0
    """
    kinds = {
        "int": ((int,), "an integer"),
        "float": ((int, float), "a number"),
        "bool": ((bool,), "true or false"),
        "str": ((str,), "a string"),
        "str | None": ((str, type(None)), "a string"),
    }
    for field in dataclasses.fields(cfg):
        value, (types, noun) = getattr(cfg, field.name), kinds[field.type]
        if not isinstance(value, types) or (isinstance(value, bool) and field.type != "bool"):
            raise TrainError(f"{flag(field.name)} must be {noun}, got {value!r}")
        if field.type == "float" and not math.isfinite(value):
            raise TrainError(f"{flag(field.name)} must be a finite number, got {value}")
        choices = CHOICES.get(field.name)
        if choices and value not in choices:
            raise TrainError(
                f"{flag(field.name)} must be one of {', '.join(map(str, choices))}, got {value!r}"
            )
    at_least = {
        "max_steps": 1,
        "eval_interval": 1,
        "eval_batches": 1,
        "ckpt_interval": 1,
        "keep_checkpoints": 1,
        "log_interval": 1,
        "spike_window": 1,
        "spike_patience": 1,
        "tp": 1,
        "pp": 1,
        "batch_size": 1,
        "ep": 1,
        "cp": 1,
        "warmup_steps": 0,
        "block_size": 0,
        "vocab_size": 0,
        "total_batch_tokens": 0,
        "micro_batches": 0,
        "num_samples": 0,
        "sample_tokens": 0,
        "top_k": 0,
        "weight_decay": 0,
        "grad_clip": 0,
        "temperature": 0,
        "peak_flops": 0,
        "seed": 0,
    }
    # sizes that could never finish: more samples or sample tokens than anyone reads, a step of more
    # than 2^30 tokens (the largest published batches are ~1.6e7), more than 1e8 steps (the longest
    # published runs take ~1e6)
    at_most = {
        "seed": SEED_MAX,
        "num_samples": 1000,
        "sample_tokens": 100_000,
        "total_batch_tokens": 2**30,
        "max_steps": 10**8,
        "eval_batches": 10**6,
    }
    for name, low in at_least.items():
        value = getattr(cfg, name)
        if not value >= low:
            raise TrainError(f"{flag(name)} must be >= {low}, got {value}")
    for name, high in at_most.items():
        if getattr(cfg, name) > high:
            raise TrainError(f"{flag(name)} must be <= {high}, got {getattr(cfg, name)}")
    # AdamW's step is ~lr per weight: above 1 it only diverges
    if not 0 < cfg.lr <= 1:
        raise TrainError(f"--lr must lie in (0, 1], got {cfg.lr}")
    # at <= 1 half the steps (or all) would count as spikes
    if not cfg.spike_factor > 1:
        raise TrainError(
            f"--spike-factor must be > 1 (a spike is this many times the median loss), "
            f"got {cfg.spike_factor}"
        )
    for name in ("min_lr_ratio", "decay_fraction", "rollback_lr_factor", "beta1", "beta2"):
        # a beta of 1 never forgets: no average
        value, is_beta = getattr(cfg, name), name.startswith("beta")
        if not (0.0 <= value <= 1.0) or (is_beta and value == 1.0):
            raise TrainError(
                f"{flag(name)} must lie in [0, 1{')' if is_beta else ']'}, got {value}"
            )
    if cfg.rollback_lr_factor == 0:
        raise TrainError(
            "--rollback-lr-factor must be > 0 (0 would stop learning after a rollback); e.g. 0.5"
        )
    # generated one token at a time, at the end
    if cfg.num_samples * cfg.sample_tokens > SAMPLE_TOKENS_MAX:
        raise TrainError(
            f"--num-samples {cfg.num_samples} x --sample-tokens {cfg.sample_tokens} = "
            f"{cfg.num_samples * cfg.sample_tokens:,} tokens to generate after training, more than "
            f"{SAMPLE_TOKENS_MAX:,} (a novel's worth, hours on a CPU): lower one of them"
        )
    if cfg.zero_reduce_dtype != "fp32" and (cfg.zero != 3 or cfg.dtype in ("fp32", "fp16")):
        raise TrainError(
            f"--zero-reduce-dtype {cfg.zero_reduce_dtype} applies only with --zero 3 and bf16 "
            "compute "
            f"(--dtype bf16, or auto on a bf16 GPU): add --zero 3, or drop the flag"
        )
    if cfg.ep > 1 and cfg.cp > 1:      # before any process group: one line, exit 2
        raise TrainError(f"--ep {cfg.ep} with --cp {cfg.cp}: expert parallel needs a MoE, ring "
                         "attention a dense model; use one of --ep and --cp")
    # meta, a missing GPU or a typo fails here, before any work
    resolve_device(cfg.device)
    if cfg.resume and cfg.overwrite:
        raise TrainError(
            "--resume and --overwrite contradict each other: --resume continues the run in "
            "--out-dir, "
            "--overwrite deletes it; give one"
        )


def clamp_warmup(cfg: TrainConfig, log=print) -> TrainConfig:
    """A warmup as long as the run never reaches the peak lr: shorten it to 10% of the run, and say
    so.

    >>> clamp_warmup(TrainConfig(max_steps=20, warmup_steps=30), log=print).warmup_steps
    --warmup-steps 30 >= --max-steps 20: warming up for 2 steps (10% of the run) instead
    2
    """
    if cfg.warmup_steps < cfg.max_steps:
        return cfg
    warmup = cfg.max_steps // 10
    log(
        f"--warmup-steps {cfg.warmup_steps} >= --max-steps {cfg.max_steps}: warming up for "
        f"{warmup} steps "
        f"(10% of the run) instead"
    )
    return dataclasses.replace(cfg, warmup_steps=warmup)


def threading_main() -> bool:
    """Signal handlers can only be installed from the main thread."""
    import threading
    return threading.current_thread() is threading.main_thread()


def train(cfg: TrainConfig, log=print, start_note: str = "") -> dict:
    """Build a Trainer from `cfg` and run it, holding --out-dir; returns the summary (final val
    loss/bpb, paths, samples). `start_note` goes to stderr once the run is set up, so a refused
    run's error stays one line."""
    with hold_out_dir(cfg, log):
        trainer = Trainer(cfg, log)
        if start_note:
            print(start_note, file=sys.stderr)
        return trainer.run()


@contextlib.contextmanager
def hold_out_dir(cfg: TrainConfig, log=print):
    """One run at a time in --out-dir: the run's first process (rank 0) holds OUT_DIR/.train.lock
    for the whole run (fileio.hold), so a second run refuses, naming the first's pid, instead of
    mixing its checkpoints and metrics with the first's. A killed run leaves only its pid in the
    file; the next run takes the lock over, and says so."""
    first = os.environ.get("RANK", "0") == "0" and not (torch.distributed.is_available() and
                                                       torch.distributed.is_initialized() and
                                                       torch.distributed.get_rank())
    check_writable_dir(cfg.out_dir)

    def refuse(pid):
        raise TrainError(f"--out-dir {cfg.out_dir} is in use by another run (pid {pid}): wait for "
                         f"it to end, stop it (kill {pid}), or pick another --out-dir")
    # The other ranks of the run share rank 0's folder, and its lock.
    with (fileio.hold(pathlib.Path(cfg.out_dir) / ".train.lock", refuse, TrainError,
                      "remove it, or pick another --out-dir") if first
          else contextlib.nullcontext((None, None))) as (_, stale):
        if stale:
            log(f"--out-dir {cfg.out_dir}: taking over the lock of process {stale}, which ended "
                f"without releasing it (killed?)")
        yield


def busy_machine_note(load: float, cores: int, threads: int, threads_chosen: bool) -> str:
    """The line that tells a CPU run on a busy machine to train with one thread ("" when there is
    nothing to say). torch starts one thread per core, and each matmul waits for its slowest
    thread: when other jobs already keep every core busy (the 1-minute load average at or above
    the cores), every thread waits its turn for a core at every step, and one thread is several
    times faster (20 steps on 2 shared cores, one run after the other at load 2-9: 173-222 tokens/s
    with 2 threads, 1,509-2,031 with 1).
    It advises instead of switching: the thread count changes the order of float sums (a grad
    norm's last bit), so the same command's numbers would depend on the machine's load. Said only
    when the user chose no thread count (OMP_NUM_THREADS, which torchrun sets too).
    >>> busy_machine_note(0.5, 2, 2, threads_chosen=False)
    ''
    >>> busy_machine_note(4.1, 2, 2, threads_chosen=False)[:47]
    'note: the machine is busy (load 4.1 on 2 cores)'
    """
    if threads_chosen or threads <= 1 or load < cores:
        return ""
    return (f"note: the machine is busy (load {load:.1f} on {cores} cores): set OMP_NUM_THREADS=1, "
            f"faster here than torch's {threads} threads (each waits for a core at every step)")


def busy_note(cfg: TrainConfig) -> str:
    """busy_machine_note for this machine, for a run on the CPU ("" on a GPU)."""
    if resolve_device(cfg.device).type != "cpu":
        return ""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):                   # no load average here (Windows)
        return ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return busy_machine_note(load, cores or 1, torch.get_num_threads(),
                             threads_chosen="OMP_NUM_THREADS" in os.environ)


def main(argv: list[str] | None = None) -> None:
    """CLI: train with the flags; bad input exits with code 2 and one line, Ctrl-C with code 130."""
    try:
        cfg = parse_config(argv)
        summary = train(cfg, start_note=busy_note(cfg))
    except (TrainError, data_lib.DataError, model_lib.ConfigError) as e:
        print(f"train.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print(
            "train.py: aborted by a second Ctrl-C (no checkpoint written for the current step)",
            file=sys.stderr,
        )
        sys.exit(130)
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if summary["interrupted"]:
        sys.exit(130)


if __name__ == "__main__":
    main()
