"""bench_gpu.py: one command that proves train.py's CUDA path on a GPU, and the same code paths on a CPU (--smoke).

    python bench/bench_gpu.py --deadline-s 500 # one CUDA GPU, in 500 s (what does not fit: skipped: deadline)
    python bench/bench_gpu.py --nproc 8        # the same, and the torchrun sections also on 8 GPUs
    python bench/bench_gpu.py --smoke          # CPU, tiny models, gloo: the same code paths (CI keeps it alive)

The table goes to stdout, the JSON to out/bench_gpu.json in the repository (out/ is git-ignored; --json PATH
elsewhere). Nine sections, each a few rows. A row is a measured figure, a check (ok / FAIL: the exit code is 1 if
any check fails, else 0) or a target (met / missed, never a failure: targets are goals). Every section is guarded:
one that raises is a FAIL row ("section ran to its end", its traceback on stderr) and the next one runs; the JSON's
"sections" says which finished, and with how many failed checks.
1. speed    train.py's own loop (train.train_loop: schedule, spike guard, metrics line) on the 124m preset's
            shape in bf16, eager and with --compile: tokens/s and MFU against the GPU's dense peak
            (train_run.gpu_peak_flops), side by side with a minimal loop in this file on the same model and batch (the
            overhead ratio), and the largest micro-batch that fits (doubling until the allocator, CUDA or cuBLAS
            runs out of memory, or the data runs out of windows; the row after it says which). The model has
            pydocs' 4,096-token vocabulary: 88.1M parameters, not GPT-2 small's 124M (see Setup), and says so.
2. memory   peak allocated bytes of one training step (torch.cuda.max_memory_allocated after
            reset_peak_memory_stats; on a CPU the step's live tensors, LiveBytes) vs predicted_memory, which models
            model.py as written: a bf16 residual stream, the norms' fp32 upcast, one matmul input per norm (q/k/v
            and w1/w3 fused), the logits train.py keeps and the loss backward (saved_terms). For the 88M model at
            16 x 1024 in bf16 it predicts 9.13 GB (10.67 GB before the fusion and the bf16 stream). On a CPU the
            prediction must hold within 5% (it holds to a few bytes); on a GPU the target is 15%.
3. decode   KV-cache generation tokens/s at batch 1 and 16 (bf16 weights, greedy).
4. resume   exact resume on the device: a run with dropout (so the CUDA generator matters) checkpointed at step 3
            and resumed by a fresh Trainer after every generator was scrambled gives the uninterrupted losses (bit
            for bit on a CPU; within 1e-4 on a GPU, whose atomic-add kernels do not repeat bitwise), while the
            same resume with the generators left scrambled does not (the control); the checkpoint holds the CUDA
            RNG state, loads on the CPU (same logits), resumes there, and the CPU's checkpoint loads back.
5. torchrun `torchrun --nproc_per_node=N` for N = 1 and N = --nproc (default: every visible GPU): nccl
            init, then every layout N allows (dp x tp x pp with ZeRO-0/1/2/3, ZeRO-3 also in bf16) on a small
            GPT, each compared with one process computing the whole batch on the same device (weights after 3
            AdamW steps within 2e-4); N = 1 runs ZeRO-1/2/3 at world 1 and the pipeline executor with one stage.
6. train.py train.py itself under `torchrun --nproc_per_node=N`, on a GPU as README's multi-GPU command:
            `--zero 3 --dtype bf16 --compile`, fused AdamW (checked): three launches of a 4-layer GPT, 20 steps:
            train (evaluations at 0/10/20, checkpoints at 10 and 20, two samples), resume from step 10 in a new
            process (the same losses), and resume with a forced spike the guard rolls back (ROLLBACK_FLAGS).
            --smoke runs it eager on 2 gloo ranks (tests/test_compile.py rehearses --compile on CPUs).
7. nccl     a world-1 nccl group runs every collective train.py uses (Comm short-circuits a group of one):
            all_reduce, reduce_scatter, all_gather, all_to_all_single, broadcast, all_gather_object, a barrier;
            where 2 ranks exist (2 GPUs; gloo on --smoke) torchrun runs them on 2 ranks with send/recv as
            context parallel's ring posts it (torch refuses a send to oneself, so 1 GPU cannot probe it).
8. kernels  this round's code on the device against its reference path: the hand FlashAttention against SDPA
            (fp32 equal; bf16 error against float64 within 1.5x SDPA's; compiled = eager), linear attention's
            chunked form against its recurrent one, and a GPT with flash attention, linear layers, the LLLA
            hybrid and MoE (loss, logits, every gradient) against the same weights in float64 on the CPU.
9. ep_cp    `--ep` and `--cp` under torchrun at world 1 and, where 2 ranks exist, 2: one SGD step against one
            process on the same device (loss, every weight).
10. ablation opt-in (`--only ablation`, outside the default run): the minimal loop's tokens/s and MFU, eager and
            compiled, with model.py's GPU-step changes each switched off (separate q/k/v and w1/w3 matmuls, an
            fp32 residual stream, SDPA forced to FlashAttention-2 or to cuDNN) and all off, and the SDPA backend the
            dispatcher picks: what each change is worth on the device, in one run.

Order and time: the sections run highest value first (6, 7, 8, 9, 2, 1, 3, 4, 5), each in a child process (in a
session of its own) with its own timeout; past it the child, its process group and every process it started
(torchrun's workers lead sessions of their own) get SIGTERM, then SIGKILL (end_process_tree), so a broken CUDA
context or a hang loses that section only. The JSON is rewritten after every section. --deadline-s skips a
section whose projection (PROJECTED_S, 470 s in all on a GPU) no longer fits in what is left, and stops one that
outlives what was left: both are "skipped: deadline", not failures. The speed section writes a profiler trace
of 2 compiled steps next to the JSON (bench_gpu.trace.json).

Sizing, a projection (no GPU has run this file yet): the 88M model costs 6.42e8 FLOPs/token (model.py's
6N + 12LTC at T = 1024), 1.05e13 per 16 x 1024 step: 27 ms at 40% of the H200's 989 TFLOP/s dense bf16 peak.
Section 1 runs 52 such steps (3 untimed + 10 timed, train.py's loop and the minimal one, eager and compiled:
~2 s) plus the micro-batch search (16 to 256: ~1 s of steps) and two inductor compiles (~1 minute each, the
largest item); sections 2-4 are a few steps each (~30 s with start-up); section 5 is one torchrun launch (~20 s);
section 6 is 3 compiled launches (~15 s of start-up each, ~1 minute of inductor compiles for the first; the
resumed two compile the same graphs, which inductor's on-disk cache holds): ~2.7 minutes; section 8 is seconds
of kernels at T = 2,048 and one compile of the flash operator, section 9 one torchrun launch per world (~15 s).
Total 470 s projected, within --deadline-s 500; `--nproc 8` adds sections 5, 6 and 9 (and 7's 2-rank probe).
Every figure the bench prints comes from the run itself.

Depends on: torch and the project's train.py, model.py, parallel.py, model_parallel.py, data.py, fileio.py.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import benchcli  # noqa: E402
import data as data_lib  # noqa: E402
from machinery import checkpoints, fileio  # noqa: E402
from machinery import launch as launcher  # noqa: E402
from machinery import parallelize as wiring  # noqa: E402
import model as model_lib  # noqa: E402
import model_parallel  # noqa: E402
import parallel  # noqa: E402
import scaling  # noqa: E402
import train  # noqa: E402
from machinery import run as train_run  # noqa: E402
from machinery.commands import train as train_command  # noqa: E402


class BenchError(Exception):
    """Bad input to this script: main() prints it as one line and exits with code 2."""


@dataclasses.dataclass
class Setup:
    """What one run measures on: the full GPU setting, or --smoke's CPU miniature of it.

    The GPU setting's "124m" is the preset's shape (12 layers, 768 wide, 12 heads) with the vocabulary of the data
    it trains on: pydocs' tokenizer has 4,096 tokens, so the model has 88M parameters, not GPT-2 small's 124M
    (which counts a 50,304-token vocabulary: 38.6M embedding parameters). The bench says so in its first row.
    A 50k vocabulary was not chosen: a BPE trained to 50k tokens on pydocs' 1.1 MB learns whole words seen once
    or twice (embedding rows that never train), and GPT-2's own tokenizer needs a download a GPU node may not have.
    """

    device: torch.device
    dtype: str  # train.py's --dtype
    preset: str
    model_args: str  # train.py's --model-args
    batch_size: int
    block_size: int
    steps: int  # timed steps per loop (after `warmup` untimed ones)
    warmup: int
    max_batch: int  # the micro-batch search stops here
    gen_tokens: int
    compile_backend: (
        str  # inductor on a GPU; eager on CPU (dynamo traces the same graph, in seconds)
    )
    nproc: list[int]  # torchrun world sizes of the layout section
    run_nproc: list[int]  # torchrun world sizes of the train.py section
    run_zero: tuple[int, ...]  # its ZeRO stages
    run_model_args: str  # its small GPT (the tiny preset with these overrides)
    run_batch: int
    run_block: int
    run_timeout_s: float  # one train.py launch
    run_compile: bool = False  # train.py --compile (GPU; tests/test_compile.py: CPU)
    trace: str = ""  # the profiler trace of 2 compiled steps, next to the JSON

    @classmethod
    def gpu(cls, nproc: int) -> "Setup":
        worlds = sorted({1, nproc})
        return cls(
            torch.device("cuda", 0),
            "bf16",
            "124m",
            "",
            16,
            1024,
            10,
            3,
            256,
            256,
            "inductor",
            worlds,
            worlds,
            (3,),
            "n_layer=4",
            8,
            128,
            150,
            run_compile=True,
        )

    @classmethod
    def smoke(cls) -> "Setup":
        # train.py joins a process group only at world size > 1 (and --zero needs one), so the CPU version runs
        # train.py on 2 gloo ranks, and only ZeRO-3 (each launch costs seconds of start-up on a CPU).
        return cls(
            torch.device("cpu"),
            "fp32",
            "tiny",
            "n_layer=2,n_embd=64,n_head=4,n_kv_head=2",
            4,
            32,
            2,
            1,
            8,
            8,
            "eager",
            [1, 2],
            [2],
            (3,),
            "n_layer=2,n_embd=64,n_head=4,n_kv_head=2",
            4,
            32,
            600,
        )

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


class Report:
    """Rows of (section, item, value, status); status '' (a figure), 'ok'/'FAIL' (a check), 'met'/'missed'."""

    def __init__(self, sink: pathlib.Path | None = None):
        self.rows: list[dict] = []
        self.sink = sink  # in a section's child: each row reaches this file at once

    def add(self, section: str, item: str, value, status: str = "") -> None:
        self.rows.append({"section": section, "item": item, "value": value, "status": status})
        print(f"  {section:<8} {item:<58} {_show(value):>16} {status}", flush=True)
        if self.sink:
            write_json(self.sink, {"rows": self.rows})

    def check(self, section: str, item: str, value, ok: bool) -> None:
        self.add(section, item, value, "ok" if ok else "FAIL")

    def target(self, section: str, item: str, value, met: bool) -> None:
        self.add(section, item, value, "target met" if met else "target missed")

    @property
    def failed(self) -> list[dict]:
        return [r for r in self.rows if r["status"] == "FAIL"]


def _show(value) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e4 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def sync(device: torch.device) -> None:
    """Wait for the GPU: CUDA calls return before the work is done, so a clock read needs this first."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def quiet(*args, **kwargs) -> None:
    pass


def trainer_for(setup: Setup, out_dir: pathlib.Path, *flags: str) -> train_run.Trainer:
    """A train.py Trainer as `python train.py` builds it: evaluation, checkpoints and logs out of the way."""
    argv = [
        "--data",
        "pydocs",
        "--model",
        setup.preset,
        "--device",
        setup.device.type,
        "--dtype",
        setup.dtype,
        "--batch-size",
        str(setup.batch_size),
        "--block-size",
        str(setup.block_size),
        "--max-steps",
        "100000",
        "--eval-interval",
        "100000",
        "--ckpt-interval",
        "100000",
        "--log-interval",
        "100000",
        "--num-samples",
        "0",
        "--out-dir",
        str(out_dir),
    ]
    if setup.model_args:
        argv += ["--model-args", setup.model_args]
    return train_run.Trainer(train_command.parse_config(argv + list(flags)), log=quiet)


# ----------------------------------------------------------------------------------------------------------------
# 1. Speed: train.py's loop vs a minimal loop, eager and compiled; the largest micro-batch
# ----------------------------------------------------------------------------------------------------------------


def time_loop(step, device: torch.device, warmup: int, steps: int) -> float:
    """Seconds per step of `step()` after `warmup` untimed calls (the first compiles)."""
    for _ in range(warmup):
        step()
    sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - start) / steps


def reference_step_fn(
    trainer: train_run.Trainer, compile_backend: str | None, batch_size: int | None = None
):
    """The minimal loop on a fresh copy of the trainer's model: batch to device, forward under autocast, backward,
    clip, fused AdamW step, zero grads. Same model config, batch shape and data iterator as the trainer."""
    torch.manual_seed(trainer.cfg.seed)
    gpt = model_lib.GPT(trainer.model_config).to(trainer.device)
    opt = train.make_optimizer(gpt, trainer.cfg, trainer.device.type)
    forward = torch.compile(gpt, backend=compile_backend) if compile_backend else gpt
    loader = trainer.data.iterator(
        "train", batch_size or trainer.cfg.batch_size, trainer.block_size, seed=trainer.cfg.seed
    )

    def step():
        x, y = (t.to(trainer.device, non_blocking=True) for t in loader.next())
        with train.autocast(trainer.device, trainer.dtype):
            _, loss = forward(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


@contextlib.contextmanager
def compile_backend(name: str):
    """train.py calls torch.compile(model) with the default (inductor) backend; --smoke swaps in `eager` so the
    same call compiles in seconds on a CPU."""
    if name == "inductor":
        yield
        return
    original = torch.compile
    torch.compile = lambda model, **kw: original(model, **{**kw, "backend": name})
    try:
        yield
    finally:
        torch.compile = original


def bench_speed(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    out = {}
    for compiled in (False, True):
        tag = "compiled" if compiled else "eager"
        with compile_backend(setup.compile_backend):
            trainer = trainer_for(setup, tmp / f"speed-{tag}", *(["--compile"] if compiled else []))
        ours = time_loop(
            lambda: train.train_loop(trainer, steps=1), setup.device, setup.warmup, setup.steps
        )
        if compiled and setup.trace:
            out["trace"] = profile_steps(trainer, setup, pathlib.Path(setup.trace))
            report.add("speed", "profiler trace of 2 compiled steps (Perfetto)", out["trace"])
        ref = time_loop(
            reference_step_fn(trainer, setup.compile_backend if compiled else None),
            setup.device,
            setup.warmup,
            setup.steps,
        )
        tokens = trainer.tokens_per_step
        peak = trainer._peak
        mfu = tokens / ours * trainer._flops_per_token / peak if peak else None
        report.add("speed", f"train.py loop, {tag}: tokens/s", tokens / ours)
        report.add("speed", f"minimal loop, {tag}: tokens/s", tokens / ref)
        report.add(
            "speed",
            f"train.py loop, {tag}: MFU vs dense peak {peak or 0:.3g}",
            mfu if mfu else "n/a",
        )
        overhead = ours / ref - 1
        report.target(
            "speed",
            f"loop overhead vs minimal loop, {tag} (target < 3%)",
            f"{overhead:+.1%}",
            overhead < 0.03,
        )
        if compiled and mfu is not None and setup.cuda:
            report.target(
                "speed", "MFU, compiled (target >= 45% on an H200)", f"{mfu:.1%}", mfu >= 0.45
            )
        out[tag] = {
            "tokens_per_s": tokens / ours,
            "reference_tokens_per_s": tokens / ref,
            "mfu": mfu,
            "overhead": overhead,
            "peak_flops": peak,
        }
        out["params"], out["vocab_size"] = (
            trainer.raw_model.num_params(),
            trainer.model_config.vocab_size,
        )
        if not compiled:  # the preset names a shape; the vocabulary is the data's tokenizer's
            cfg = trainer.model_config
            report.add(
                "speed",
                f"model: preset {setup.preset}'s shape ({cfg.n_layer} x {cfg.n_embd}), vocab "
                f"{cfg.vocab_size:,} of --data pydocs: parameters",
                out["params"],
            )
        trainer = None  # freed before the next one is built
        _free(setup.device)
    out["max_micro_batch"], out["max_micro_batch_stop"] = largest_micro_batch(setup, tmp)
    report.add(
        "speed",
        f"largest micro-batch that fits, eager (T={setup.block_size}, up to {setup.max_batch})",
        out["max_micro_batch"],
    )
    report.add("speed", "  the search stopped at", out["max_micro_batch_stop"])
    return out


def profile_steps(trainer: train_run.Trainer, setup: Setup, path: pathlib.Path) -> str:
    """2 of train.py's (compiled) steps under torch.profiler: a Chrome trace, CPU and CUDA."""
    kinds = torch.profiler.ProfilerActivity
    activities = [kinds.CPU, kinds.CUDA] if setup.cuda else [kinds.CPU]
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(2):
            train.train_loop(trainer, steps=1)
        sync(setup.device)
    prof.export_chrome_trace(str(path))
    return str(path)


def largest_micro_batch(setup: Setup, tmp: pathlib.Path) -> tuple[int, str]:
    """Double the micro-batch from the setting's until a training step fails for want of memory or of data.

    Returns (the largest that fit, why the next did not). What ends the search, besides reaching `max_batch`:
    the allocator's torch.cuda.OutOfMemoryError; an out-of-memory that CUDA or cuBLAS reports as a plain
    RuntimeError (a kernel launch or cuBLAS's workspace, not the allocator); and data.py's DataError when the
    train split has fewer windows than one batch (pydocs has 285 windows of 1,025 tokens). Anything else is a bug
    and is raised.
    """
    trainer = trainer_for(setup, tmp / "batch-search")
    fits, batch, reason = 0, setup.batch_size, f"reached the search's limit {setup.max_batch}"
    while batch <= setup.max_batch:
        step = None
        try:
            step = reference_step_fn(trainer, None, batch)
            step()
            sync(setup.device)
            fits = batch
        except Exception as e:  # noqa: BLE001 - classified below, re-raised if not understood
            why = batch_failure(e)
            if why is None:
                raise
            reason = f"batch {batch}: {why}"
            break
        finally:
            step = None
            _free(setup.device)
        batch *= 2
    return fits, reason


def batch_failure(e: Exception) -> str | None:
    """Why a bigger micro-batch failed, if it is a limit (memory, data) rather than a bug; else None.

    >>> batch_failure(RuntimeError("CUDA error: out of memory"))
    'out of memory (CUDA: CUDA error: out of memory)'
    >>> batch_failure(RuntimeError("size mismatch")) is None
    True
    """
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return "out of memory (the CUDA allocator)"
    if isinstance(e, data_lib.DataError):
        return f"too few windows ({e})"
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, RuntimeError) and (
        "out of memory" in text.lower() or "CUBLAS_STATUS_ALLOC_FAILED" in text
    ):
        return f"out of memory (CUDA: {text})"
    return None


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------------------------------------------
# 2. Memory: measured peak of one step vs the accounting
# ----------------------------------------------------------------------------------------------------------------

LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


def saved_terms(
    config: model_lib.GPTConfig, batch: int, seq: int, dtype: str, device: str = "cpu"
) -> tuple[dict, dict]:
    """What autograd saves for backward in one forward of model.py's GPT as written, term by term:
    ({name: (dtype, bytes)} of one block, the same of the rest: embedding, final norm, LM head, loss), on a
    `device` type ("cpu", "cuda").

    Counted from the code (dense FFN, dropout 0), B = batch, T = seq, C = n_embd, H = ffn_dim, V = vocab, a = 2
    bytes under bf16/fp16 autocast, 4 in fp32:
    - the residual stream is in the compute dtype (the embedding's output is cast to it), and RMSNorm takes the
      mean square in fp32: under autocast each of a block's two norms saves its input upcast to fp32 (4 bytes per
      element of (B, T, C)), the normalised x before the gain (a bytes) and the gain cast to bf16 (C); in fp32 its
      input and normalised x (4 + 4 bytes); both save the (B, T, 1) reciprocal RMS;
    - the norm's output, in the compute dtype, is the one input of the matmuls that read it: q, k, v is one matmul
      (model.fused_linear), w1 and w3 another: 2 x a bytes;
    - attention saves q, k (after RoPE), v (a copy out of the fused output) and its output (also wo's input), K
      and V at n_kv_head width where the kernel reads GQA's groups in place (model.SDPA_GQA_IN_PLACE: the CPU,
      CUDA in bf16/fp16), else at n_head width (repeated first), and an fp32 logsumexp (B, heads, T); RoPE's cos
      and sin tables (T, d/2) in fp32 are saved by the rotation;
    - SwiGLU saves the fused w1/w3 output (silu's input and the product's value are views of it), silu's output
      and the product (w2's input): 4 x a bytes of (B, T, H);
    - a copy of every matmul weight: autocast's bf16 cast (wo, w2 cached; the stacked q/k/v and w1/w3 weights
      cast each forward), in fp32 the stacked weights alone (4 bytes per weight of wq, wk, wv, w1, w3);
    - outside the blocks: the ids and targets (int64), the final norm as above, the LM head's input (the norm's
      output), autocast's copy of its weight, the fp32 log-softmax (B, T, V) and the loss's 0-dim weight.
    tests/test_bench_gpu.py counts what a forward really saves (saved_tensors_hooks) against these terms.
    >>> cfg = model_lib.GPTConfig(vocab_size=512, n_layer=2, n_head=4, n_kv_head=2, n_embd=64)
    >>> block, rest = saved_terms(cfg, 2, 64, "bf16")
    >>> block["norm inputs upcast (fp32)"], rest["log-softmax (fp32)"]
    (('float32', 65536), ('float32', 262144))
    """
    if config.n_expert or config.dropout:
        raise ValueError("saved_terms counts a dense model with dropout 0 (the presets)")
    B, T, C, H, V = batch, seq, config.n_embd, config.ffn_dim, config.vocab_size
    low = dtype in LOW_PRECISION
    act = str(LOW_PRECISION[dtype]).split(".")[-1] if low else "float32"
    a = 2 if low else 4
    q_width = config.n_head * config.head_dim
    in_place = (
        LOW_PRECISION.get(dtype, torch.float32) in model_lib.SDPA_GQA_IN_PLACE.get(device, ((),))[0]
    )
    kv_width = config.n_kv_head * config.head_dim if in_place else q_width
    stacked = (q_width + 2 * config.n_kv_head * config.head_dim + 2 * H) * C  # wq wk wv, w1 w3
    linear = stacked + q_width * C + H * C  # + wo, w2
    block = {
        "norm inputs upcast (fp32)" if low else "norm inputs and normalised (fp32)": (
            "float32",
            2 * (4 if low else 8) * B * T * C,
        ),
        "norm normalised, gain copy": (act, 2 * a * (B * T * C + C) if low else 0),
        "norm reciprocal RMS (fp32)": ("float32", 2 * 4 * B * T),
        "matmul inputs (one per norm)": (act, 2 * a * B * T * C),
        "attention q, k, v, output": (act, a * B * T * (2 * q_width + 2 * kv_width)),
        "attention logsumexp (fp32)": ("float32", 4 * B * config.n_head * T),
        "RoPE cos, sin (fp32)": ("float32", 2 * 4 * T * (config.head_dim // 2)),
        "SwiGLU w1/w3, silu, product": (act, 4 * a * B * T * H),
        "weight copies (autocast's; fp32: the stacked)": (act, a * linear if low else 4 * stacked),
    }
    rest = {
        "ids and targets (int64)": ("int64", 2 * 8 * B * T),
        "final norm input (and normalised in fp32)": (
            "float32",
            (4 if low else 8) * B * T * C + 4 * B * T,
        ),
        "final norm normalised, gain copy": (act, a * (B * T * C + C) if low else 0),
        "LM head input": (act, a * B * T * C),
        "LM head weight copy": (act, a * V * C if low else 0),
        "log-softmax (fp32)": ("float32", 4 * B * T * V),
        "loss weight (fp32)": ("float32", 4),
    }
    return block, rest


def bytes_by_dtype(terms: dict, times: int = 1) -> dict[str, int]:
    """{dtype: bytes} of saved_terms' terms, each counted `times` times."""
    out: dict[str, int] = {}
    for kind, size in terms.values():
        out[kind] = out.get(kind, 0) + times * size
    return {k: v for k, v in out.items() if v}


def predicted_memory(
    config: model_lib.GPTConfig,
    batch: int,
    seq: int,
    checkpointing: bool,
    dtype: str,
    device: str = "cpu",
) -> dict:
    """Peak bytes of one train.py step (micro-batch `batch` x `seq`, one process, AdamW's state already made).

    The peak is in the loss's backward, before any gradient exists: fp32 weights (4/param) and AdamW's two
    moments (8/param), the batch (two int64 (B, T)), everything the forward saved (saved_terms), the logits that
    train.py's `_, loss = model(x, y)` keeps alive (a x B x T x V), and the log-softmax backward's fp32 gradient of
    its output and of its input (8 x B x T x V). This assumes that 8·V exceeds what one block's backward adds at
    once (a few H per token): true for every preset and the bench's models.
    With activation checkpointing a block keeps only its input (a x B x T x C) and recomputes the rest in
    backward; the peak is then the larger of the loss's backward and the top block's recomputation (its saved
    set and weight copies, with the head's gradient (4 x V x C) made and the logits freed).
    """
    n = scaling.count_params(config)
    block, rest = saved_terms(config, batch, seq, dtype, device)
    a = 2 if dtype in LOW_PRECISION else 4
    B, T, C, V = batch, seq, config.n_embd, config.vocab_size
    one_block = sum(b for _, b in block.values())
    head = sum(b for name, (_, b) in rest.items() if not name.startswith("ids"))
    parts = {"weights": 4 * n, "optimizer": 8 * n, "batch": rest["ids and targets (int64)"][1]}
    logits = a * B * T * V + 8 * B * T * V
    if checkpointing:
        blocks = config.n_layer * a * B * T * C
        loss_moment = head + logits
        recompute_moment = one_block + 4 * V * C
        parts.update(
            block_inputs=blocks,
            head_saved=head,
            logits_and_loss_backward=logits,
            top_block_recompute=recompute_moment,
        )
        parts["total"] = 12 * n + parts["batch"] + blocks + max(loss_moment, recompute_moment)
    else:
        parts.update(
            blocks_saved=config.n_layer * one_block,
            head_saved=head,
            logits_and_loss_backward=logits,
        )
        parts["total"] = sum(parts.values())
    return parts


class LiveBytes(TorchDispatchMode):
    """The CPU's max_memory_allocated: bytes of the tensors created under this mode that are still alive, and their
    peak. An op's output storage is counted once until Python frees it (a weak finalizer); an output that shares
    an input's storage (a view such as a weight's transpose, an in-place op) allocated nothing."""

    def __init__(self):
        super().__init__()
        self.live: dict[int, int] = {}
        self.now = self.peak = 0

    def _freed(self, pointer: int) -> None:
        self.now -= self.live.pop(pointer, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor)
        }
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                pointer, size = storage.data_ptr(), storage.nbytes()
                if size and pointer not in self.live and pointer not in inputs:
                    self.live[pointer] = size
                    self.now += size
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(storage, self._freed, pointer)
        return out


def bench_memory(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    """Measured peak of one train.py step vs predicted_memory: CUDA's allocator on a GPU; on a CPU the LiveBytes
    count of the tensors the step creates (weights and AdamW state are there before it, so they are added), in the
    GPU's dtype (bf16 autocast) and in the setting's."""
    out = {}
    dtypes = sorted({setup.dtype, "bf16"}) if not setup.cuda else [setup.dtype]
    for dtype in dtypes:
        for checkpointing in (False, True):
            tag = f"{dtype}, " + ("checkpointed" if checkpointing else "plain")
            out[tag] = _measure_memory(
                dataclasses.replace(setup, dtype=dtype), report, tmp, checkpointing, tag
            )
    return out


def _measure_memory(
    setup: Setup, report: Report, tmp: pathlib.Path, checkpointing: bool, tag: str
) -> dict:
    baseline = 0
    if setup.cuda:
        # The section runs in a fresh child process: CUDA's allocator exists only once CUDA is
        # initialised, and resetting its peak before that is "Invalid device argument" (seen on an H200).
        torch.cuda.init()
        _free(setup.device)
        torch.cuda.reset_peak_memory_stats(setup.device)
        baseline = torch.cuda.memory_allocated(setup.device)  # whatever earlier sections still hold
    trainer = trainer_for(
        setup,
        tmp / f"memory-{tag.replace(', ', '-')}",
        *(["--activation-checkpointing"] if checkpointing else []),
    )
    train.train_loop(trainer, steps=1)  # AdamW's moments exist after the first step
    want = predicted_memory(
        trainer.model_config,
        setup.batch_size,
        setup.block_size,
        checkpointing,
        setup.dtype,
        setup.device.type,
    )
    held = wiring.training_state_bytes(trainer.raw_model.parameters(), trainer.optimizer)
    # Between steps the grads are freed (zero_grad(set_to_none)): weights + AdamW moments = 4 + 8 bytes/param
    # (+ a 4-byte step counter per tensor).
    state = want["weights"] + want["optimizer"]
    report.check(
        "memory",
        f"{tag}: weights + AdamW state held (= 12 bytes/param)",
        held["params"] + held["optimizer"],
        abs(held["params"] + held["optimizer"] - state) <= 0.01 * state,
    )
    if setup.cuda:
        train.train_loop(trainer, steps=1)
        sync(setup.device)
        peak = torch.cuda.max_memory_allocated(setup.device) - baseline
        where = "CUDA allocator"
    else:
        counter = LiveBytes()
        with counter:
            train.train_loop(trainer, steps=1)
        peak = counter.peak + held["params"] + held["optimizer"]
        where = "CPU, live tensors"
    ratio = peak / want["total"]
    report.add("memory", f"{tag}: peak of one step ({where}), GB", peak / 1e9)
    report.add("memory", f"{tag}: predicted (state + saved + logits), GB", want["total"] / 1e9)
    if setup.cuda:
        report.target(
            "memory",
            f"{tag}: measured / predicted (target within 15%)",
            f"{ratio:.3f}",
            abs(ratio - 1) <= 0.15,
        )
    else:  # the same code on a CPU: the model must hold closely
        report.check(
            "memory",
            f"{tag}: measured / predicted (within 5% on a CPU)",
            f"{ratio:.3f}",
            abs(ratio - 1) <= 0.05,
        )
    del trainer
    return {"predicted": want, "held": held, "peak": peak, "ratio": ratio, "measured_by": where}


# ----------------------------------------------------------------------------------------------------------------
# 3. Decode: KV-cache generation tokens/s
# ----------------------------------------------------------------------------------------------------------------


def bench_decode(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    config = trainer_for(setup, tmp / "decode-config").model_config
    torch.manual_seed(0)
    gpt = model_lib.GPT(config).to(setup.device).eval()
    if setup.cuda:
        gpt = gpt.to(torch.bfloat16)  # inference needs no fp32 master weights
    out = {}
    for batch in (1, 16):
        prompt = torch.randint(0, config.vocab_size, (batch, 16), device=setup.device)
        gpt.generate(prompt, 4, temperature=0)  # warm up the kernels
        sync(setup.device)
        start = time.perf_counter()
        gpt.generate(prompt, setup.gen_tokens, temperature=0)
        sync(setup.device)
        rate = batch * setup.gen_tokens / (time.perf_counter() - start)
        report.add(
            "decode",
            f"KV-cache greedy decoding, batch {batch}: tokens/s ({setup.gen_tokens} new)",
            rate,
        )
        out[f"batch_{batch}"] = rate
    return out


# ----------------------------------------------------------------------------------------------------------------
# 4. Exact resume on the device; the checkpoint crosses to the CPU and back
# ----------------------------------------------------------------------------------------------------------------


def scramble_generators() -> None:
    """What a killed process loses: every generator starts elsewhere, so only the checkpoint can restore them."""
    torch.manual_seed(987654321)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(987654321)


def bench_resume(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    resume_args = (
        "n_layer=2,n_embd=64,n_head=4,n_kv_head=2,dropout=0.1"  # dropout draws from the CUDA RNG
    )
    small = dataclasses.replace(
        setup, preset="tiny", model_args=resume_args, batch_size=4, block_size=64
    )
    flags = [
        "--max-steps",
        "6",
        "--ckpt-interval",
        "3",
        "--keep-checkpoints",
        "5",
        "--warmup-steps",
        "2",
    ]
    whole = trainer_for(small, tmp / "resume-whole", *flags)
    whole.run()
    want = _losses(tmp / "resume-whole")
    ckpt = train.load_checkpoint(train.checkpoint_path(tmp / "resume-whole", 3))
    if setup.cuda:
        report.check(
            "resume",
            "checkpoint holds the CUDA RNG state",
            "cuda" in ckpt["rng"][0],
            "cuda" in ckpt["rng"][0],
        )
    # CPU kernels repeat bit for bit; some CUDA kernels accumulate with atomics (embedding and attention
    # backward), so on a GPU the uninterrupted run itself repeats only to ~1e-6. The control below shows that the
    # tolerance still catches a resume that forgets the random generators.
    tol = 1e-4 if setup.cuda else 0.0
    got = _resume_from_step_3(small, tmp, "resume-killed", flags)
    worst = max(abs(got[s] - want[s]) for s in (3, 4, 5))
    exact = worst <= tol
    report.check(
        "resume",
        f"killed at step 3, resumed on {setup.device.type}: losses 3-5 within {tol:g}",
        f"{worst:.1e}",
        exact,
    )
    restore = checkpoints.set_rng_state
    checkpoints.set_rng_state = lambda state: None  # the control: generators left scrambled
    try:
        forgot = _resume_from_step_3(small, tmp, "resume-no-rng", flags)
    finally:
        checkpoints.set_rng_state = restore
    miss = max(abs(forgot[s] - want[s]) for s in (3, 4, 5))
    report.check(
        "resume",
        "control: the same resume without restoring the RNG differs",
        f"{miss:.1e}",
        miss > 10 * tol and miss > 0,
    )

    # The device's checkpoint on the CPU: same logits; a CPU resume continues the curve; its checkpoint comes back.
    x = torch.randint(
        0, whole.model_config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0)
    )
    on_cpu, _ = train.model_from_checkpoint(ckpt, "cpu")
    on_device, _ = train.model_from_checkpoint(ckpt, setup.device)
    with torch.no_grad():
        diff = float((on_cpu(x)[0] - on_device(x.to(setup.device))[0].cpu()).abs().max())
    report.check(
        "resume",
        f"{setup.device.type} checkpoint on the CPU: max logit difference",
        f"{diff:.1e}",
        diff < 1e-3,
    )
    (tmp / "resume-cpu").mkdir()
    shutil.copy(train.checkpoint_path(tmp / "resume-whole", 3), tmp / "resume-cpu")
    cpu_setup = dataclasses.replace(small, device=torch.device("cpu"), dtype="fp32")
    trainer_for(cpu_setup, tmp / "resume-cpu", *flags, "--resume").run()
    cpu_losses = _losses(tmp / "resume-cpu")
    rel = 2e-2 if setup.dtype == "bf16" else 1e-3  # the device ran bf16 autocast, the CPU fp32
    close = all(math.isclose(cpu_losses[s], want[s], rel_tol=rel) for s in (3, 4, 5))
    report.check(
        "resume",
        f"resumed on the CPU: losses 3-5 within {rel:g} (relative) of the device's",
        f"{max(abs(cpu_losses[s] - want[s]) for s in (3, 4, 5)):.1e}",
        close,
    )
    back = train.load_checkpoint(tmp / "resume-cpu")
    restored, _ = train.model_from_checkpoint(back, setup.device)
    cpu_model, _ = train.model_from_checkpoint(back, "cpu")
    with torch.no_grad():
        diff_back = float((restored(x.to(setup.device))[0].cpu() - cpu_model(x)[0]).abs().max())
    report.check(
        "resume",
        "CPU checkpoint back on the device: max logit difference",
        f"{diff_back:.1e}",
        diff_back < 1e-3,
    )
    return {
        "exact": exact,
        "cpu_close": close,
        "logit_diff_to_cpu": diff,
        "logit_diff_back": diff_back,
    }


def _resume_from_step_3(
    setup: Setup, tmp: pathlib.Path, name: str, flags: list[str]
) -> dict[int, float]:
    """A fresh Trainer, with every generator scrambled, resumes the uninterrupted run's step-3 checkpoint."""
    (tmp / name).mkdir()
    shutil.copy(train.checkpoint_path(tmp / "resume-whole", 3), tmp / name)
    scramble_generators()
    trainer_for(setup, tmp / name, *flags, "--resume").run()
    return _losses(tmp / name)


def _losses(out_dir: pathlib.Path) -> dict[int, float]:
    """The last loss logged per step (a resumed run rewrites the steps after its checkpoint)."""
    return {
        r["step"]: r["loss"]
        for r in train_run.read_metrics(out_dir / "metrics.jsonl")
        if "loss" in r and "event" not in r
    }


# ----------------------------------------------------------------------------------------------------------------
# 5. torchrun: every layout on N processes vs one process on the same device
# ----------------------------------------------------------------------------------------------------------------


def layout_config(world: int) -> model_lib.GPTConfig:
    """A GPT small enough to train in every layout many times, that `world` ranks can split every way: as many
    layers (pp) and heads (tp) as ranks, a vocabulary of 250 that needs padding for tensor parallel."""
    heads = max(4, world)
    return model_lib.GPTConfig(
        vocab_size=250,
        block_size=32,
        n_layer=max(2, world),
        n_head=heads,
        n_kv_head=heads,
        n_embd=64,
        ffn_hidden=128,
    )


LAYOUT_STEPS, LAYOUT_BATCH, LAYOUT_LR, LAYOUT_CLIP = 3, 16, 1e-2, 0.25


def layouts(world: int) -> list[dict]:
    """Every (dp, tp, pp, zero[, bf16]) that `world` ranks allow for the config and wiring.check_combination.

    >>> [(l["dp"], l["tp"], l["pp"], l["zero"]) for l in layouts(1)][:4]
    [(1, 1, 1, 0), (1, 1, 1, 1), (1, 1, 1, 2), (1, 1, 1, 3)]
    """
    config, out = layout_config(world), []
    for tp in (d for d in range(1, world + 1) if world % d == 0):
        for pp in (d for d in range(1, world // tp + 1) if (world // tp) % d == 0):
            if (
                config.n_head % tp
                or config.n_kv_head % tp
                or config.ffn_dim % tp
                or config.n_layer < pp
            ):
                continue
            dp = world // (tp * pp)
            if LAYOUT_BATCH % dp:
                continue
            for zero in (0, 1, 2, 3):
                try:
                    wiring.check_combination(zero, tp, pp)
                except parallel.ParallelError:
                    continue
                out.append(dict(dp=dp, tp=tp, pp=pp, zero=zero, bf16=False))
                if zero == 3:
                    out.append(dict(dp=dp, tp=tp, pp=pp, zero=3, bf16=True))
    return out


def _compare(got: dict, want: dict, start: dict, bf16: bool) -> dict:
    """fp32 layouts: every weight within rtol = atol = 2e-4 of the one-process run: fp32 sums in another order,
    amplified by Adam on near-zero gradients. Measured at tp 2 on gloo: 8.8e-5 with one matmul per layer, 1.3e-4
    with q/k/v and w1/w3 fused (other GEMM shapes, other roundings), and in float64 9.5e-6 for both alike (the
    vocabulary-parallel loss's fp32): the same math. bf16 gathers: each weight's movement over the steps within
    30% (relative norm) of the one-process movement (what tests/test_parallel.py measures)."""
    diff = max(float((got[k].float() - want[k]).abs().max()) for k in want)
    if bf16:
        worst = max(
            float(
                ((got[k].float() - start[k]) - (want[k] - start[k])).norm()
                / (want[k] - start[k]).norm()
            )
            for k in want
        )
        return {"max_diff": diff, "ok": worst < 0.3, "criterion": f"movement within {worst:.0%}"}
    ok = all(torch.allclose(got[k].float(), want[k], rtol=2e-4, atol=2e-4) for k in want)
    return {"max_diff": diff, "ok": ok, "criterion": "allclose 2e-4"}


def _layout_reference(device: torch.device, config: model_lib.GPTConfig) -> dict:
    """One process, the whole batch, fp32 AdamW: the weights every layout must reproduce."""
    torch.manual_seed(0)
    gpt = model_lib.GPT(config).to(device)
    opt = torch.optim.AdamW(train.param_groups(gpt, 0.1), lr=LAYOUT_LR)
    for x, y in _layout_batches(device, config):
        gpt(x, y)[1].backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), LAYOUT_CLIP)
        opt.step()
        opt.zero_grad()
    return {k: v.detach().float().cpu() for k, v in gpt.state_dict().items()}


def _layout_batches(device: torch.device, config: model_lib.GPTConfig):
    g = torch.Generator().manual_seed(1)
    shape = (LAYOUT_BATCH, config.block_size)
    return [
        (
            torch.randint(0, config.vocab_size, shape, generator=g).to(device),
            torch.randint(0, config.vocab_size, shape, generator=g).to(device),
        )
        for _ in range(LAYOUT_STEPS)
    ]


def layout_worker(out_path: str) -> int:
    """(run by torchrun) nccl on CUDA, gloo on CPU: every layout of this world vs the one-process reference."""
    rank, world, device = launcher.init_distributed(timeout_s=120)
    backend, config = torch.distributed.get_backend(), layout_config(world)
    want = _layout_reference(device, config)
    torch.manual_seed(0)
    start = {k: v.float().cpu() for k, v in model_lib.GPT(config).state_dict().items()}
    results = []
    for lay in layouts(world):
        torch.manual_seed(0)
        gpt = model_lib.GPT(config).to(device)
        opt = torch.optim.AdamW(train.param_groups(gpt, 0.1), lr=LAYOUT_LR)
        mesh = parallel.Mesh.build(dp=lay["dp"], tp=lay["tp"], pp=lay["pp"])
        mixed = dict(compute_dtype=torch.bfloat16) if lay["bf16"] else {}
        model, optim = wiring.parallelize(gpt, opt, mesh, zero=lay["zero"], **mixed)
        for x, y in _layout_batches(device, config):
            xs, ys = x.chunk(mesh.dp.size)[mesh.dp.rank], y.chunk(mesh.dp.size)[mesh.dp.rank]
            if model.pipelined:
                model.pipeline_step(list(zip(xs.chunk(2), ys.chunk(2))))
            else:
                model(xs, ys)[1].backward()
                model.finish_gradient_sync()
            model.clip_grad_norm_(LAYOUT_CLIP)
            optim.step()
            optim.zero_grad()
        got = model.full_state_dict()
        results.append({**lay, **_compare(got, want, start, lay["bf16"])})
    if (
        world == 1
    ):  # the pipeline executor with one stage: its schedule, loss and backward on this device
        torch.manual_seed(0)
        gpt = model_lib.GPT(config).to(device)
        pipe = model_parallel.PipelineParallel(gpt, parallel.Mesh.build(), "1f1b")
        x, y = _layout_batches(device, config)[0]
        loss = pipe.step(x, y, micro_batches=4)
        torch.manual_seed(0)
        plain = model_lib.GPT(config).to(device)
        diff = abs(float(loss) - float(plain(x, y)[1]))
        results.append(
            {
                "dp": 1,
                "tp": 1,
                "pp": 1,
                "zero": 0,
                "bf16": False,
                "pipeline_executor": True,
                "max_diff": diff,
                "ok": diff < 1e-4 and loss.device == device,
                "criterion": f"loss within 1e-4, on {loss.device}",
            }
        )
    if rank == 0:
        pathlib.Path(out_path).write_text(
            json.dumps(
                {"world": world, "backend": backend, "device": str(device), "layouts": results}
            )
        )
    torch.distributed.destroy_process_group()
    return 0


def run_worker(
    section: str, n: int, flag: str, path: pathlib.Path, setup: Setup, report: Report
) -> tuple[dict | None, float]:
    """This script's `flag` worker on n ranks under torchrun: (the JSON it wrote, seconds), or (None,
    seconds) after a FAIL row when torchrun failed."""
    proc, seconds = torchrun(n, pathlib.Path(__file__).resolve(), [flag, str(path)], setup, 300)
    if proc.returncode != 0 or not path.exists():
        report.check(
            section, f"N={n}: torchrun exited {proc.returncode}", _tail(proc, 3)[:60], False
        )
        return None, seconds
    return json.loads(path.read_text()), seconds


def bench_torchrun(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    out = {}
    for n in setup.nproc:
        result, seconds = run_worker(
            "torchrun", n, "--layout-worker", tmp / f"torchrun-{n}.json", setup, report
        )
        if result is None:
            continue
        want_backend = "nccl" if setup.cuda else "gloo"
        report.check(
            "torchrun",
            f"N={n}: process group backend, device of rank 0",
            f"{result['backend']}, {result['device']}",
            result["backend"] == want_backend,
        )
        for lay in result["layouts"]:
            name = (
                "pipeline executor, 1 stage"
                if lay.get("pipeline_executor")
                else f"dp{lay['dp']} tp{lay['tp']} pp{lay['pp']} ZeRO-{lay['zero']}"
                + (" bf16" if lay["bf16"] else "")
            )
            report.check(
                "torchrun",
                f"N={n}: {name} vs one process ({lay['criterion']})",
                f"{lay['max_diff']:.1e}",
                lay["ok"],
            )
        report.add("torchrun", f"N={n}: wall time, s", seconds)
        out[n] = result
    return out


def torchrun(n: int, script: pathlib.Path, args: list[str], setup: Setup, timeout_s: float):
    """`torchrun --standalone --nproc_per_node=n script args...` -> (CompletedProcess, seconds). --smoke hides any
    GPU so the ranks join over gloo on the CPU. A run past `timeout_s` is ended with its workers (end_process_tree:
    torchrun starts each worker in a session of its own) and reported as exit code 124."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        str(script),
        *args,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if not setup.cuda:
        env["CUDA_VISIBLE_DEVICES"] = ""
    start = time.perf_counter()
    proc, _ = run_bounded(cmd, timeout_s, env=env, capture=True)
    return proc, time.perf_counter() - start


# A child that outlives its limit gets SIGTERM (torchrun passes it on to its workers and waits for them), then,
# after this grace, SIGKILL: it, its process group and every process it started, wherever they went.
TERM_GRACE_S = 10.0


def run_bounded(
    cmd: list[str], timeout_s: float, env: dict | None = None, capture: bool = False
) -> tuple[subprocess.CompletedProcess, bool]:
    """Run cmd in a session (and process group) of its own -> (its CompletedProcess, whether it ran past
    timeout_s). Past timeout_s it and everything it started are ended (end_process_tree); its exit code is then
    124 and what it printed until then comes back. capture: its stdout and stderr come back as text; else it
    writes to ours."""
    pipe = subprocess.PIPE if capture else None
    with subprocess.Popen(
        cmd, env=env, stdout=pipe, stderr=pipe, text=True, start_new_session=True
    ) as child:
        try:
            out, err = child.communicate(timeout=timeout_s)
            return subprocess.CompletedProcess(cmd, child.returncode, out, err), False
        except subprocess.TimeoutExpired:
            end_process_tree(child.pid)
            out, err = child.communicate()
            note = f"stopped after {timeout_s:.0f} s"
            return subprocess.CompletedProcess(
                cmd, 124, out, f"{err or ''}{note}" if capture else note
            ), True


def descendants(pid: int) -> list[int]:
    """Every process below pid (its children, theirs, ...), read from /proc (Linux); [] without /proc."""
    children: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").glob("[0-9]*"):
        try:
            # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses, so split after the last ')'
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (
            OSError,
            ValueError,
            IndexError,
        ):  # it exited while we read, or not a process folder
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    """pid exists and is not a zombie (a dead process its parent has not reaped yet)."""
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def end_process_tree(pid: int, grace_s: float | None = None) -> None:
    """SIGTERM to pid's process group and to the group of every process below it (torchrun's workers each lead
    their own), then, for whatever is still alive after grace_s, SIGKILL to the same groups and processes. The
    tree is read again before each signal: what it started meanwhile is ended too, and what lost its parent to
    the first signal is still known by its group."""
    grace_s = TERM_GRACE_S if grace_s is None else grace_s
    known: set[int] = set()
    groups: set[int] = set()
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        known |= {pid, *descendants(pid)}
        for p in known:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                groups.add(os.getpgid(p))
        groups.discard(os.getpgrp())  # never our own group (a child that joined it)
        for group in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(group, sig)
        for p in known:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(p, sig)
        stop = time.monotonic() + wait_s
        while time.monotonic() < stop and any(alive(p) for p in known):
            time.sleep(0.1)
        if not any(alive(p) for p in known):
            return


def _tail(proc: subprocess.CompletedProcess, lines: int = 2) -> str:
    """The last lines a failed run printed (its error), for a table cell."""
    text = (proc.stderr or "").strip() or (proc.stdout or "").strip()
    return " | ".join(text.splitlines()[-lines:])[-120:]


# ----------------------------------------------------------------------------------------------------------------
# 6. train.py itself under torchrun: train, checkpoint, resume, a forced spike-guard rollback, samples
# ----------------------------------------------------------------------------------------------------------------

# 20 steps with checkpoints at 10 and 20: the spike guard judges a loss only once it knows 10 good ones
# (SpikeGuard's min_history), so the rollback run resumes at step 10 with a full history.
RUN_STEPS, RUN_CKPT = 20, 10
# The forced rollback: resume at step 10 with --lr 1 (the largest train.py accepts): AdamW moves every weight by
# ~0.5 in one step, the next loss is several times the median (measured on the CPU: 32.8 against a median of
# 8.2), and --spike-patience 1 rolls back at that first spike, to the step-10 checkpoint, with the lr scaled by
# 1e-3 (back to ~1e-3) for the rest of the run. train.py has no flag that injects a spike; this uses only its own.
ROLLBACK_FLAGS = ["--lr", "1", "--spike-patience", "1", "--rollback-lr-factor", "1e-3"]


def run_flags(setup: Setup, zero: int, out_dir: pathlib.Path) -> list[str]:
    """train.py's flags for one run of this section: a small GPT, bf16 autocast, --zero, eval and checkpoints at
    steps 10 and 20, two samples at the end; on a GPU --compile (README's multi-GPU flags)."""
    return [
        "--data",
        "pydocs",
        "--model",
        "tiny",
        "--model-args",
        setup.run_model_args,
        "--device",
        setup.device.type,
        "--dtype",
        "bf16",
        "--zero",
        str(zero),
        "--batch-size",
        str(setup.run_batch),
        "--block-size",
        str(setup.run_block),
        "--max-steps",
        str(RUN_STEPS),
        "--eval-interval",
        str(RUN_CKPT),
        "--ckpt-interval",
        str(RUN_CKPT),
        "--keep-checkpoints",
        "5",
        "--warmup-steps",
        "2",
        "--eval-batches",
        "2",
        "--num-samples",
        "2",
        "--sample-tokens",
        "16",
        "--log-interval",
        "5",
        "--out-dir",
        str(out_dir),
    ] + (["--compile"] if setup.run_compile else [])


def read_run(out_dir: pathlib.Path, proc: subprocess.CompletedProcess) -> dict:
    """What one train.py run left: its losses by step, evaluations, events, checkpoints and printed samples."""
    records = (
        train_run.read_metrics(out_dir / "metrics.jsonl")
        if (out_dir / "metrics.jsonl").exists()
        else []
    )
    return {
        "exit": proc.returncode,
        "losses": _losses(out_dir) if records else {},
        "evals": {r["step"]: r["val_loss"] for r in records if "val_loss" in r},
        "events": [r for r in records if "event" in r],
        "checkpoints": sorted(int(p.stem.split("_")[1]) for p in train.list_checkpoints(out_dir)),
        "samples": proc.stdout.count("--- sample "),
        "bf16": " bfloat16 | " in proc.stdout,
    }  # the summary line: "| cuda bfloat16 |"


def bench_train_runs(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    """For every world size and ZeRO stage: train (eval, checkpoints, samples), resume from step 10 in a fresh
    process (the losses of steps 10-19 again), and resume with a forced spike that the guard rolls back."""
    optimizer = train.make_optimizer(
        torch.nn.Linear(2, 2).to(setup.device), train.TrainConfig(), setup.device.type
    )
    report.check(
        "train.py",
        f"train.py's AdamW on {setup.device.type} is the fused kernel",
        f"fused={optimizer.defaults['fused']}",
        optimizer.defaults["fused"] is True,
    )
    script, out = ROOT / "train.py", {}
    tol = 5e-3 if setup.cuda else 1e-6  # bf16 atomics on a GPU; a CPU repeats bit for bit
    for n in setup.run_nproc:
        for zero in setup.run_zero:
            tag, base = f"N={n} ZeRO-{zero}", tmp / f"run-{n}-{zero}"
            row = out[f"{n}/{zero}"] = {}
            first = base / "train"
            proc, seconds = torchrun(
                n, script, run_flags(setup, zero, first), setup, setup.run_timeout_s
            )
            a = row["train"] = read_run(first, proc)
            steps = sorted(a["losses"])
            trained = (
                proc.returncode == 0
                and steps == list(range(RUN_STEPS))
                and a["bf16"]
                and all(math.isfinite(v) for v in a["losses"].values())
            )
            report.check(
                "train.py",
                f"{tag}: train {RUN_STEPS} steps in bf16, exit 0, loss first -> last",
                f"{a['losses'][0]:.3f} -> {a['losses'][steps[-1]]:.3f}"
                if trained
                else f"exit {proc.returncode}: {_tail(proc)}",
                trained and a["losses"][RUN_STEPS - 1] < a["losses"][0],
            )
            if proc.returncode != 0:
                continue  # resume and rollback need this run's checkpoint
            report.check(
                "train.py",
                f"{tag}: evaluations at 0, 10, 20; checkpoints 10, 20; 2 samples",
                f"{sorted(a['evals'])}, {a['checkpoints']}, {a['samples']}",
                sorted(a["evals"]) == [0, RUN_CKPT, RUN_STEPS]
                and a["checkpoints"] == [RUN_CKPT, RUN_STEPS]
                and a["samples"] == 2,
            )
            report.add(
                "train.py", f"{tag}: train run wall time (torchrun, start-up included), s", seconds
            )
            for kind, extra in (("resume", []), ("rollback", ROLLBACK_FLAGS)):
                where = base / kind
                where.mkdir(parents=True)
                shutil.copy(train.checkpoint_path(first, RUN_CKPT), where)
                proc, seconds = torchrun(
                    n,
                    script,
                    run_flags(setup, zero, where) + ["--resume", *extra],
                    setup,
                    setup.run_timeout_s,
                )
                r = row[kind] = read_run(where, proc)
                if proc.returncode != 0:
                    report.check(
                        "train.py",
                        f"{tag}: {kind} from step {RUN_CKPT}",
                        f"exit {proc.returncode}: {_tail(proc)}",
                        False,
                    )
                    continue
                if kind == "resume":
                    worst = max(
                        (
                            abs(r["losses"].get(s, math.inf) - a["losses"][s])
                            for s in range(RUN_CKPT, RUN_STEPS)
                        ),
                        default=math.inf,
                    )
                    report.check(
                        "train.py",
                        f"{tag}: resumed in a new process: losses 10-19 within {tol:g}",
                        f"{worst:.1e}",
                        worst <= tol and r["samples"] == 2,
                    )
                else:
                    back = [e for e in r["events"] if e["event"] == "rollback"]
                    skipped = [e for e in r["events"] if e["event"] == "skipped_batch"]
                    done = RUN_STEPS - 1 in r["losses"] and math.isfinite(
                        r["losses"][RUN_STEPS - 1]
                    )
                    report.check(
                        "train.py",
                        f"{tag}: forced spike -> rollback to step {RUN_CKPT}, then 20 steps, "
                        "2 samples",
                        f"{len(skipped)} skipped, to step "
                        f"{[e['to_step'] for e in back]}, loss {r['losses'].get(RUN_STEPS - 1, math.nan):.3f}",
                        bool(back)
                        and all(e["to_step"] == RUN_CKPT for e in back)
                        and bool(skipped)
                        and done
                        and r["samples"] == 2,
                    )
                report.add("train.py", f"{tag}: {kind} run wall time, s", seconds)
    return out


# ------------------------------------------------------------------------------------------------
# 7. The collective probe: every collective train.py uses, on a process group of one GPU
# ------------------------------------------------------------------------------------------------


def bench_nccl(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    """A world-1 nccl group (gloo on --smoke) runs each collective train.py calls, through
    torch.distributed itself: parallel.Comm short-circuits a group of one, so no other section at
    world 1 reaches nccl. With one rank each result is known: a sum, max or gather of one is the
    tensor itself. Seconds, mostly nccl's init."""
    import torch.distributed as dist

    backend = "nccl" if setup.cuda else "gloo"
    dist.init_process_group(
        backend,
        init_method=(tmp / "nccl").as_uri(),
        rank=0,
        world_size=1,
        **({"device_id": setup.device} if setup.cuda else {}),
    )
    out = {}
    try:
        t = torch.arange(1.0, 9.0, device=setup.device)
        patient = dist.new_group(backend="gloo")
        x = torch.empty_like(t)  # each probe writes its result here (or returns it)
        probes = {
            "all_reduce sum (gradients, losses)": lambda: dist.all_reduce(x.copy_(t)),
            "all_reduce max (vocab-parallel loss)": lambda: dist.all_reduce(
                x.copy_(t), dist.ReduceOp.MAX
            ),
            "reduce_scatter (ZeRO gradients)": lambda: parallel._reduce_scatter_flat(x, t),
            "all_gather (ZeRO-3 weights)": lambda: parallel._all_gather_flat(x, t),
            "all_to_all_single (expert parallel)": lambda: dist.all_to_all_single(x, t),
            "broadcast (initial weights)": lambda: dist.broadcast(x.copy_(t), src=0),
            "all_gather_object (pipeline state)": lambda: _gathered_object(dist, t),
            "barrier on the patient gloo group": lambda: (dist.barrier(group=patient), x.copy_(t))[
                1
            ],
        }
        for name, probe in probes.items():
            start = time.perf_counter()
            try:
                x.zero_()
                got = probe()
                got = got if torch.is_tensor(got) else x
                sync(setup.device)
                ok = bool(torch.equal(got.cpu(), t.cpu()))
                value = f"{time.perf_counter() - start:.3f} s"
            except Exception as e:  # noqa: BLE001 - one collective's failure is one FAIL row
                ok, value = False, f"{type(e).__name__}: {e}"[:60]
            report.check("nccl", f"{backend} world 1: {name}", value, ok)
            out[name] = ok
    finally:
        dist.destroy_process_group()
    out.update(probe_two_ranks(setup, report, tmp))
    return out


# What each rank r of a world of n holds and what every collective must then give, known in advance: rank r's
# tensor is r * 100 + [0, 1, ..., 2n - 1] (floats, exact in any dtype that counts to 1,000).
def _probe_tensor(rank: int, n: int, device) -> torch.Tensor:
    return rank * 100 + torch.arange(2.0 * n, device=device)


def probe_worker(out_path: str) -> int:
    """(run by torchrun) every collective train.py's layouts use, on `world` ranks of nccl (gloo on the CPU),
    each against the result known from _probe_tensor; send/recv as context parallel's ring posts it (a batch of
    isend and irecv to the two neighbours). Rank 0 writes {name: ok}."""
    import torch.distributed as dist

    rank, n, device = launcher.init_distributed(timeout_s=120)
    mine, every = _probe_tensor(rank, n, device), [_probe_tensor(r, n, device) for r in range(n)]
    total = sum(every)
    results = {}
    out = mine.clone()
    dist.all_reduce(out)
    results["all_reduce sum"] = torch.equal(out, total)
    out = torch.empty(2, device=device)
    parallel._reduce_scatter_flat(out, mine.clone())
    results["reduce_scatter"] = torch.equal(out, total[2 * rank : 2 * rank + 2])
    out = torch.empty(2 * n * n, device=device)
    parallel._all_gather_flat(out, mine)
    results["all_gather"] = torch.equal(out, torch.cat(every))
    out = torch.empty_like(mine)
    dist.all_to_all_single(out, mine)  # rank r gets piece r (2 numbers) of every rank
    results["all_to_all_single"] = torch.equal(
        out, torch.cat([t[2 * rank : 2 * rank + 2] for t in every])
    )
    if n > 1:
        out = torch.empty_like(mine)
        ops = [
            dist.P2POp(dist.isend, mine, (rank + 1) % n),
            dist.P2POp(dist.irecv, out, (rank - 1) % n),
        ]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        results["send/recv (the ring's batch_isend_irecv)"] = torch.equal(
            out, every[(rank - 1) % n]
        )
    checked = torch.tensor([all(results.values())], dtype=torch.float32, device=device)
    dist.all_reduce(checked, dist.ReduceOp.MIN)  # every rank's results, not only rank 0's
    if rank == 0:
        pathlib.Path(out_path).write_text(
            json.dumps(
                {
                    "world": n,
                    "backend": dist.get_backend(),
                    "results": results,
                    "all_ranks_ok": bool(checked),
                }
            )
        )
    dist.destroy_process_group()
    return 0


def probe_two_ranks(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    """The probe on 2 ranks under torchrun, where 2 ranks exist (2 GPUs; gloo on --smoke): send/recv needs a
    peer (torch refuses a send to oneself), and the collectives then move data between processes."""
    if max(setup.nproc) < 2:
        report.add("nccl", "2 ranks: send/recv and collectives between processes", "not run: 1 GPU")
        return {}
    path = tmp / "probe-2.json"
    proc, seconds = torchrun(
        2, pathlib.Path(__file__).resolve(), ["--probe-worker", str(path)], setup, 180
    )
    if proc.returncode != 0 or not path.exists():
        report.check(
            "nccl", f"2 ranks: torchrun exited {proc.returncode}", _tail(proc, 3)[:60], False
        )
        return {"2 ranks": False}
    result = json.loads(path.read_text())
    for name, ok in result["results"].items():
        report.check(
            "nccl",
            f"{result['backend']} world 2: {name} (every rank)",
            f"{seconds:.1f} s",
            ok and result["all_ranks_ok"],
        )
    return {
        f"2 ranks: {name}": ok and result["all_ranks_ok"] for name, ok in result["results"].items()
    }


def _gathered_object(dist, t: torch.Tensor) -> torch.Tensor:
    parts = [None]
    dist.all_gather_object(parts, {"t": t.cpu()})
    return parts[0]["t"]


# ----------------------------------------------------------------------------------------------------------------
# 8. Kernels: the hand FlashAttention, linear and hybrid layers, MoE on the device, each against its reference path
# ----------------------------------------------------------------------------------------------------------------

# q, k, v of the kernel checks (B, h, T, d): a long sequence on a GPU; on --smoke's CPU, small.
KERNEL_SHAPE = {"cuda": (2, 8, 2048, 64), "cpu": (1, 2, 256, 16)}
# The models of the kernel checks: a few layers of each kind on the device vs the same weights on the CPU.
KERNEL_MODELS = {
    "flash attention": dict(attention="flash"),
    "linear attention": dict(layer_pattern="L"),
    "hybrid LLLA": dict(layer_pattern="LLLA"),
    "MoE, 4 experts top-2": dict(n_expert=4, expert_top_k=2, moe_capacity_factor=0.0),
}


def relative_difference(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|, in float64: one number per tensor, in the reference's own scale."""
    got, want = (t.detach().double().cpu() for t in (got, want))
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30))


def output_and_grads(attend, q, k, v, d_out, dtype: torch.dtype) -> list[torch.Tensor]:
    """[attend(q, k, v), dq, dk, dv] with the inputs cast to dtype and the output's gradient d_out."""
    leaves = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    out = attend(*leaves)
    return [out.detach(), *torch.autograd.grad(out, leaves, d_out.to(dtype))]


def check_flash_kernel(setup: Setup, report: Report) -> dict:
    """model.flash_attention against SDPA on the device: fp32 equal (output and gradients); bf16 no less accurate
    than SDPA against a float64 reference of the same bf16 inputs (the kernel sums in fp32); compiled (one custom
    operator in the graph) equal to eager."""
    B, H, T, D = KERNEL_SHAPE[setup.device.type]
    gen = torch.Generator().manual_seed(0)
    q, k, v, d_out = (torch.randn(B, H, T, D, generator=gen).to(setup.device) for _ in range(4))
    fused = lambda *qkv: torch.nn.functional.scaled_dot_product_attention(*qkv, is_causal=True)  # noqa: E731
    by_hand = lambda *qkv: model_lib.flash_attention(*qkv, True)  # noqa: E731
    worst = max(
        map(
            relative_difference,
            output_and_grads(by_hand, q, k, v, d_out, torch.float32),
            output_and_grads(fused, q, k, v, d_out, torch.float32),
        )
    )
    report.check(
        "kernels",
        f"hand flash = SDPA, fp32, T={T}: out, dq, dk, dv (max rel. diff < 1e-4)",
        f"{worst:.1e}",
        worst < 1e-4,
    )
    q, k, v, d_out = (t.to(torch.bfloat16) for t in (q, k, v, d_out))
    want = output_and_grads(fused, q, k, v, d_out, torch.float64)
    errors = {}
    for name, attend in (("sdpa", fused), ("flash", by_hand)):
        got = output_and_grads(attend, q, k, v, d_out, torch.bfloat16)
        errors[name] = max(float((g.double() - w).norm() / w.norm()) for g, w in zip(got, want))
    ratio = errors["flash"] / errors["sdpa"]
    report.check(
        "kernels",
        f"hand flash, bf16, T={T}: error vs float64 / SDPA's (<= 1.5)",
        f"{ratio:.2f}",
        ratio <= 1.5,
    )
    compiled = torch.compile(by_hand, backend=setup.compile_backend, fullgraph=True, dynamic=False)
    q, k, v, d_out = (t.float() for t in (q, k, v, d_out))
    worst_compiled = max(
        map(
            relative_difference,
            output_and_grads(compiled, q, k, v, d_out, torch.float32),
            output_and_grads(by_hand, q, k, v, d_out, torch.float32),
        )
    )
    report.check(
        "kernels",
        f"hand flash compiled ({setup.compile_backend}) = eager (max rel. diff < 1e-6)",
        f"{worst_compiled:.1e}",
        worst_compiled < 1e-6,
    )
    return {
        "fp32_max_rel_diff": worst,
        "bf16_errors": errors,
        "bf16_ratio": ratio,
        "compiled_max_rel_diff": worst_compiled,
    }


def check_linear_forms(setup: Setup, report: Report) -> float:
    """Linear attention's chunked form (training) against its token-by-token form (generation), on the device."""
    B, H, T, D = KERNEL_SHAPE[setup.device.type]
    T = min(T, 256)  # the recurrent form is T Python steps
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(B, H, T, D, generator=gen).to(setup.device) / D**0.5 for _ in range(3))
    log_a = torch.nn.functional.logsigmoid(torch.randn(B, H, T, generator=gen) + 3).to(setup.device)
    chunked, state_c = model_lib.linear_attention_chunked(q, k, v, log_a)
    recurrent, state_r = model_lib.linear_attention_recurrent(q, k, v, log_a)
    worst = max(relative_difference(chunked, recurrent), relative_difference(state_c, state_r))
    report.check(
        "kernels",
        f"linear attention chunked = recurrent, T={T}: outputs, state (< 1e-4)",
        f"{worst:.1e}",
        worst < 1e-4,
    )
    return worst


def check_kernel_models(setup: Setup, report: Report) -> dict:
    """A GPT of each kind (flash, linear, hybrid, MoE): loss, logits and every gradient on the device (fp32)
    against the same weights in float64 on the CPU; the flash one also against the SDPA model on the device."""
    wide = setup.cuda
    base = dict(
        vocab_size=512,
        block_size=256 if wide else 64,
        n_layer=4,
        n_head=8 if wide else 4,
        n_kv_head=2,
        n_embd=256 if wide else 64,
    )
    gen = torch.Generator().manual_seed(2)
    x, y = (torch.randint(0, 512, (2, base["block_size"]), generator=gen) for _ in range(2))
    out = {}
    for name, extra in KERNEL_MODELS.items():
        runs = {}
        for where, device, dtype, attention in (
            ("device", setup.device, torch.float32, None),
            ("cpu", torch.device("cpu"), torch.float64, None),
            ("sdpa", setup.device, torch.float32, "sdpa"),
        ):
            if where == "sdpa" and "attention" not in extra:
                continue
            torch.manual_seed(0)
            config = model_lib.GPTConfig(
                **{**base, **extra, **({"attention": attention} if attention else {})}
            )
            gpt = model_lib.GPT(config).to(device, dtype)
            logits, loss = gpt(x.to(device), y.to(device))
            (loss + config.moe_aux_coef * gpt.aux_loss).backward()
            runs[where] = [loss, logits] + [p.grad for p in gpt.parameters()]
        for against in [w for w in ("cpu", "sdpa") if w in runs]:
            worst = max(relative_difference(a, b) for a, b in zip(runs["device"], runs[against]))
            what = "float64 on the CPU" if against == "cpu" else "SDPA's model"
            report.check(
                "kernels",
                f"GPT, {name}, on {setup.device.type} = {what}: loss, logits, grads (< 1e-4)",
                f"{worst:.1e}",
                worst < 1e-4,
            )
            out[f"{name} vs {against}"] = worst
    return out


def bench_kernels(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    return {
        "flash": check_flash_kernel(setup, report),
        "linear_forms": check_linear_forms(setup, report),
        "models": check_kernel_models(setup, report),
    }


# ----------------------------------------------------------------------------------------------------------------
# 9. --ep and --cp under torchrun: one training step against one process on the same device
# ----------------------------------------------------------------------------------------------------------------

EP_CP_MODELS = {
    "ep": dict(
        vocab_size=64,
        block_size=32,
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        n_embd=32,
        ffn_hidden=32,
        n_expert=4,
        expert_top_k=2,
        moe_capacity_factor=0.0,
    ),
    "cp": dict(
        vocab_size=64, block_size=32, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=64
    ),
}
EP_CP_BATCH = 4


def _ep_cp_step(config: model_lib.GPTConfig, device: torch.device, ep: int = 1, cp: int = 0):
    """One SGD step of a GPT on the fixed batch -> (loss over the whole batch, full weights after the step): one
    process (cp = 0), or this rank's part of the world with experts over ep ranks or the sequence over cp."""
    torch.manual_seed(0)
    gpt = model_lib.GPT(config).to(device)
    opt = torch.optim.SGD(gpt.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(3)
    x, y = (
        torch.randint(0, config.vocab_size, (EP_CP_BATCH, config.block_size), generator=gen).to(
            device
        )
        for _ in range(2)
    )
    if not cp:
        _, loss = gpt(x, y)
        (loss + config.moe_aux_coef * gpt.aux_loss).backward()
        opt.step()
        return float(loss.detach()), {
            k: v.detach().float().cpu() for k, v in gpt.state_dict().items()
        }
    mesh = parallel.Mesh.build(cp=cp)
    model, optim = wiring.parallelize(gpt, opt, mesh, ep=ep)
    x, y = x.chunk(mesh.dp.size)[mesh.dp.rank], y.chunk(mesh.dp.size)[mesh.dp.rank]
    _, loss = model(x, y)
    (loss + config.moe_aux_coef * gpt.aux_loss).backward()
    model.finish_gradient_sync()
    optim.step()
    total = (
        loss.detach().reshape(1) / mesh.dp.size
    )  # the mean over dp (cp ranks hold the same loss)
    torch.distributed.all_reduce(total)
    return float(total) / (mesh.world // mesh.dp.size), model.full_state_dict()


def ep_cp_worker(out_path: str) -> int:
    """(run by torchrun) experts over every rank (--ep world) and the sequence over every rank (--cp world),
    each against one process on this device; rank 0 writes the results. At world 1 only --cp 1 (the dense model
    through parallelize in a process group of one): model_parallel refuses a MoE model without an expert split
    ("tensor parallel splits the dense SwiGLU", even at tp 1), and --ep 1 splits nothing."""
    rank, world, device = launcher.init_distributed(timeout_s=120)
    results = []
    for kind, ep, cp in [("ep", world, 1)] * (world > 1) + [("cp", 1, world)]:
        config = model_lib.GPTConfig(**EP_CP_MODELS[kind])
        want_loss, want = _ep_cp_step(config, device)
        loss, got = _ep_cp_step(config, device, ep=ep, cp=cp)
        diff = max(float((got[k].float() - want[k]).abs().max()) for k in want)
        ok = abs(loss - want_loss) <= 1e-5 * abs(want_loss) and all(
            torch.allclose(got[k].float(), want[k], rtol=1e-4, atol=1e-5) for k in want
        )
        results.append(
            {
                "layout": f"--{kind} {world}",
                "loss": loss,
                "want_loss": want_loss,
                "max_diff": diff,
                "ok": ok,
            }
        )
    if rank == 0:
        pathlib.Path(out_path).write_text(
            json.dumps({"world": world, "device": str(device), "results": results})
        )
    torch.distributed.destroy_process_group()
    return 0


def bench_ep_cp(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    """--ep and --cp at world 1 and, where the ranks exist (2 GPUs; gloo on --smoke), 2."""
    out = {}
    for n in sorted({1, min(2, max(setup.nproc))}):
        result, seconds = run_worker(
            "ep_cp", n, "--ep-cp-worker", tmp / f"ep-cp-{n}.json", setup, report
        )
        if result is None:
            continue
        for r in result["results"]:
            report.check(
                "ep_cp",
                f"N={n}: {r['layout']} on {result['device']} = one process: loss, weights after "
                "an SGD step (1e-4)",
                f"{r['max_diff']:.1e}",
                r["ok"],
            )
        report.add("ep_cp", f"N={n}: wall time, s", seconds)
        out[n] = result
    return out


# ----------------------------------------------------------------------------------------------------------------
# 10. Ablation: what each of the GPU step's changes is worth (opt-in: --only ablation)
# ----------------------------------------------------------------------------------------------------------------

# Each variant switches off one change of model.py's GPU step, or all three (the step as it was before them). A
# variant is (fused q/k/v and w1/w3 matmuls, the bf16 residual stream, the SDPA backend forced or None: the
# dispatcher's own choice). torch.compile traces under the switches, so each compiled variant compiles anew.
ABLATIONS = {
    "all on": (True, True, None),
    "separate q/k/v and w1/w3 matmuls": (False, True, None),
    "fp32 residual stream": (True, False, None),
    "SDPA forced: FlashAttention-2": (True, True, "FLASH_ATTENTION"),
    "SDPA forced: cuDNN": (True, True, "CUDNN_ATTENTION"),
    "all off (before this change)": (False, False, "FLASH_ATTENTION"),
}


def separate_linears(x: torch.Tensor, *linears: torch.nn.Module) -> tuple[torch.Tensor, ...]:
    """model.fused_linear switched off: one matmul per layer, each through its own forward (the code before)."""
    return tuple(linear(x) for linear in linears)


def fp32_stream(gpt: model_lib.GPT) -> None:
    """The bf16 residual stream switched off: the first block gets the stream in fp32, and `x + update` keeps it
    fp32 from there (RMSNorm returns its input's dtype): the residual stream and the norms' outputs of before."""
    gpt.blocks[0].register_forward_pre_hook(lambda block, args: (args[0].float(), *args[1:]))


@contextlib.contextmanager
def ablated(fused: bool, sdpa: str | None):
    """model.fused_linear and the SDPA backends as a variant has them, restored on leaving."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    original = model_lib.fused_linear
    model_lib.fused_linear = original if fused else separate_linears
    try:
        with sdpa_kernel(getattr(SDPBackend, sdpa)) if sdpa else contextlib.nullcontext():
            yield
    finally:
        model_lib.fused_linear = original


def sdpa_choice(config: model_lib.GPTConfig, setup: Setup) -> str:
    """The backend PyTorch's dispatcher picks for the model's attention call (torch._fused_sdp_choice, the
    function SDPA itself asks): causal, (B, heads, T, d) in the setting's compute dtype, as if training."""
    from torch.nn.attention import SDPBackend

    dtype = LOW_PRECISION.get(setup.dtype, torch.float32)
    shape = (setup.batch_size, config.n_head, setup.block_size, config.head_dim)
    q = torch.zeros(shape, device=setup.device, dtype=dtype, requires_grad=True)
    kv = torch.zeros(
        shape[0], config.n_kv_head, *shape[2:], device=setup.device, dtype=dtype, requires_grad=True
    )
    gqa = config.n_kv_head != config.n_head
    return SDPBackend(torch._fused_sdp_choice(q, kv, kv, is_causal=True, enable_gqa=gqa)).name


def ablation_step(trainer: train_run.Trainer, variant: tuple, backend: str | None):
    """The minimal loop (reference_step_fn's) on a fresh model with the variant's residual stream; run it inside
    ablated(...) for the rest of the variant."""
    fused, bf16_stream, sdpa = variant
    torch.manual_seed(trainer.cfg.seed)
    gpt = model_lib.GPT(trainer.model_config).to(trainer.device)
    if not bf16_stream:
        fp32_stream(gpt)
    opt = train.make_optimizer(gpt, trainer.cfg, trainer.device.type)
    forward = torch.compile(gpt, backend=backend) if backend else gpt
    loader = trainer.data.iterator(
        "train", trainer.cfg.batch_size, trainer.block_size, seed=trainer.cfg.seed
    )

    def step():
        x, y = (t.to(trainer.device, non_blocking=True) for t in loader.next())
        with train.autocast(trainer.device, trainer.dtype):
            _, loss = forward(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def bench_ablation(setup: Setup, report: Report, tmp: pathlib.Path) -> dict:
    """Tokens/s and MFU of the minimal loop with each change on and off, eager and compiled, in one process: what
    each is worth on this device. A variant the device cannot run (cuDNN attention off CUDA, or a forced backend
    that raises: "No available kernel") is a row saying so, and the next variant runs."""
    trainer = trainer_for(setup, tmp / "ablation")
    tokens, peak = trainer.tokens_per_step, trainer._peak
    choice = sdpa_choice(trainer.model_config, setup)
    report.add("ablation", "SDPA backend the dispatcher picks (all on)", choice)
    out = {"sdpa_choice": choice, "peak_flops": peak}
    for compiled in (False, True):
        tag = "compiled" if compiled else "eager"
        for name, variant in ABLATIONS.items():
            if variant[2] == "CUDNN_ATTENTION" and not setup.cuda:
                report.add("ablation", f"{tag}, {name}", "n/a: no CUDA")
                continue
            torch._dynamo.reset()  # a fresh trace under this variant's switches
            try:
                with ablated(variant[0], variant[2]):
                    backend = setup.compile_backend if compiled else None
                    step = ablation_step(trainer, variant, backend)
                    seconds = time_loop(step, setup.device, setup.warmup, setup.steps)
            except RuntimeError as e:  # a forced SDPA backend this GPU, dtype or cuDNN cannot run
                why = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                report.add("ablation", f"{tag}, {name}", f"n/a: {why[:60]}")
                continue
            finally:  # the variant's model and optimizer go before the next one's
                step = None
                _free(setup.device)
            mfu = tokens / seconds * trainer._flops_per_token / peak if peak else None
            value = f"{tokens / seconds:,.0f} tokens/s, MFU " + (f"{mfu:.1%}" if mfu else "n/a")
            report.add("ablation", f"{tag}, {name}", value)
            out[f"{tag}, {name}"] = {"tokens_per_s": tokens / seconds, "mfu": mfu}
    return out


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------

# Highest value first: the README's command (train.py under torchrun, --zero 3 --dtype bf16
# --compile), the collectives, then the figures. Each with its projected seconds (GPU, --smoke),
# what --deadline-s compares with the time left before starting it; a section runs with a timeout
# of 3x its projection + 60 s (10x on a CPU, which may be shared), or what is left.
SECTIONS = {
    "train.py": bench_train_runs,
    "nccl": bench_nccl,
    "kernels": bench_kernels,
    "ep_cp": bench_ep_cp,
    "memory": bench_memory,
    "speed": bench_speed,
    "decode": bench_decode,
    "resume": bench_resume,
    "torchrun": bench_torchrun,
    "ablation": bench_ablation,
}
OPT_IN = {"ablation"}  # runs only when --only names it: its compiles do not fit the default 500 s
PROJECTED_S = {
    "train.py": (160, 60),
    "nccl": (15, 30),
    "kernels": (30, 25),
    "ep_cp": (30, 40),
    "memory": (30, 15),
    "speed": (120, 30),
    "decode": (15, 8),
    "resume": (30, 20),
    "torchrun": (40, 45),
    # 6 variants: eager (seconds each) and compiled (~1 minute of inductor each)
    "ablation": (420, 60),
}
DEFAULT_JSON = (
    ROOT / "out" / "bench_gpu.json"
)  # out/ is train.py's default run folder, ignored by git


def check_json_path(text: str | None) -> pathlib.Path:
    """--json: a file path whose folder exists and is writable (the default's folder is made when written)."""
    if text is None:
        return DEFAULT_JSON
    path = pathlib.Path(text)
    if path.is_dir():
        raise BenchError(
            f"--json {text} is a directory; give a file path, e.g. --json {path / 'bench_gpu.json'}"
        )
    if not path.parent.is_dir():
        raise BenchError(
            f"--json {text}: directory {path.parent} does not exist; create it or pass another path"
        )
    if not os.access(path.parent, os.W_OK):
        raise BenchError(
            f"--json {text}: directory {path.parent} is not writable; pass a path in a writable one"
        )
    return path


def write_json(path: pathlib.Path, value) -> None:
    fileio.write_atomic(
        path,
        json.dumps(value, indent=1, default=str),
        error=BenchError,
        fix="pass --json elsewhere",
    )


def run_isolated(
    section: str,
    argv: list[str],
    report: Report,
    timeout_s: float,
    tmp: pathlib.Path,
    deadline_stop: bool = False,
):
    """One section in a child process of this script (a broken CUDA context dies with it),
    stopped after timeout_s with everything it started (run_bounded); its rows come back even
    when it is stopped (written as it goes). deadline_stop: timeout_s is what was left of
    --deadline-s, so a stop there is "skipped: deadline", not a failure; a stop at the section's
    own limit, or a child that dies, is a FAIL row."""
    sink = tmp / f"section-{section.replace('.', '_')}.json"
    cmd = [
        sys.executable,
        str(pathlib.Path(__file__).resolve()),
        *argv,
        "--section",
        section,
        "--section-out",
        str(sink),
    ]
    sys.stdout.flush()  # the child writes to the same descriptors, after us
    sys.stderr.flush()
    proc, timed_out = run_bounded(cmd, timeout_s)
    got = json.loads(sink.read_text()) if sink.exists() else {}
    report.rows += got.get("rows", [])
    if "status" in got:
        return got.get("result"), got["status"]
    if timed_out and deadline_stop:
        why = f"skipped: deadline (stopped after {timeout_s:.0f} s, what was left of --deadline-s)"
        print(f"  {section:<8} {why}", flush=True)
        return {"error": why}, why
    why = (
        f"stopped after its {timeout_s:.0f} s timeout"
        if timed_out
        else f"its process exited {proc.returncode}"
    )
    report.check(section, "section ran to its end", why, False)
    return {"error": why}, f"failed: {why}"


def run_sections(
    setup: Setup,
    report: Report,
    only: list[str] | None,
    argv: list[str] | None = None,
    deadline_s: float = 0,
    save=lambda results, status: None,
) -> tuple[dict, dict]:
    """Every section in turn, highest value first, each guarded: an exception ends that section
    only, as a FAIL row (its traceback on stderr) and "failed: ..." in the sections' status; the
    others still run. With argv each runs in a child process (run_isolated). With deadline_s a
    section whose projection no longer fits in the time left is skipped and says so.
    save(results, status) runs after every section."""
    results, status, start = {}, {}, time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        for section, run in SECTIONS.items():
            if (only and section not in only) or (not only and section in OPT_IN):
                continue
            need = PROJECTED_S.get(section, (60, 30))[0 if setup.cuda else 1]
            left = deadline_s - (time.perf_counter() - start) if deadline_s else math.inf
            if need > left:
                status[section] = (
                    f"skipped: deadline (needs ~{need} s, {max(left, 0):.0f} s "
                    f"left of --deadline-s)"
                )
                print(f"  {section:<8} {status[section]}", flush=True)
                save(results, status)
                continue
            if argv is not None:
                own = (3 if setup.cuda else 10) * need + 60  # a CPU may be shared
                results[section], status[section] = run_isolated(
                    section, argv, report, min(own, left), pathlib.Path(tmp), left < own
                )
                save(results, status)
                continue
            try:
                results[section] = run(setup, report, pathlib.Path(tmp))
                failed = [r for r in report.failed if r["section"] == section]
                status[section] = f"{len(failed)} failed checks" if failed else "ok"
            except Exception as e:  # noqa: BLE001 - reported, and the next section runs
                message = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                traceback.print_exc()
                report.check(section, "section ran to its end", message[:60], False)
                results[section] = {"error": message, "traceback": traceback.format_exc()}
                status[section] = f"failed: {message}"
                _free(setup.device)
            save(results, status)
    return results, status


def main(argv: list[str] | None = None) -> int:
    parser = benchcli.Parser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="CPU, tiny models, gloo: the same code paths (a few minutes on 2 cores, "
        "most of it torchrun start-ups)",
    )
    parser.add_argument(
        "--json",
        default=None,
        help="where the table goes as JSON (default: out/bench_gpu.json in the repository)",
    )
    parser.add_argument(
        "--nproc",
        type=benchcli.in_range(int, 0),
        default=0,
        help="world sizes of the torchrun and train.py sections: 1 and "
        "this (0 = every visible GPU)",
    )
    parser.add_argument("--only", nargs="+", choices=list(SECTIONS), help="run only these sections")
    parser.add_argument(
        "--deadline-s",
        type=benchcli.in_range(float, 0),
        default=0,
        help="skip a section whose "
        "projected time no longer fits in what is left of these seconds (0: none)",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run the sections in this "
        "process (default: each in a child process, so a broken CUDA context "
        "loses only its own section)",
    )
    parser.add_argument(
        "--layout-worker", metavar="OUT", help=argparse.SUPPRESS
    )  # what torchrun runs
    parser.add_argument("--ep-cp-worker", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--probe-worker", metavar="OUT", help=argparse.SUPPRESS)
    # A child of run_isolated: one section, its rows and result written to --section-out.
    parser.add_argument("--section", choices=list(SECTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--section-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.layout_worker:
        return layout_worker(args.layout_worker)
    if args.ep_cp_worker:
        return ep_cp_worker(args.ep_cp_worker)
    if args.probe_worker:
        return probe_worker(args.probe_worker)
    try:
        if not args.smoke and not torch.cuda.is_available():
            raise BenchError(
                "no CUDA GPU is visible; run on a GPU machine, or pass --smoke for the CPU version of "
                "every check"
            )
        if torch.cuda.is_available() and args.nproc > torch.cuda.device_count():
            raise BenchError(
                f"--nproc {args.nproc} must lie in [0, {torch.cuda.device_count()}] (the visible GPUs)"
            )
        json_path = check_json_path(args.json)
    except BenchError as e:
        print(f"bench_gpu.py: error: {e}", file=sys.stderr)
        return 2
    setup = Setup.smoke() if args.smoke else Setup.gpu(args.nproc or torch.cuda.device_count())
    setup = dataclasses.replace(setup, trace=str(json_path.with_suffix(".trace.json")))
    if args.section:  # a child of run_isolated
        sink = pathlib.Path(args.section_out)
        report = Report(sink)
        results, status = run_sections(setup, report, [args.section])
        write_json(
            sink,
            {"rows": report.rows, "result": results[args.section], "status": status[args.section]},
        )
        return 0
    name = torch.cuda.get_device_name(0) if setup.cuda else "CPU (--smoke)"
    print(
        f"bench_gpu.py on {name}: preset {setup.preset}, dtype {setup.dtype}, micro-batch {setup.batch_size} x "
        f"{setup.block_size}, torchrun N in {setup.nproc}, train.py on N in {setup.run_nproc}"
    )
    report = Report()
    results = {
        "device": name,
        "torch": torch.__version__,
        "setup": {k: str(v) for k, v in dataclasses.asdict(setup).items()},
    }
    start = time.perf_counter()

    def save(sections: dict, status: dict) -> None:  # after every section: a kill loses one
        results.update(
            sections, sections=status, rows=report.rows, seconds=time.perf_counter() - start
        )
        json_path.parent.mkdir(parents=True, exist_ok=True)
        write_json(json_path, results)

    child_argv = (
        None
        if args.in_process
        else (["--smoke"] if args.smoke else [])
        + ["--nproc", str(args.nproc), "--json", str(json_path)]
    )
    try:
        sections, status = run_sections(setup, report, args.only, child_argv, args.deadline_s, save)
        save(sections, status)
    except BenchError as e:  # a full disk or a file-size limit
        print(f"bench_gpu.py: error: --json: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(
            f"bench_gpu.py: error: --json {json_path}: cannot write it ({e.strerror or e}); pass --json "
            f"elsewhere",
            file=sys.stderr,
        )
        return 2
    failed = report.failed
    print(
        f"{len(report.rows)} rows, {len(failed)} failed checks, {results['seconds']:.0f} s; JSON in {json_path}"
    )
    print("sections: " + ", ".join(f"{k} {v}" for k, v in results["sections"].items()))
    for row in failed:
        print(f"FAILED: {row['section']}: {row['item']} = {row['value']}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
