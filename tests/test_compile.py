"""`--compile` in every layout, rehearsed on CPU: train.py's real CLI under torchrun (gloo
ranks) with torch.compile's real backends, trained, evaluated, checkpointed, resumed and sampled,
its losses equal to an eager run's.

Backend: env TRAIN_COMPILE_BACKEND (train.compile_model). `aot_eager` runs dynamo and
AOTAutograd - the tracing, the graph breaks, the autograd.Functions' traced backward, the
parameter views - and then runs the traced graph eagerly; it is where every crash this file
guards against happened. `inductor` adds code generation (a C++ compiler per graph, ~10x slower
to compile here), so it runs on the two layouts that crashed or were fragile.

Tolerance: compiled and eager losses agree to rel 1e-4 in fp32 and 2e-2 in bf16. A compiled
graph may sum in another order (fused kernels, a matmul split otherwise): ~1e-6 relative per
reduction in fp32, and after 3 AdamW steps the loss moves by < 1e-5; under bf16 one rounding is
2^-8 = 0.4%. A wrong gradient, a missed all-reduce or stale weights move the loss by > 1e-2 at
lr 3e-3 in the first steps (the eager runs show 5.68 -> 5.57 -> 5.46), far outside both.
"""
import os
import pathlib
import socket
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_train import dataset_dir  # noqa: E402,F401  (the session fixture)

import train  # noqa: E402

# The tiniest model that every layout splits: 2 layers (pp 2), 2 heads and kv heads (tp 2).
ARGS = ["--model", "tiny", "--model-args", "n_layer=2,n_head=2,n_kv_head=2,n_embd=16,block_size=16",
        "--batch-size", "2", "--block-size", "16", "--lr", "3e-3", "--warmup-steps", "1",
        "--eval-batches", "2", "--eval-interval", "2", "--log-interval", "1", "--num-samples", "1",
        "--sample-tokens", "4", "--peak-flops", "1e12", "--no-plot"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_train(data_dir, out, nproc: int, flags: list, backend: str = "aot_eager",
              timeout: int = 420):
    """train.py under torchrun (nproc gloo ranks on the CPU); its stdout, asserting exit 0."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAIN_COMPILE_BACKEND": backend}
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
                "--master_addr=127.0.0.1", f"--master_port={_free_port()}"]
    if nproc == 1:      # torchrun's variables for one process, without its agent (seconds less)
        launcher = [sys.executable]
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    cmd = [*launcher, str(ROOT / "train.py"), "--data", str(data_dir), *ARGS, *flags,
           "--out-dir", str(out)]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    assert run.returncode == 0, (flags, run.stdout[-1500:], run.stderr[-3000:])
    return run.stdout


def losses(out) -> tuple[list, list]:
    records = train.read_metrics(pathlib.Path(out) / "metrics.jsonl")
    return ([r["loss"] for r in records if "loss" in r and "event" not in r],
            [r["val_loss"] for r in records if "val_loss" in r])


def close(a: list, b: list, rel: float) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= rel * abs(y) for x, y in zip(a, b))


def check_compiled_layout(data_dir, tmp, nproc: int, layout: list, reference, backend="aot_eager",
                          rel=1e-4):
    """Compiled: 2 steps (eval at 0 and 2, checkpoint), then resumed to 3 (eval, checkpoint, a
    sample); every loss equal to the uninterrupted eager `reference` run's."""
    out = tmp / "compiled"
    first = run_train(data_dir, out, nproc, [*layout, "--compile", "--max-steps", "2"], backend)
    assert "| compiling" in first            # the compile step is named, not averaged into tok/s
    second = run_train(data_dir, out, nproc, [*layout, "--compile", "--max-steps", "3", "--resume"],
                       backend)
    assert "--- sample 1 ---" in second and train.load_checkpoint(out)["step"] == 3
    train_c, val_c = losses(out)
    train_e, val_e = losses(reference)
    assert close(train_c, train_e, rel) and close(val_c, val_e, rel), (layout, train_c, train_e)


@pytest.fixture(scope="module")
def eager(dataset_dir, tmp_path_factory):
    """Eager references, 3 steps uninterrupted: one process (any dp-1 layout computes its
    function), dp 2, and ZeRO-3 in bf16."""
    refs = {}
    bf16 = ["--zero", "3", "--dtype", "bf16"]
    for name, nproc, flags in [("single", 1, []), ("dp2", 2, []), ("bf16", 1, bf16)]:
        refs[name] = tmp_path_factory.mktemp(f"eager-{name}")
        run_train(dataset_dir, refs[name], nproc, [*flags, "--max-steps", "3"])
    return refs


@pytest.mark.slow
def test_zero3_compiled_in_one_process_evaluates_and_equals_eager(dataset_dir, tmp_path):
    """The crash this guards: `--zero 3 --compile` died at its first evaluation (AOTAutograd
    rebuilt the parameter views from a flat buffer that ZeRO-3 had freed). Per-block compile keeps
    ZeRO's hooks outside the graph."""
    ref = tmp_path / "eager"           # in this process, eager and alone: what ZeRO-3 must compute
    flags = ["--data", str(dataset_dir), *ARGS, "--max-steps", "2", "--num-samples", "0"]
    train.Trainer(train.parse_config([*flags, "--out-dir", str(ref)]), log=print).run()
    out = tmp_path / "compiled"
    run_train(dataset_dir, out, 1, ["--zero", "3", "--compile", "--max-steps", "2",
                                    "--num-samples", "0"])
    (train_c, val_c), (train_e, val_e) = losses(out), losses(ref)
    assert len(val_c) == 2 and close(train_c, train_e, 1e-4) and close(val_c, val_e, 1e-4)


LAYOUTS = {"single": (1, [], "single"), "dp2": (2, [], "dp2"), "zero1": (2, ["--zero", "1"], "dp2"),
           "zero2": (2, ["--zero", "2"], "dp2"), "zero3": (2, ["--zero", "3"], "dp2"),
           "tp2": (2, ["--tp", "2"], "single"), "pp2": (2, ["--pp", "2"], "single"),
           "mesh2x2x2": (8, ["--tp", "2", "--pp", "2"], "dp2")}


@pytest.mark.long
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_compiled_layout_trains_evaluates_resumes_and_equals_eager(name, dataset_dir, eager,
                                                                   tmp_path):
    nproc, layout, ref = LAYOUTS[name]
    check_compiled_layout(dataset_dir, tmp_path, nproc, layout, eager[ref])


@pytest.mark.long
def test_zero3_compiled_in_bf16_equals_eager_bf16(dataset_dir, eager, tmp_path):
    check_compiled_layout(dataset_dir, tmp_path, 1, ["--zero", "3", "--dtype", "bf16"],
                          eager["bf16"], rel=2e-2)


@pytest.mark.long
@pytest.mark.parametrize("layout", [["--zero", "3"], ["--tp", "2"]])
def test_inductor_compiles_zero3_and_tp(layout, dataset_dir, eager, tmp_path):
    """The real code generator, on the two layouts whose compile crashed or was fragile."""
    nproc = 2 if "--tp" in layout else 1
    out = tmp_path / "inductor"
    run_train(dataset_dir, out, nproc, [*layout, "--compile", "--max-steps", "3"],
              backend="inductor", timeout=600)
    (train_c, val_c), (train_e, val_e) = losses(out), losses(eager["single"])
    assert close(train_c, train_e, 1e-4) and close(val_c, val_e, 1e-4), (train_c, train_e)


@pytest.mark.slow
def test_progress_after_the_compile_step_reports_the_true_rate(dataset_dir, tmp_path,
                                                               monkeypatch):
    """The compile step is named ("compiling") and kept out of the smoothed step time: the next
    line's tok/s is that step's own rate (its metrics record), not a tenth of it blended with a
    compile that took seconds. Backend "eager": dynamo traces, nothing is generated (fast)."""
    monkeypatch.setenv("TRAIN_COMPILE_BACKEND", "eager")
    lines = []
    flags = ["--data", str(dataset_dir), *ARGS, "--max-steps", "2", "--num-samples", "0",
             "--compile", "--out-dir", str(tmp_path)]
    train.Trainer(train.parse_config(flags), log=lines.append).run()
    progress = [str(line) for line in lines if " tok/s" in str(line)]
    records = [r for r in train.read_metrics(tmp_path / "metrics.jsonl") if "tok_per_s" in r]
    assert len(progress) == 2 and "| compiling" in progress[0] and "compiling" not in progress[1]
    shown = float(progress[1].split(" tok/s")[0].split("| ")[-1].replace(",", ""))
    assert shown == pytest.approx(records[1]["tok_per_s"], rel=0.02), (progress, records)
