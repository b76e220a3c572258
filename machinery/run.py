"""The run's wiring around train.py's lesson: everything `python train.py` does besides the loop.

`Trainer` builds a run from a TrainConfig: it checks the settings (`check_config`), joins the
process group and wraps the model for distribution (parallel.py, model_parallel.py), finds the
checkpoint to resume from, refuses to mix two runs in one out-dir (and holds its lock: `train`),
opens the dataset (data.py, or machinery/data_at_scale.py to prepare raw text), builds the model
and optimizer with train.py's functions, and keeps what train_lib.train_loop reads and calls: the
batches, the metrics.jsonl log, the progress line with its MFU (the GPU peak table), evaluation,
sampling, checkpoints (train.atomic_save), rollbacks and a clean stop on SIGINT/SIGTERM.

Errors are train.TrainError in the library's terms: a setting is named as its TrainConfig field
in backquotes (`out_dir`), which machinery/commands/train.py shows as the flag (--out-dir).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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

import numpy as np
import torch

import data as data_lib
import model as model_lib
import scaling
import train as train_lib
from machinery import checkpoints, devices, fileio
from machinery import launch as launcher
from machinery import parallelize as wiring
from machinery.presets import PRESETS
from train import TrainConfig, TrainError

# --------------------------------------------------------------------------------------------------
# The out-dir: checkpoint files, temp files of killed writes, a writable folder
# --------------------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    """auto: CUDA if present (this rank's GPU under torchrun), else Apple MPS, else CPU; model.py's
    one check of the device (meta, a missing GPU or an unknown name is one TrainError line)."""
    return devices.resolve_device(name, TrainError)


# every setting of the run, as a --config file (the screen shows a summary)
CONFIG_FILE = "train_config.json"
# in flight: train.atomic_save's (.ckpt_0000250.pt.tmp), fileio.write_atomic's (.loss.png.XXXX.tmp)
TEMP_PATTERN = re.compile(r"^\.(ckpt_\d{7}\.pt|loss\.png|train_config\.json)(\.\w+)?\.tmp$")


def save_checkpoint_file(state: dict, path) -> pathlib.Path:
    """train.atomic_save, where a full disk (or a quota, a file-size limit) is one TrainError."""
    try:
        return checkpoints.save(state, path)
    except Exception as e:
        if fileio.is_no_space(e):
            raise TrainError(fileio.no_space_message(path, "choose another `out_dir`")) from None
        raise


def remove_stale_temp_files(out_dir, log=print) -> None:
    """Delete the temp files (.ckpt_*.pt.tmp, .loss.png.XXXX.tmp) of writes that a kill
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
        raise TrainError(f"`out_dir`: {problem}; choose another `out_dir`")
    path = pathlib.Path(path)
    try:
        # one stat: between an exists() and an is_dir() another rank may remove its empty folder
        is_folder = stat.S_ISDIR(path.stat().st_mode)
    except (FileNotFoundError, NotADirectoryError):
        is_folder = True  # not there (yet): the check below names what is in the way
    if not is_folder:
        raise TrainError(f"`out_dir` {path} is a file; choose a directory")
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        if not existing.exists():  # another rank removed its empty folder meanwhile: look again
            return check_writable_dir(path)
        what = "read-only" if existing.is_dir() else "not a directory"
        raise TrainError(
            f"`out_dir` {path} is not writable ({existing} is {what}); choose another `out_dir`"
        )


# --------------------------------------------------------------------------------------------------
# Watching the run: the GPU peak table for MFU, metrics.jsonl, the loss curve
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
    a @ b  # warm up
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        a @ b
        if device.type == "mps":
            torch.mps.synchronize()
        best = min(best, time.perf_counter() - start)
    return 2 * 1024**3 / best


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

    train_loss, val = {}, {}
    # a resumed run rewrites steps: keep the last value
    for r in read_metrics(metrics_path):
        if r.get("loss") is not None and "event" not in r:
            train_loss[r["step"]] = r["loss"]
        if r.get("val_loss") is not None:
            val[r["step"]] = r["val_loss"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(list(train_loss), list(train_loss.values()), lw=0.8, alpha=0.6, label="train loss")
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
            fix="choose another `out_dir`",
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
            f"{world_size} data-parallel ranks that each need one; use a smaller `block_size` or "
            f"more validation text (`val_data`)"
        )
    batch = min(batch_size, num_windows // world_size)
    return batch, max(1, min(eval_batches, num_windows // (batch * world_size)))


def format_duration(seconds: float) -> str:
    """125 -> '2m05s'."""
    seconds = int(max(0, seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


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

    A process group that is already up (a caller such as launcher.launch started it) is used as it
    is.
    """
    import parallel

    joined = torch.distributed.is_available() and torch.distributed.is_initialized()
    try:  # torchrun's variables are checked before a group starts
        world = torch.distributed.get_world_size() if joined else launcher.check_launch_env()[1]
        # `torchrun --nproc_per_node=1 train.py --zero 2` is a real layout (ZeRO's code path on one
        # GPU, the way a one-GPU bench checks it): a process that torchrun started joins a group
        # of one. A plain `python train.py --zero 2` has no process group to join.
        launched = joined or "RANK" in os.environ
        if world <= 1 and not (launched and uses_model_parallel(cfg)):
            if uses_model_parallel(cfg):
                given = model_parallel_settings(cfg)  # the ones given: "`ep` 2"
                verb = "needs" if len(given) == 1 else "need"
                one_device = " (N=1 runs ZeRO's code path on one device)" if cfg.zero else ""
                raise TrainError(
                    f"{' '.join(given)} {verb} a process group: launch with torchrun, N "
                    f"processes per node{one_device}"
                )
            return Dist()
        _, _, device = launcher.init_distributed()
        wiring.check_combination(cfg.zero, cfg.tp, cfg.pp)
        mesh = parallel.Mesh.build(dp=-1, tp=cfg.tp, pp=cfg.pp, cp=cfg.cp)
    except parallel.ParallelError as e:
        raise TrainError(str(e)) from e
    return Dist(
        rank=mesh.dp.rank, world_size=mesh.dp.size, mesh=mesh, device=device, global_rank=mesh.rank
    )


def uses_model_parallel(cfg: TrainConfig) -> bool:
    """ZeRO, tensor or pipeline parallel: the model and optimizer go through
    wiring.parallelize."""
    return bool(cfg.zero) or max(cfg.tp, cfg.pp, cfg.ep, cfg.cp) > 1


def model_parallel_settings(cfg: TrainConfig) -> list[str]:
    """The settings that make `uses_model_parallel` true, as given: ["`zero` 2", "`cp` 2"]."""
    given = [("zero", cfg.zero)] if cfg.zero else []
    given += [
        (name, getattr(cfg, name)) for name in ("tp", "pp", "ep", "cp") if getattr(cfg, name) > 1
    ]
    return [f"`{name}` {size}" for name, size in given]


def wrap_for_distribution(
    model: torch.nn.Module,
    optimizer,
    cfg: TrainConfig,
    dist: Dist,
    dtype: torch.dtype = torch.float32,
):
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
        return parallel.Layout(model), optimizer  # one whole model: the interface's defaults

    if uses_model_parallel(cfg):
        if cfg.dtype == "fp16":
            raise TrainError(
                "`dtype` fp16 with `zero`/`tp`/`pp`: ranks holding different gradients would "
                "disagree on the loss scaler's overflow check; use `dtype` bf16 or fp32"
            )
        # ZeRO / TP / PP: model_parallel.py splits the full model and optimizer over the mesh; the
        # returned pair keeps this loop's calls and saves checkpoints in the single-process format
        # (any layout can resume them).
        if (cfg.block_size or model.config.block_size) % (2 * cfg.cp):
            raise TrainError(
                f"`block_size` is not a multiple of 2 x `cp` {cfg.cp} (each rank "
                f"holds two chunks of every sequence); use a multiple of {2 * cfg.cp}"
            )
        mixed = {}
        if cfg.zero == 3 and dtype == torch.bfloat16:
            mixed = dict(compute_dtype=dtype, reduce_dtype=devices.DTYPES[cfg.zero_reduce_dtype])
        try:
            return wiring.parallelize(
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


def compile_model(
    model: torch.nn.Module, raw_model: torch.nn.Module, per_block: bool
) -> torch.nn.Module:
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
        if not isinstance(block, torch.nn.Identity):  # a pipeline stage's pruned block
            block.forward = compiled(block.forward)  # its hooks stay outside, in __call__
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
                    f"`data` {cfg.data} is a prepared dataset: `val_data` and `cleaning` apply "
                    "when train.py prepares the data; pass them to data.py prepare instead"
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
        from machinery import (
            data_at_scale,
        )  # the engines' entry: small inputs run in_memory.build_in_memory

        # the dataset's notices (the cleaning note) are rank 0's to print: the other ranks find the
        # dataset in the cache, which prints them again, once per rank
        quiet = dist.mesh is not None and not dist.is_main
        with contextlib.redirect_stderr(io.StringIO()) if quiet else contextlib.nullcontext():
            data_dir = data_at_scale.prepare(sources, engine="auto", **kwargs)
        if dist.mesh is not None and dist.is_main:
            dist.mesh.wait_for_rank0()
        return data_lib.TokenData(data_dir)
    except (ValueError, OSError, KeyError) as e:
        raise TrainError(f"cannot use `data` {cfg.data!r}: {e}") from e


def parse_bool(text: str) -> bool:
    """'true', '1', 'yes' -> True; 'false', '0', 'no' -> False (any case); a typo is an error."""
    words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
    if text.lower() not in words:
        raise ValueError(f"{text!r} is not true or false")
    return words[text.lower()]


def parse_model_args(text: str) -> dict:
    """'n_layer=2,n_embd=32,dropout=0.1' -> {'n_layer': 2, 'n_embd': 32, 'dropout': 0.1}, typed by
    GPTConfig."""
    types = {f.name: str(f.type) for f in dataclasses.fields(model_lib.GPTConfig)}
    out = {}
    for item in filter(None, (s.strip() for s in text.split(","))):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in types:
            raise TrainError(
                f"`model_args`: {item!r} is not NAME=VALUE with NAME a GPTConfig field "
                f"({', '.join(types)})"
            )
        kind = next((k for k in ("bool", "int", "float") if k in types[key]), "str")
        try:
            out[key] = {
                "bool": parse_bool,
                "int": int,
                "float": float,
                "str": str,
            }[kind](value)
            if kind == "float" and not math.isfinite(out[key]):
                raise ValueError(f"{value} is not a finite number")
        except ValueError as e:
            raise TrainError(f"`model_args`: bad value in {item!r}: {e}") from e
    return out


def build_model_config(cfg: TrainConfig, vocab_size: int):
    """The preset, with --model-args, the tokenizer's vocab size and --activation-checkpointing
    applied."""
    if cfg.model not in PRESETS:
        raise TrainError(f"unknown `model` {cfg.model!r}; choose one of {', '.join(PRESETS)}")
    # the tokenizer decides
    overrides = {**parse_model_args(cfg.model_args), "vocab_size": vocab_size}
    if cfg.activation_checkpointing:
        overrides["activation_checkpointing"] = True
    try:
        return dataclasses.replace(PRESETS[cfg.model], **overrides)
    except (ValueError, AssertionError) as e:
        raise TrainError(
            f"`model` {cfg.model} `model_args` {cfg.model_args!r} is not a valid model: {e}"
        ) from e


def check_fits(config, device: torch.device) -> None:
    """Refuse a model whose training state cannot fit: 16 bytes per parameter (fp32 weights and
    gradients, AdamW's two moments), spread at best over every process of the run, against the
    device's memory. Building it would only crash or swap after minutes of setup. Activations come
    on top, so passing is no promise."""
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    n_params = scaling.count_params(config)
    need = 16 * n_params / processes
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
            f"`model`/`model_args`: {n_params:,} parameters need {need / 1e9:.1f} GB of "
            f"training state per process (16 bytes/param), more than the {have / 1e9:.1f} GB of "
            f"this {device.type}; choose a smaller model or more processes"
        )


class Trainer:
    """Holds the run's state (model, optimizer, loader, step, guard) and runs the loop. Build it,
    then .run()."""

    def __init__(self, cfg: TrainConfig, log=print):
        check_config(cfg)
        # fail before the data is prepared; the tokenizer's vocab comes later
        if not cfg.init_from:
            build_model_config(cfg, PRESETS.get(cfg.model, model_lib.GPTConfig()).vocab_size)
        self.dist = setup_distributed(cfg)
        self.log = log if self.dist.is_main else (lambda *a, **k: None)
        self.cfg = cfg = clamp_warmup(cfg, self.log)
        self.device = self.dist.device or resolve_device(cfg.device)
        self.dtype = devices.resolve_dtype(cfg.dtype, self.device)
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
                f"`init_from` {cfg.init_from} has another tokenizer than `data` {cfg.data!r}; "
                "prepare the data with its tokenizer (data.py prepare takes a tokenizer JSON; an "
                "exported or imported Hugging Face tokenizer.json works)"
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
        check_stability_layout(cfg, dataclasses.asdict(self.model_config))  # init_from's too
        self.block_size = cfg.block_size or self.model_config.block_size
        if self.block_size > self.model_config.block_size:
            raise TrainError(
                f"`block_size` {self.block_size} exceeds the model's block_size "
                f"{self.model_config.block_size}; use at most that"
            )
        self.accum = train_lib.plan_accumulation(
            cfg.total_batch_tokens, cfg.batch_size, self.block_size, self.dist.world_size
        )
        self.tokens_per_step = cfg.batch_size * self.block_size * self.accum * self.dist.world_size
        if cfg.pp > 1 and cfg.micro_batches and (cfg.batch_size * self.accum) % cfg.micro_batches:
            raise TrainError(
                f"`micro_batches` {cfg.micro_batches} does not divide the "
                f"{cfg.batch_size * self.accum} sequences per rank and step; choose a divisor of it"
            )

        check_fits(self.model_config, self.device)
        # fp32 master weights, always
        self.raw_model = model_lib.GPT(self.model_config).to(self.device)
        if init_ckpt and resume_ckpt is None:
            self.raw_model.load_state_dict(init_ckpt["model"])
        optimizer = train_lib.make_optimizer(self.raw_model, cfg, self.device.type)
        self.model, self.optimizer = wrap_for_distribution(
            self.raw_model, optimizer, cfg, self.dist, self.dtype
        )
        if cfg.compile:
            self.model = compile_model(self.model, self.raw_model, uses_model_parallel(cfg))
        self.scaler = (
            torch.amp.GradScaler(self.device.type) if self.dtype == torch.float16 else None
        )
        # ZeRO/TP/PP: each rank holds a part of the model, and parallel.py adds up the grad norm
        self.split = uses_model_parallel(cfg)
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
                f"`batch_size` {cfg.batch_size} x `block_size` {self.block_size}: {e}"
            ) from e
        self.guard = train_lib.SpikeGuard(cfg.spike_factor, cfg.spike_window, cfg.spike_patience)
        self.step, self.tokens, self.lr_scale = 0, 0, 1.0
        self.last_eval: dict = {}
        self.stop_requested = False  # a signal reached this process
        # every process agreed, in a step's all-reduce, to stop after it
        self.stopping = False
        self.step_time = None  # smoothed seconds per step
        self.last_step_seconds = None
        self.compiled = False  # the first (compiling) step is done
        try:
            val_windows = self.data.iterator("val", 1, self.block_size).num_windows
        except data_lib.DataError as e:
            raise TrainError(f"`block_size` {self.block_size}: {e}") from e
        self.eval_batch, self.eval_batch_count = eval_plan(
            val_windows, cfg.batch_size, self.dist.world_size, cfg.eval_batches
        )
        self.bytes_per_token = data_lib.bytes_per_token(self.data, "val")
        self._flops_per_token = scaling.count_flops_per_token(
            self.raw_model.config, self.block_size
        )
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
        existing = train_lib.list_checkpoints(self.out_dir)
        if self.cfg.resume:
            where = self.out_dir if self.cfg.resume == "latest" else self.cfg.resume
            ckpt = self._load_setting_checkpoint(
                "resume", where, "train first (without `resume`) or pass a checkpoint file"
            )
            # weights only: nothing of a run to continue
            if "optimizer" not in ckpt:
                raise TrainError(
                    f"`resume`: {ckpt['path']} has no optimizer state (written by model.py "
                    "import-hf): start a new run from its weights with `init_from` {ckpt['path']}"
                )
            return ckpt
        if existing and not self.cfg.overwrite:
            raise TrainError(
                f"{self.out_dir} already holds a run ({existing[0].name}); add `resume` to "
                "continue it, `overwrite` to start over, or pick another `out_dir`"
            )
        return None

    def _load_init_checkpoint(self) -> dict:
        """--init-from: the checkpoint whose weights start the run (its shape replaces
        --model/--model-args; a resumed run takes the same shape and then its own newer weights).
        Its tokenizer must be --data's."""
        ckpt = self._load_setting_checkpoint(
            "init_from",
            self.cfg.init_from,
            "pass a checkpoint (python model.py import-hf writes one from a Hugging Face model)",
        )
        try:
            train_lib.checkpoint_config(ckpt)
        except (model_lib.ConfigError, KeyError, TypeError, AttributeError) as e:
            raise TrainError(f"`init_from`: {str(e).splitlines()[0]}") from None
        self.log(f"initialising from {ckpt['path']} (--model and --model-args are not used)")
        return ckpt

    def _load_setting_checkpoint(self, setting: str, path, fix: str) -> dict:
        """load_checkpoint for a setting's value (resume, init_from), its errors named after it."""
        path = pathlib.Path(path)
        if not path.exists():
            raise TrainError(f"`{setting}`: {path} does not exist; {fix}")
        try:
            return checkpoints.load(path, self.log)
        except TrainError as e:
            raise TrainError(f"`{setting}`: {e}") from e

    def _make_out_dir(self, fresh: bool) -> None:
        """Create out-dir (every rank; the same directory) and sweep away temp files of writes
        killed mid-way. A `fresh` run (not resumed; --overwrite, where a run was there) deletes the
        previous run's checkpoints and metrics: only now, once the new run is fully built, so a typo
        in another flag never costs the old run."""
        try:
            self.out_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise TrainError(
                f"`out_dir` {self.out_dir} is not writable ({e.strerror}); choose another `out_dir`"
            )
        if self.dist.is_main:
            remove_stale_temp_files(self.out_dir, self.log)
        if self.dist.is_main and fresh:
            for old in train_lib.list_checkpoints(self.out_dir):
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
        ranks = gather_objects(
            {"rng": checkpoints.rng_state(), "loader": self.loader.state_dict()}, self.dist
        )
        return {
            "version": 1,
            "step": self.step,
            "model": self.model.full_state_dict(),  # collective when the model is split
            "model_config": dataclasses.asdict(self.model_config),
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
        path = train_lib.checkpoint_path(self.out_dir, self.step)
        if self.dist.is_main:
            save_checkpoint_file(state, path)
            train_lib.prune_checkpoints(self.out_dir, self.cfg.keep_checkpoints)
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
                f"checkpoint {ckpt['path']} was trained with another tokenizer than `data` "
                f"{self.cfg.data!r}; resume with the run's data ({ckpt['data_dir']})"
            )
        # a field newer than the checkpoint has its default there: what the checkpoint's model ran
        saved = {**dataclasses.asdict(model_lib.GPTConfig()), **ckpt["model_config"]}
        now = dataclasses.asdict(self.model_config)
        if saved != now:
            diff = {k: (v, now.get(k)) for k, v in saved.items() if now.get(k) != v}
            raise TrainError(
                f"checkpoint {ckpt['path']} is for another model (checkpoint vs now: {diff}); "
                f"resume with the same `model`/`model_args` or start a new `out_dir`"
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
            checkpoints.set_rng_state(ckpt["rng"][self.dist.rank])
        self.tokens = ckpt["metrics"]["tokens"]
        self.lr_scale = ckpt["metrics"]["lr_scale"]
        self.last_eval = ckpt["metrics"].get("last_eval", {})
        changed = {
            k: (v, getattr(self.cfg, k))
            for k, v in ckpt["train_config"].items()
            if k not in ("resume", "overwrite") and getattr(self.cfg, k, v) != v
        }
        self.log(
            f"resumed from {ckpt['path']} at step {self.step}"
            + (f" (settings changed, checkpoint -> now: {changed})" if changed else "")
        )

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
            ckpt = checkpoints.load(self.out_dir, self.log)
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
        self.metrics.write(
            {
                "step": from_step,
                "event": "rollback",
                "to_step": self.step,
                "lr_scale": self.lr_scale,
                "checkpoint": ckpt["path"],
            }
        )
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
            with train_lib.autocast(self.device, self.dtype):
                _, loss = (self.model if uses_model_parallel(self.cfg) else self.raw_model)(x, y)
            total += loss.float()
        self.model.train()
        val_loss = float(all_reduce_mean(total / batches, self.dist))
        self.last_eval = {
            "step": self.step,
            "val_loss": val_loss,
            "val_bpb": val_loss / math.log(2) / self.bytes_per_token,
        }
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
        start = (
            self.tokenizer.encode(self.cfg.prompt, allowed_special="all")
            if self.cfg.prompt
            # no prompt: "a new document starts here"
            else [self.data.eot_id or 0]
        )
        start = start[-self.model_config.block_size :]
        idx = torch.tensor([start] * self.cfg.num_samples, dtype=torch.long, device=self.device)
        model.eval()
        out = model.generate(
            idx,
            self.cfg.sample_tokens,
            temperature=self.cfg.temperature,
            top_k=self.cfg.top_k or None,
            generator=generator,
        )
        model.train()
        return [self.cfg.prompt + self.tokenizer.decode(row[len(start) :].tolist()) for row in out]

    def mean_over_processes(self, values: torch.Tensor) -> torch.Tensor:
        """`values` averaged over every process of the run, tp and pp ranks included (train_loop's
        one all-reduce per step: loss and stop flag)."""
        return all_reduce_mean(values, self.dist, over_world=True)

    def mfu(self, tok_per_s: float) -> float:
        """MFU at this throughput. A peak probed at start (CPU, Apple GPU) is only the best that one
        matmul saw, on a machine that may have been busy then: the run's own FLOP/s, when higher,
        become the peak (the best seen), so the MFU never exceeds 100%."""
        mfu = train_lib.model_flops_utilization(
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

    def time_step(self, record: dict, seconds: float) -> None:
        """After a step of `seconds`: its tok/s and MFU go into its record; the smoothed step time
        (for the ETA) leaves out the first step of a compiled model, which compiles."""
        if self.cfg.compile and not self.compiled:  # the compiling step is no rate
            self.compiled = True
        elif self.step_time is None:
            self.step_time = seconds
        else:
            self.step_time = 0.9 * self.step_time + 0.1 * seconds
        self.last_step_seconds = seconds
        record["tok_per_s"] = self.tokens_per_step / seconds
        if self._peak:
            record["mfu"] = self.mfu(record["tok_per_s"])

    def step_line(self, record: dict) -> str:
        """The progress line of the step just timed (time_step), at the smoothed rate."""
        seconds = self.step_time or self.last_step_seconds
        line = self.progress_line(record, self.tokens_per_step / seconds, seconds)
        return line + (" | compiling" if self.step_time is None else "")

    def progress_line(self, record: dict, tok_per_s: float, seconds_per_step: float) -> str:
        """'step 10/600 | loss 8.0344 | lr 6.67e-04 | grad norm 0.911 | 2,147 tok/s | MFU 58.89% |
        ETA 9m22s'"""
        mfu = f"{100 * self.mfu(tok_per_s):.2f}%" if self._peak else "n/a"
        eta = format_duration((self.cfg.max_steps - self.step) * seconds_per_step)
        return (
            f"step {record['step'] + 1:>6}/{self.cfg.max_steps} | loss {record['loss']:.4f} | "
            f"lr {record['lr']:.2e} | grad norm {record['grad_norm']:.3f} | "
            f"{tok_per_s:,.0f} tok/s | MFU {mfu} | ETA {eta}"
        )

    def run(self) -> dict:
        """Train to max_steps (or until Ctrl-C), evaluating, checkpointing and logging; then sample
        and plot."""
        cfg = self.cfg
        # the first screen: what runs, how much, where; every setting goes to a file, not the screen
        self.log(self.summary_line())
        if self.dist.is_main:
            settings = fileio.write_atomic(
                self.out_dir / CONFIG_FILE,
                json.dumps(dataclasses.asdict(cfg), indent=1) + "\n",
                error=TrainError,
                fix="pick another `out_dir`",
            )
            self.log(
                f"config: every setting in {settings} (python train.py --config {settings} "
                "runs them again)"
            )
        shape = self.model_config
        experts = f", {shape.n_expert} experts (top {shape.expert_top_k})" if shape.n_expert else ""
        self.log(
            f"model: {cfg.model}, {shape.n_layer} layers x {shape.n_embd} wide, "
            f"{shape.n_head} heads ({shape.n_kv_head} kv), vocab {shape.vocab_size:,}, "
            f"context {shape.block_size}{experts} (every field: a checkpoint's model_config)"
        )
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
                f"{torch.cuda.get_device_name(self.device)!r} in machinery.run.GPU_PEAK_FLOPS)"
            )
        start_time = time.time()
        with stop_on_signals(self):
            if self.step == 0 and cfg.eval_at_start:
                self.evaluate()
            train_lib.train_loop(self)
        summary = {
            "step": self.step,
            "interrupted": self.stopping,
            "seconds": time.time() - start_time,
            **{k: v for k, v in self.last_eval.items() if k != "step"},
            "checkpoint": str(train_lib.checkpoint_path(self.out_dir, self.step)),
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


@contextlib.contextmanager
def stop_on_signals(run: Trainer):
    """Inside this block, Ctrl-C (SIGINT) or a scheduler's SIGTERM: finish the step, save a
    checkpoint, exit. A second one stops at once. The previous handlers come back on leaving it."""

    def on_signal(signum, frame):
        if run.stop_requested:
            raise KeyboardInterrupt
        run.stop_requested = True
        run.log(
            f"\n{signal.Signals(signum).name}: finishing this step and saving a checkpoint "
            f"(Ctrl-C again to abort)"
        )

    signals = (signal.SIGINT, signal.SIGTERM) if threading_main() else ()
    previous = {sig: signal.signal(sig, on_signal) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


# the values a setting may take (the command line offers them as its flag's choices)
CHOICES = {
    "cleaning": ("auto", "web", "keep"),
    "schedule": ("cosine", "wsd"),
    "optimizer": ("adamw", "muon"),
    "dtype": ("auto", "fp32", "bf16", "fp16"),
    "zero": (0, 1, 2, 3),
    "zero_reduce_dtype": ("fp32", "bf16"),
    "pp_schedule": ("afab", "1f1b"),
}
SEED_MAX = 2**32 - 1  # numpy's generators take seeds in [0, 2^32)
# --num-samples x --sample-tokens: ~75,000 words, more than anyone reads at the end
SAMPLE_TOKENS_MAX = 100_000


def check_stability_layout(cfg: TrainConfig, model_fields: dict) -> None:
    """Refuse a model.py stability option (`model_args` or an `init_from` checkpoint's config) that
    a layout would get wrong; softcap is elementwise on the logits, so every layout keeps it."""
    for option, layouts, why in (
        ("z_loss", ("tp", "pp", "cp"), "these take the cross-entropy themselves, without z-loss"),
        (
            "qk_norm",
            ("tp",),
            "a rank's heads give the q/k norm gains, shared by all heads, part of their gradient",
        ),
    ):
        given = [f"`{name}` {getattr(cfg, name)}" for name in layouts if getattr(cfg, name) > 1]
        if model_fields.get(option) and given:
            raise TrainError(
                f"`model_args` {option}={model_fields[option]} with {', '.join(given)}: {why}; "
                "drop one of them (data parallel, ZeRO and `ep` support it)"
            )


def check_config(cfg: TrainConfig) -> None:
    """Reject settings that cannot work before anything is built: one TrainError naming the setting
    and its range.

    Every number must be finite and of its field's type (a --config file can hold anything).
    >>> check_config(TrainConfig(eval_interval=0))
    Traceback (most recent call last):
    train.TrainError: `eval_interval` must be >= 1, got 0
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
            raise TrainError(f"`{field.name}` must be {noun}, got {value!r}")
        if field.type == "float" and not math.isfinite(value):
            raise TrainError(f"`{field.name}` must be a finite number, got {value}")
        choices = CHOICES.get(field.name)
        if choices and value not in choices:
            raise TrainError(
                f"`{field.name}` must be one of {', '.join(map(str, choices))}, got {value!r}"
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
            raise TrainError(f"`{name}` must be >= {low}, got {value}")
    for name, high in at_most.items():
        if getattr(cfg, name) > high:
            raise TrainError(f"`{name}` must be <= {high}, got {getattr(cfg, name)}")
    # ZeRO's flat shards gather each unit's momentum (parallel.Zero): only model-parallel layouts
    splits = [text for text in model_parallel_settings(cfg) if not text.startswith("`zero`")]
    if splits and cfg.optimizer == "muon":
        raise TrainError(
            f"`optimizer` muon with {', '.join(splits)}: Muon orthogonalises each whole matrix, "
            "which this layout splits (TP's slices) or does not yet wire; use data parallel or "
            "ZeRO (`zero` 1-3), or `optimizer` adamw"
        )
    check_stability_layout(cfg, parse_model_args(cfg.model_args))
    # AdamW's step is ~lr per weight: above 1 it only diverges
    if not 0 < cfg.lr <= 1:
        raise TrainError(f"`lr` must lie in (0, 1], got {cfg.lr}")
    # at <= 1 half the steps (or all) would count as spikes
    if not cfg.spike_factor > 1:
        raise TrainError(
            f"`spike_factor` must be > 1 (a spike is this many times the median loss), "
            f"got {cfg.spike_factor}"
        )
    for name in ("min_lr_ratio", "decay_fraction", "rollback_lr_factor", "beta1", "beta2"):
        # a beta of 1 never forgets: no average
        value, is_beta = getattr(cfg, name), name.startswith("beta")
        if not (0.0 <= value <= 1.0) or (is_beta and value == 1.0):
            raise TrainError(f"`{name}` must lie in [0, 1{')' if is_beta else ']'}, got {value}")
    if cfg.rollback_lr_factor == 0:
        raise TrainError(
            "`rollback_lr_factor` must be > 0 (0 would stop learning after a rollback); e.g. 0.5"
        )
    # generated one token at a time, at the end
    if cfg.num_samples * cfg.sample_tokens > SAMPLE_TOKENS_MAX:
        raise TrainError(
            f"`num_samples` {cfg.num_samples} x `sample_tokens` {cfg.sample_tokens} = "
            f"{cfg.num_samples * cfg.sample_tokens:,} tokens to generate after training, more than "
            f"{SAMPLE_TOKENS_MAX:,} (a novel's worth, hours on a CPU): lower one of them"
        )
    if cfg.zero_reduce_dtype != "fp32" and (cfg.zero != 3 or cfg.dtype in ("fp32", "fp16")):
        raise TrainError(
            f"`zero_reduce_dtype` {cfg.zero_reduce_dtype} applies only with `zero` 3 and bf16 "
            "compute (`dtype` bf16, or auto on a bf16 GPU): add `zero` 3, or leave "
            "`zero_reduce_dtype` out"
        )
    if cfg.ep > 1 and cfg.cp > 1:  # before any process group: one line, exit 2
        raise TrainError(
            f"`ep` {cfg.ep} with `cp` {cfg.cp}: expert parallel needs a MoE, ring "
            "attention a dense model; use one of `ep` and `cp`"
        )
    # meta, a missing GPU or a typo fails here, before any work
    resolve_device(cfg.device)
    if cfg.resume and cfg.overwrite:
        raise TrainError(
            "`resume` and `overwrite` contradict each other: `resume` continues the run in "
            "`out_dir`, `overwrite` deletes it; give one"
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
        f"{warmup} steps (10% of the run) instead"
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
    first = os.environ.get("RANK", "0") == "0" and not (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_rank()
    )
    check_writable_dir(cfg.out_dir)

    def refuse(pid):
        raise TrainError(
            f"`out_dir` {cfg.out_dir} is in use by another run (pid {pid}): wait for "
            f"it to end, stop it (kill {pid}), or pick another `out_dir`"
        )

    # The other ranks of the run share rank 0's folder, and its lock.
    with (
        fileio.hold(
            pathlib.Path(cfg.out_dir) / ".train.lock",
            refuse,
            TrainError,
            "remove it, or pick another `out_dir`",
        )
        if first
        else contextlib.nullcontext((None, None))
    ) as (_, stale):
        if stale:
            log(
                f"--out-dir {cfg.out_dir}: taking over the lock of process {stale}, which ended "
                f"without releasing it (killed?)"
            )
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
    return (
        f"note: the machine is busy (load {load:.1f} on {cores} cores): set OMP_NUM_THREADS=1, "
        f"faster here than torch's {threads} threads (each waits for a core at every step)"
    )


def busy_note(cfg: TrainConfig) -> str:
    """busy_machine_note for this machine, for a run on the CPU ("" on a GPU)."""
    if resolve_device(cfg.device).type != "cpu":
        return ""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average here (Windows)
        return ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return busy_machine_note(
        load, cores or 1, torch.get_num_threads(), threads_chosen="OMP_NUM_THREADS" in os.environ
    )
