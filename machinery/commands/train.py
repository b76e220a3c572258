"""`python train.py`: the command line of train.py. One flag per TrainConfig field (`max_steps` ->
`--max-steps`, its help in HELP), `--config FILE` (the same keys in JSON; explicit flags win), and
the one-line errors: machinery/run.py raises TrainError in the library's terms, naming a setting
as its field in backquotes (`out_dir`), and `main` shows it as the flag the user typed (--out-dir),
exit code 2. Ctrl-C twice exits with 130.

    python train.py --max-steps 100 --out-dir out/small
    torchrun --standalone --nproc_per_node=8 train.py --model 124m --zero 3
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

import torch

import data as data_lib
import model as model_lib
from machinery import fileio, run
from machinery.cli import Parser
from train import TrainConfig, TrainError

HELP = {  # the --help text of each TrainConfig field
    "data": (
        "corpus: source names or paths to prepare (comma-separated), or a prepared dataset "
        "directory (holds manifest.json)"
    ),
    "val_data": (
        "held-out file(s), comma-separated, used verbatim as the validation split "
        "(data.py prepare --val-data)"
    ),
    "cleaning": (
        "data.py's cleaning: auto (the funnel for web-like sources, local text files kept "
        "whole), web (the funnel for all), keep (none); other data settings: run data.py "
        "prepare, pass its --out as --data"
    ),
    "vocab_size": "BPE size if data.py trains one (0 = default)",
    "model": "model preset from machinery/presets.py",
    "model_args": "preset overrides, e.g. 'n_layer=2,n_embd=32'",
    "out_dir": "checkpoints, metrics.jsonl, loss-curve PNG",
    "seed": "seeds model init, data order and sampling",
    "batch_size": "micro-batch: sequences per forward per rank",
    "block_size": "sequence length in tokens (0 = the model's)",
    "total_batch_tokens": (
        "tokens per optimizer step over all ranks; sets gradient accumulation "
        "(0 = one micro-batch per rank)"
    ),
    "max_steps": "optimizer steps (the schedule's total)",
    "lr": "peak learning rate",
    "min_lr_ratio": "final lr as a fraction of the peak",
    "warmup_steps": "linear warmup steps",
    "schedule": "cosine | wsd",
    "decay_fraction": "wsd: fraction of steps spent decaying",
    "optimizer": "adamw | muon (Muon for hidden matrices, AdamW for the rest; same --lr)",
    "weight_decay": "AdamW decay (weight matrices only)",
    "lr_base_width": (
        "width transfer: hidden matrices' lr x this / n_embd, so an lr tuned at this width "
        "holds at others (0 = off)"
    ),
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "clip the global grad norm to this (0 = off)",
    "device": "auto | cpu | cuda | mps",
    "dtype": "auto (bf16 on capable CUDA, else fp32) | fp32 | bf16 | fp16",
    "compile": "torch.compile the model",
    "activation_checkpointing": (
        "recompute block activations in backward (less memory, ~1/3 more compute)"
    ),
    "peak_flops": (
        "hardware peak FLOP/s for MFU (0 = known GPU table, or a measured fp32 matmul on CPU)"
    ),
    "eval_interval": "steps between validation evaluations",
    "eval_batches": "micro-batches per validation estimate",
    "eval_at_start": "evaluate at step 0 too (the loss at initialisation, about ln(vocab))",
    "ckpt_interval": "steps between checkpoints",
    "keep_checkpoints": "how many recent checkpoints to keep",
    "resume": (
        "continue from the newest good checkpoint in --out-dir (bare --resume) or from a given file"
    ),
    "init_from": (
        "start a new run from this checkpoint's weights, shape and tokenizer (e.g. one "
        "`python model.py import-hf` wrote); --data must use the same tokenizer"
    ),
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
    "zero_reduce_dtype": (
        "--zero 3 with --dtype bf16 gathers weights in bf16 and keeps fp32 "
        "master shards; gradients are reduce-scattered in this dtype"
    ),
    "tp": "tensor-parallel degree",
    "pp": "pipeline-parallel degree",
    "ep": "expert-parallel degree (MoE experts over ep of the data-parallel ranks)",
    "cp": "context-parallel degree (each sequence over cp ranks, ring attention)",
    "pp_schedule": "pipeline schedule",
    "micro_batches": "pipeline micro-batches per step (0 = the accumulation steps)",
}


def flag(name: str) -> str:
    """`max_steps` -> `--max-steps`."""
    return "--" + name.replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    """One flag per TrainConfig field, plus --config FILE (JSON with the same keys; explicit flags
    win)."""
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
        if field.name in run.CHOICES:
            kwargs["choices"] = run.CHOICES[field.name]
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
        raise TrainError(f'--config {path} must hold a JSON object like {{"max_steps": 100}}')
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


def flag_names(message: str) -> str:
    """A library message with its settings shown as flags: "`max_steps` must be >= 1" ->
    "--max-steps must be >= 1" (backquoted words that are no TrainConfig field stay as they are).

    >>> flag_names("`total_batch_tokens` 1000 is not a multiple; `x` stays")
    '--total-batch-tokens 1000 is not a multiple; `x` stays'
    """
    fields = {field.name for field in dataclasses.fields(TrainConfig)}

    def as_flag(match: re.Match) -> str:
        if match.group(1) in fields:
            return flag(match.group(1))
        return match.group(0)

    return re.sub(r"`(\w+)`", as_flag, message)


def main(argv: list[str] | None = None) -> int:
    """Train with the flags: 0 when done, 130 when a signal stopped the run (a checkpoint saved) or
    a second Ctrl-C aborted it, 2 and one line on stderr for bad input."""
    try:
        cfg = parse_config(argv)
        summary = run.train(cfg, start_note=run.busy_note(cfg))
    except (TrainError, data_lib.DataError, model_lib.ConfigError) as e:
        print(f"train.py: error: {flag_names(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "train.py: aborted by a second Ctrl-C (no checkpoint written for the current step)",
            file=sys.stderr,
        )
        return 130
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    if summary["interrupted"]:
        return 130
    return 0
