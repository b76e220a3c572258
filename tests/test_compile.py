"""`--compile` in every layout, rehearsed on CPU: train.py's real CLI under torchrun (gloo
ranks) with torch.compile's real backends, trained, evaluated, checkpointed, resumed and sampled,
its losses equal to an eager run's.

Backend: env TRAIN_COMPILE_BACKEND (train_run.compile_model). `aot_eager` runs dynamo and
AOTAutograd - the tracing, the graph breaks, the autograd.Functions' traced backward, the
parameter views - and then runs the traced graph eagerly; it is where every crash this file
guards against happened. `inductor` adds code generation (a C++ compiler per graph, ~10x slower
to compile here), so it runs on the two layouts that crashed or were fragile.

Steadiness: every run here logs dynamo's compiles (TORCH_LOGS=dynamo: one "start tracing" line
per compile of a frame, tagged [frame/compile] and per rank under torchrun), and `run_train`
fails on a "recompile_limit" hit or on any frame compiled more than twice on a rank (once for
training, once for the no_grad evaluation). A counter updated inside a compiled block made every
call a recompile until dynamo gave up and ran the block eagerly, with right losses: only the
count shows it. The compiled runs train 6 steps, then resume to 7.

Tolerance: compiled and eager losses agree to rel 1e-4 in fp32 and 2e-2 in bf16. A compiled
graph may sum in another order (fused kernels, a matmul split otherwise): ~1e-6 relative per
reduction in fp32, which 7 AdamW steps at a constant lr keep within 1e-4 (--min-lr-ratio 1: the
schedule of a 6-step run resumed to 7 is the 7-step run's); under bf16 one rounding is 2^-8 =
0.4%. A wrong gradient, a missed all-reduce or stale weights move the loss by > 1e-2 at lr 3e-3
in the first steps, far outside both.
"""

import collections
import os
import pathlib
import re
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_train import dataset_dir  # noqa: E402,F401  (the session fixture)

import train  # noqa: E402
from machinery import run as train_run  # noqa: E402
from machinery.commands import train as train_command  # noqa: E402

# The tiniest model that every layout splits: 2 layers (pp 2), 2 heads and kv heads (tp 2).
ARGS = [
    "--model",
    "tiny",
    "--model-args",
    "n_layer=2,n_head=2,n_kv_head=2,n_embd=16,block_size=16",
    "--batch-size",
    "2",
    "--block-size",
    "16",
    "--lr",
    "3e-3",
    "--warmup-steps",
    "1",
    "--min-lr-ratio",
    "1",  # a constant lr after warmup: 6 steps resumed to 7 = 7 steps
    "--eval-batches",
    "2",
    "--eval-interval",
    "2",
    "--log-interval",
    "1",
    "--num-samples",
    "1",
    "--sample-tokens",
    "4",
    "--peak-flops",
    "1e12",
    "--no-plot",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The MoE variant of ARGS' model, for --ep (capacity factor 0: no drops, EP equals data parallel)
MOE = [
    "--model-args",
    "n_layer=2,n_head=2,n_kv_head=2,n_embd=16,block_size=16,n_expert=4,"
    "expert_top_k=2,moe_capacity_factor=0",
]
# one "start tracing" line per compile: ([rank:]...) [frame/compile(_restart)] ... <function>
TRACING = re.compile(
    r"^(\[rank\d+\]:)?.*\[(\d+)/(\d+)(?:_\d+)?\] Step 1: torchdynamo start "
    r"tracing (\S+ \S+)",
    re.M,
)


def compiles_per_frame(log: str) -> dict:
    """{(rank prefix, frame id, function and place): distinct compiles} from a TORCH_LOGS=dynamo
    log. A restarted analysis (compile id 3_1) is the same compile."""
    seen = collections.defaultdict(set)
    for rank, frame, compile_id, where in TRACING.findall(log):
        seen[(rank, int(frame), where)].add(compile_id)
    return {key: len(ids) for key, ids in seen.items()}


def check_compiles(log: str, flags: list) -> None:
    """No recompile limit hit, no frame compiled more than twice per rank (train and eval)."""
    assert "recompile_limit" not in log, (flags, log[log.index("recompile_limit") - 2000 :][:3000])
    counts = compiles_per_frame(log)
    assert counts, (flags, "no compile logged")
    assert max(counts.values()) <= 2, (flags, {k: v for k, v in counts.items() if v > 2})


def run_train(
    data_dir, out, nproc: int, flags: list, backend: str = "aot_eager", timeout: int = 420
):
    """train.py under torchrun (nproc gloo ranks on the CPU); its stdout, asserting exit 0 and,
    compiled, steady compiles (`check_compiles`)."""
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TRAIN_COMPILE_BACKEND": backend,
        "TORCH_LOGS": "dynamo",
    }
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nproc_per_node={nproc}",
        "--master_addr=127.0.0.1",
        f"--master_port={_free_port()}",
    ]
    if nproc == 1:  # torchrun's variables for one process, without its agent (seconds less)
        launcher = [sys.executable]
        env.update(
            RANK="0",
            LOCAL_RANK="0",
            WORLD_SIZE="1",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(_free_port()),
        )
    cmd = [
        *launcher,
        str(ROOT / "train.py"),
        "--data",
        str(data_dir),
        *ARGS,
        *flags,
        "--out-dir",
        str(out),
    ]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert run.returncode == 0, (flags, run.stdout[-1500:], run.stderr[-3000:])
    if "--compile" in flags:
        check_compiles(run.stderr, flags)
    return run.stdout


def losses(out) -> tuple[list, list]:
    records = train_run.read_metrics(pathlib.Path(out) / "metrics.jsonl")
    return (
        [r["loss"] for r in records if "loss" in r and "event" not in r],
        [r["val_loss"] for r in records if "val_loss" in r],
    )


def close(a: list, b: list, rel: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b))


def check_compiled_layout(
    data_dir, tmp, nproc: int, layout: list, reference, backend="aot_eager", rel=1e-4
):
    """Compiled: 6 steps (eval every 2, checkpoint), then resumed to 7 (eval, checkpoint, a
    sample); every loss equal to the uninterrupted eager `reference` run's, compiles steady."""
    out = tmp / "compiled"
    first = run_train(data_dir, out, nproc, [*layout, "--compile", "--max-steps", "6"], backend)
    assert "| compiling" in first  # the compile step is named, not averaged into tok/s
    second = run_train(
        data_dir, out, nproc, [*layout, "--compile", "--max-steps", "7", "--resume"], backend
    )
    assert "--- sample 1 ---" in second and train.load_checkpoint(out)["step"] == 7
    train_c, val_c = losses(out)
    train_e, val_e = losses(reference)
    assert close(train_c, train_e, rel) and close(val_c, val_e, rel), (layout, train_c, train_e)


EAGER = {
    "single": (1, []),
    "dp2": (2, []),
    "bf16": (1, ["--zero", "3", "--dtype", "bf16"]),
    "moe_dp2": (2, MOE),
}


class EagerRuns(dict):
    """Eager references, 7 steps uninterrupted, run when first asked for: one process (any dp-1
    layout computes its function), dp 2, ZeRO-3 in bf16, and the MoE model on dp 2."""

    def __init__(self, data_dir, tmp_path_factory):
        super().__init__()
        self.data_dir, self.tmp_path_factory = data_dir, tmp_path_factory

    def __missing__(self, name):
        nproc, flags = EAGER[name]
        self[name] = self.tmp_path_factory.mktemp(f"eager-{name}")
        run_train(self.data_dir, self[name], nproc, [*flags, "--max-steps", "7"])
        return self[name]


@pytest.fixture(scope="module")
def eager(dataset_dir, tmp_path_factory):
    return EagerRuns(dataset_dir, tmp_path_factory)


@pytest.mark.slow
def test_zero3_compiled_in_one_process_evaluates_and_equals_eager(dataset_dir, tmp_path):
    """The crash this guards: `--zero 3 --compile` died at its first evaluation (AOTAutograd
    rebuilt the parameter views from a flat buffer that ZeRO-3 had freed). Per-block compile keeps
    ZeRO's hooks outside the graph."""
    ref = tmp_path / "eager"  # in this process, eager and alone: what ZeRO-3 must compute
    flags = ["--data", str(dataset_dir), *ARGS, "--max-steps", "2", "--num-samples", "0"]
    train_run.Trainer(train_command.parse_config([*flags, "--out-dir", str(ref)]), log=print).run()
    out = tmp_path / "compiled"
    run_train(
        dataset_dir, out, 1, ["--zero", "3", "--compile", "--max-steps", "2", "--num-samples", "0"]
    )
    (train_c, val_c), (train_e, val_e) = losses(out), losses(ref)
    assert len(val_c) == 2 and close(train_c, train_e, 1e-4) and close(val_c, val_e, 1e-4)


LAYOUTS = {
    "single": (1, [], "single"),
    "dp2": (2, [], "dp2"),
    "zero1": (2, ["--zero", "1"], "dp2"),
    "zero2": (2, ["--zero", "2"], "dp2"),
    "zero3": (2, ["--zero", "3"], "dp2"),
    "tp2": (2, ["--tp", "2"], "single"),
    "pp2": (2, ["--pp", "2"], "single"),
    "ep2": (2, [*MOE, "--ep", "2"], "moe_dp2"),
    "cp2": (2, ["--cp", "2"], "single"),
    "mesh2x2x2": (8, ["--tp", "2", "--pp", "2"], "dp2"),
}


@pytest.mark.long
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_compiled_layout_trains_evaluates_resumes_and_equals_eager(
    name, dataset_dir, eager, tmp_path
):
    nproc, layout, ref = LAYOUTS[name]
    check_compiled_layout(dataset_dir, tmp_path, nproc, layout, eager[ref])


@pytest.mark.long
def test_zero3_compiled_in_bf16_equals_eager_bf16(dataset_dir, eager, tmp_path):
    check_compiled_layout(
        dataset_dir, tmp_path, 1, ["--zero", "3", "--dtype", "bf16"], eager["bf16"], rel=2e-2
    )


@pytest.mark.long
@pytest.mark.parametrize("layout", [["--zero", "3"], ["--tp", "2"]])
def test_inductor_compiles_zero3_and_tp(layout, dataset_dir, eager, tmp_path):
    """The real code generator, on the two layouts whose compile crashed or was fragile."""
    nproc = 2 if "--tp" in layout else 1
    out = tmp_path / "inductor"
    run_train(
        dataset_dir,
        out,
        nproc,
        [*layout, "--compile", "--max-steps", "7"],
        backend="inductor",
        timeout=600,
    )
    (train_c, val_c), (train_e, val_e) = losses(out), losses(eager["single"])
    assert close(train_c, train_e, 1e-4) and close(val_c, val_e, 1e-4), (train_c, train_e)


@pytest.mark.slow
def test_progress_after_the_compile_step_reports_the_true_rate(dataset_dir, tmp_path, monkeypatch):
    """The compile step is named ("compiling") and kept out of the smoothed step time: the next
    line's tok/s is that step's own rate (its metrics record), not a tenth of it blended with a
    compile that took seconds. Backend "eager": dynamo traces, nothing is generated (fast)."""
    monkeypatch.setenv("TRAIN_COMPILE_BACKEND", "eager")
    lines = []
    flags = [
        "--data",
        str(dataset_dir),
        *ARGS,
        "--max-steps",
        "2",
        "--num-samples",
        "0",
        "--compile",
        "--out-dir",
        str(tmp_path),
    ]
    train_run.Trainer(train_command.parse_config(flags), log=lines.append).run()
    progress = [str(line) for line in lines if " tok/s" in str(line)]
    records = [r for r in train_run.read_metrics(tmp_path / "metrics.jsonl") if "tok_per_s" in r]
    assert len(progress) == 2 and "| compiling" in progress[0] and "compiling" not in progress[1]
    shown = float(progress[1].split(" tok/s")[0].split("| ")[-1].replace(",", ""))
    assert shown == pytest.approx(records[1]["tok_per_s"], rel=0.02), (progress, records)
