"""Where to run: the one check of a device name that every command (train, evaluate, the sweep)
uses, so `--device cuda:3` on a machine with two GPUs is one line, not a CUDA error mid-run.

And in what precision: `resolve_dtype`, --dtype auto's choice (train.py section 5 is the lesson:
autocast for the compute, fp32 master weights).

Serves: machinery/run.py (train.py), machinery/commands/evaluate.py, machinery/sweep.py."""

from __future__ import annotations

import os

import torch

DEVICE_CHOICES = "auto, cpu, cuda, cuda:N or mps"


def resolve_device(name: str, error: type[Exception] = ValueError) -> torch.device:
    """A device name as a torch.device, or `error` in one line saying what this machine has.

    auto: CUDA (cuda:LOCAL_RANK under torchrun), else Apple's MPS, else the CPU. "meta" (tensors
    without data: everything after the first forward fails) and unknown names are refused. The
    message names the setting as `device`; a command line shows it as its flag.

    >>> resolve_device("meta")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: `device` meta: meta tensors hold no data to compute with; use auto, cpu, cuda, ...
    """
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if name == "auto" and cuda:
        name = "cuda"
    elif name == "auto":
        name = "mps" if mps else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise error(f"`device` {name}: not a device; use {DEVICE_CHOICES}") from None
    problem = None
    if device.type == "cuda" and not cuda:
        problem = "no CUDA device here; use cpu (or auto)"
    elif device.type == "cuda":
        index = int(os.environ.get("LOCAL_RANK", 0)) if device.index is None else device.index
        count = torch.cuda.device_count()
        if index >= count:
            problem = f"this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
        device = torch.device("cuda", index)
    elif device.type == "mps" and not mps:
        problem = "Apple's MPS backend is not available here; use cpu (or auto)"
    elif device.type == "meta":
        problem = f"meta tensors hold no data to compute with; use {DEVICE_CHOICES}"
    elif device.type == "cpu":
        device = torch.device("cpu")  # "cpu:0" is the same one CPU
    elif device.type != "mps":
        problem = f"this project runs on {DEVICE_CHOICES}, not {device.type}"
    if problem is not None:
        raise error(f"`device` {name}: {problem}")
    return device


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bf16 on a CUDA GPU with bf16 tensor cores (Ampere and later), fp16 on an older GPU,
    fp32 on CPU/MPS (bf16 is slow there). An older GPU (a V100, a T4) reports bf16 as supported
    because it emulates it in fp32 arithmetic, about as slow as fp32 and far from the bf16 peak MFU
    is measured against: it gets fp16."""
    if name != "auto":
        return DTYPES[name]
    if device.type != "cuda":
        return torch.float32
    if torch.cuda.is_bf16_supported(including_emulation=False):
        return torch.bfloat16
    return torch.float16
