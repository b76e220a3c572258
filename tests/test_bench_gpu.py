"""Tests for bench/bench_gpu.py: its CPU version (--smoke) runs every section's code path and its checks pass;
the layouts it tries, the memory it predicts (against what autograd really saves and what a step really
allocates), the micro-batch search's stops, the guarded sections, the forced rollback and the --json rules are
checked on their own."""

import collections
import dataclasses
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

import scaling

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "bench"))
import bench_gpu  # noqa: E402
import data  # noqa: E402
import model  # noqa: E402
import train  # noqa: E402
from machinery import run as train_run  # noqa: E402
from machinery.commands import train as train_command  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.long  # run by .ci/run (RUN_LONG=1): keeps `python -m pytest` near 15 minutes
def test_smoke_runs_every_section_and_every_check_passes(tmp_path, capsys):
    out = tmp_path / "smoke.json"
    assert bench_gpu.main(["--smoke", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    default = [name for name in bench_gpu.SECTIONS if name not in bench_gpu.OPT_IN]
    assert set(default) <= set(result) and list(result["sections"]) == default
    assert {"kernels", "ep_cp"} <= set(result)  # this round's sections, named in the JSON
    assert set(result["sections"].values()) == {"ok"}
    # The kernels on the device (here the CPU): flash, linear forms, one GPT per kind; --ep 2 and --cp 2 on gloo
    # ranks; the collective probe on 2 ranks with send/recv.
    assert result["kernels"]["flash"]["bf16_ratio"] <= 1.5 and len(result["kernels"]["models"]) == 5
    assert [r["layout"] for r in result["ep_cp"]["2"]["results"]] == ["--ep 2", "--cp 2"]
    assert result["nccl"]["2 ranks: send/recv (the ring's batch_isend_irecv)"] is True
    checks = [r for r in result["rows"] if r["status"] in ("ok", "FAIL")]
    assert checks and all(r["status"] == "ok" for r in checks)
    assert result["resume"]["exact"] and result["resume"]["cpu_close"]
    for n in (1, 2):  # torchrun ran every layout of world 1 and 2 on gloo
        run = result["torchrun"][str(n)]
        assert run["backend"] == "gloo" and run["world"] == n
        assert len(run["layouts"]) == len(bench_gpu.layouts(n)) + (
            n == 1
        )  # + the one-stage pipeline executor
    assert result["speed"]["eager"]["tokens_per_s"] > 0 and result["speed"]["max_micro_batch"] == 8
    # The model row names the data's vocabulary and the true parameter count (the "124m" on a GPU has 88M).
    row = next(r for r in result["rows"] if r["item"].startswith("model: preset tiny"))
    assert (
        "vocab 4,096 of --data pydocs" in row["item"] and row["value"] == result["speed"]["params"]
    )
    # The memory model held on the CPU's live tensors in bf16 (the GPU's dtype) and fp32, plain and checkpointed.
    assert {k for k in result["memory"]} == {
        "bf16, plain",
        "bf16, checkpointed",
        "fp32, plain",
        "fp32, checkpointed",
    }
    assert all(abs(m["ratio"] - 1) < 0.05 for m in result["memory"].values())
    # train.py itself under torchrun: trained, resumed with the same losses, rolled back after the forced spike.
    run = result["train.py"]["2/3"]
    assert run["train"]["exit"] == run["resume"]["exit"] == run["rollback"]["exit"] == 0
    assert [e["to_step"] for e in run["rollback"]["events"] if e["event"] == "rollback"] == [
        bench_gpu.RUN_CKPT
    ]
    assert "0 failed checks" in capsys.readouterr().out


def test_layouts_cover_what_the_world_allows_and_nothing_parallel_refuses():
    one = [(l["dp"], l["tp"], l["pp"], l["zero"], l["bf16"]) for l in bench_gpu.layouts(1)]
    assert one == [
        (1, 1, 1, 0, False),
        (1, 1, 1, 1, False),
        (1, 1, 1, 2, False),
        (1, 1, 1, 3, False),
        (1, 1, 1, 3, True),
    ]
    eight = bench_gpu.layouts(8)
    assert {(l["dp"], l["tp"], l["pp"]) for l in eight} == {
        (8 // (t * p), t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if 8 % (t * p) == 0
    }
    for lay in eight:
        bench_gpu.wiring.check_combination(
            lay["zero"], lay["tp"], lay["pp"]
        )  # raises on a refused combination
        assert lay["dp"] * lay["tp"] * lay["pp"] == 8
    assert not any(l["zero"] == 3 and l["tp"] > 1 for l in eight)
    assert not any(l["zero"] >= 2 and l["pp"] > 1 for l in eight)


# ---- the memory model against the code as written -------------------------------------------------------------


def saved_by_autograd(config, batch, seq, autocast: bool, whole_model: bool) -> dict:
    """{dtype: bytes} of what one forward saves for backward (saved_tensors_hooks), each storage once, the
    parameters themselves left out (they exist anyway); one block alone, or the whole model with its loss."""
    torch.manual_seed(0)
    gpt = model.GPT(config)
    params = {p.untyped_storage().data_ptr() for p in gpt.parameters()}
    seen = {}

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = (str(t.dtype).split(".")[-1], storage.nbytes())
        return t

    ids, targets = (torch.randint(0, config.vocab_size, (batch, seq)) for _ in range(2))
    with (
        torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast),
    ):
        if whole_model:
            gpt(ids, targets)
        else:
            # the residual stream in the compute dtype, as embed makes it
            x = torch.randn(batch, seq, config.n_embd)
            gpt.blocks[0](x.to(torch.bfloat16 if autocast else x.dtype).requires_grad_())
    out = collections.Counter()
    for kind, size in seen.values():
        out[kind] += size
    return dict(out)


@pytest.mark.parametrize("n_kv_head", [4, 2])  # MHA and GQA (on the CPU K, V read in place)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_saved_terms_are_what_autograd_saves(n_kv_head, dtype):
    cfg = model.GPTConfig(
        vocab_size=512, block_size=64, n_layer=2, n_head=4, n_kv_head=n_kv_head, n_embd=64
    )
    block, rest = bench_gpu.saved_terms(cfg, 2, 64, dtype)
    want_block = bench_gpu.bytes_by_dtype(block)
    want_model = collections.Counter(bench_gpu.bytes_by_dtype(block, cfg.n_layer))
    want_model.update(bench_gpu.bytes_by_dtype(rest))
    for got, want in (
        (saved_by_autograd(cfg, 2, 64, dtype == "bf16", False), want_block),
        (saved_by_autograd(cfg, 2, 64, dtype == "bf16", True), dict(want_model)),
    ):
        assert set(got) == set(want)
        for kind in want:  # within 1% per dtype (they agree to the byte today)
            assert abs(got[kind] - want[kind]) <= 0.01 * want[kind], (kind, got, want)


def test_live_bytes_counts_allocations_once_and_not_views():
    base = torch.zeros(1000)
    counter = bench_gpu.LiveBytes()
    with counter:
        a = torch.ones(256)  # 1 KiB
        b = a[:10]  # a view: nothing allocated
        c = base.t()  # a view of a tensor made before: nothing either
        a.mul_(2)  # in place: nothing
        d = torch.ones(512)  # 2 KiB, while a lives: peak 3 KiB
        del d
        e = torch.ones(128)  # 0.5 KiB, after d was freed
    assert counter.peak == 3 * 1024 and counter.now == 1024 + 512
    del a, b, c, e
    assert counter.now == 0


@pytest.mark.parametrize("checkpointing", [False, True])
def test_predicted_peak_is_what_a_training_step_allocates_on_cpu(checkpointing):
    """A train.py-shaped step (autocast bf16 forward, `_, loss = model(x, y)`, backward, clip, fused AdamW):
    the tensors it keeps alive at once, plus the weights and AdamW state, within 0.5% of predicted_memory (they
    agree to a few bytes: the 0-dim loss and grad norm)."""
    cfg = model.GPTConfig(
        vocab_size=1024,
        block_size=64,
        n_layer=2,
        n_head=4,
        n_kv_head=2,
        n_embd=64,
        activation_checkpointing=checkpointing,
    )
    torch.manual_seed(0)
    gpt = model.GPT(cfg)
    opt = torch.optim.AdamW(gpt.parameters(), lr=1e-3, fused=True)
    x, y = torch.randint(0, 1024, (4, 64)), torch.randint(0, 1024, (4, 64))

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = gpt(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(gpt.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # AdamW's moments exist from here on
    counter = bench_gpu.LiveBytes()
    with counter:
        step()
    want = bench_gpu.predicted_memory(cfg, 4, 64, checkpointing, "bf16")
    got = (
        counter.peak + want["weights"] + want["optimizer"] + want["batch"]
    )  # made before the counted step
    assert abs(got / want["total"] - 1) < 0.005, (got, want)


def test_predicted_memory_of_the_gpu_setting_adds_what_the_old_formula_missed():
    """The bench's GPU model (124m's shape, pydocs' vocabulary) at 16 x 1024 in bf16: the parts add up, the
    blocks dominate, and checkpointing keeps a quarter of it at most."""
    cfg = train_run.build_model_config(train_command.parse_config(["--model", "124m"]), 4096)
    n = scaling.count_params(cfg)
    assert n == 88_099_584
    parts = bench_gpu.predicted_memory(cfg, 16, 1024, checkpointing=False, dtype="bf16")
    assert (parts["weights"], parts["optimizer"]) == (4 * n, 8 * n)
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    # Per token and layer: 2 x (4 + 2) B of norm inputs upcast and normalised, 2 x 2 B of matmul inputs (one per
    # norm: q/k/v and w1/w3 are one matmul each), q k v out 8 B per channel, 4 x 2 B per FFN channel (+ small
    # terms): 24 x 768 + 8 x 2048 = 34,816 B (42,496 with an fp32 residual stream and a bf16 copy per matmul);
    # beside them the block's bf16 weight copies (2 B x 7.08M weights).
    weight_copies = 2 * (4 * 768 * 768 + 3 * 768 * 2048)
    per_token_layer = (parts["blocks_saved"] / 12 - weight_copies) / (16 * 1024)
    assert 34_816 <= per_token_layer < 34_816 + 100
    ckpt = bench_gpu.predicted_memory(cfg, 16, 1024, checkpointing=True, dtype="bf16")
    assert ckpt["total"] < parts["total"] / 3


# ---- the micro-batch search ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "failure, why",
    [
        (
            data.DataError(
                "split 'train' has 285 windows of 1025 tokens, fewer than batch_size x world_size = 512"
            ),
            "too few windows",
        ),
        (
            RuntimeError(
                "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"
            ),
            "out of memory (CUDA: CUDA error: out of memory)",
        ),
        (
            RuntimeError(
                "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
            ),
            "CUBLAS",
        ),
        (
            torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
            "the CUDA allocator",
        ),
    ],
)
def test_micro_batch_search_stops_at_memory_and_data_limits(monkeypatch, failure, why):
    tried = []

    def step_fn(trainer, backend, batch):
        def step():
            tried.append(batch)
            if batch > 8:
                raise failure

        return step

    monkeypatch.setattr(bench_gpu, "trainer_for", lambda *a, **k: None)
    monkeypatch.setattr(bench_gpu, "reference_step_fn", step_fn)
    setup = dataclasses.replace(bench_gpu.Setup.smoke(), max_batch=64)
    fits, reason = bench_gpu.largest_micro_batch(setup, pathlib.Path("unused"))
    assert (fits, tried) == (8, [4, 8, 16]) and reason.startswith("batch 16: ") and why in reason


def test_micro_batch_search_raises_what_is_not_a_limit(monkeypatch):
    def step_fn(trainer, backend, batch):
        def step():
            raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")  # a bug, not a limit

        return step

    monkeypatch.setattr(bench_gpu, "trainer_for", lambda *a, **k: None)
    monkeypatch.setattr(bench_gpu, "reference_step_fn", step_fn)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        bench_gpu.largest_micro_batch(bench_gpu.Setup.smoke(), pathlib.Path("unused"))


# ---- guarded sections, exit codes, --json -----------------------------------------------------------------------


def test_a_section_that_raises_is_reported_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    def broken(setup, report, tmp):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    def fine(setup, report, tmp):
        report.check("resume", "a check that passes", 1.0, True)
        return {"done": True}

    monkeypatch.setattr(bench_gpu, "SECTIONS", {"decode": broken, "resume": fine})
    out = tmp_path / "r.json"
    assert bench_gpu.main(["--smoke", "--in-process", "--json", str(out)]) == 1
    result = json.loads(out.read_text())
    assert result["sections"] == {
        "decode": "failed: RuntimeError: CUDA error: an illegal memory access was encountered",
        "resume": "ok",
    }
    assert (
        result["resume"] == {"done": True}
        and "illegal memory access" in result["decode"]["traceback"]
    )
    err = capsys.readouterr().err
    assert "FAILED: decode: section ran to its end" in err


def test_a_failed_check_exits_1_and_no_gpu_without_smoke_exits_2(tmp_path, monkeypatch, capsys):
    def failing(setup, report, tmp):
        report.check("resume", "a check that fails", 1.0, False)
        return {}

    monkeypatch.setattr(bench_gpu, "SECTIONS", {"resume": failing})
    assert bench_gpu.main(["--smoke", "--in-process", "--json", str(tmp_path / "r.json")]) == 1
    assert "FAILED: resume: a check that fails" in capsys.readouterr().err
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["rows"][0]["status"] == "FAIL" and result["sections"] == {
        "resume": "1 failed checks"
    }
    if not torch.cuda.is_available():
        assert bench_gpu.main(["--json", str(tmp_path / "x.json")]) == 2
        assert "no CUDA GPU is visible" in capsys.readouterr().err
    assert bench_gpu.main(["--smoke", "--json", str(tmp_path / "missing" / "x.json")]) == 2


def test_json_a_directory_is_one_line_exit_2_and_nothing_is_written(tmp_path, monkeypatch):
    """Checked before any section runs (a whole bench must not be lost at the end), no temp file left."""
    (tmp_path / "results").mkdir()
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_gpu.py"),
            "--smoke",
            "--only",
            "decode",
            "--json",
            str(tmp_path / "results"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    assert (
        proc.stderr.strip().count("\n") == 0
        and "--json" in proc.stderr
        and "is a directory" in proc.stderr
    )
    assert "Traceback" not in proc.stderr and list(tmp_path.rglob("*")) == [tmp_path / "results"]


def test_default_json_is_under_the_git_ignored_out_folder():
    assert bench_gpu.DEFAULT_JSON == ROOT / "out" / "bench_gpu.json"
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: .gitignore cannot be asked")
    ignored = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "-q", "out/bench_gpu.json"])
    assert ignored.returncode == 0


def test_json_is_written_atomically_through_fileio(tmp_path, monkeypatch):
    monkeypatch.setattr(bench_gpu, "SECTIONS", {"resume": lambda setup, report, tmp: {}})
    calls = []
    real = bench_gpu.fileio.write_atomic
    monkeypatch.setattr(
        bench_gpu.fileio, "write_atomic", lambda *a, **k: calls.append(a[0]) or real(*a, **k)
    )
    assert bench_gpu.main(["--smoke", "--in-process", "--json", str(tmp_path / "r.json")]) == 0
    assert set(calls) == {tmp_path / "r.json"} and [p.name for p in tmp_path.iterdir()] == [
        "r.json"
    ]


# ---- the forced spike-guard rollback ----------------------------------------------------------------------------


def test_rollback_flags_force_a_rollback_to_the_checkpoint(tmp_path):
    """The flags the train.py section resumes with make train.py's own spike guard roll back (in one process
    here; the bench does the same under torchrun with --zero)."""
    setup = bench_gpu.Setup.smoke()
    flags = bench_gpu.run_flags(setup, 0, tmp_path / "run")
    flags = [
        f for i, f in enumerate(flags) if f != "--zero" and (i == 0 or flags[i - 1] != "--zero")
    ]
    flags += ["--num-samples", "0", "--dtype", "fp32"]
    train_run.Trainer(train_command.parse_config(flags), log=lambda *a, **k: None).run()
    for ckpt in train.list_checkpoints(tmp_path / "run"):
        if ckpt.name != train.checkpoint_path(tmp_path / "run", bench_gpu.RUN_CKPT).name:
            ckpt.unlink()  # resume at step 10, as the bench's copy does
    train_run.Trainer(
        train_command.parse_config(flags + ["--resume", *bench_gpu.ROLLBACK_FLAGS]),
        log=lambda *a, **k: None,
    ).run()
    events = [
        r
        for r in train_run.read_metrics(tmp_path / "run" / "metrics.jsonl")
        if r.get("event") == "rollback"
    ]
    assert [e["to_step"] for e in events] == [bench_gpu.RUN_CKPT]


# ---- deadline, isolation, the collective probe ------------------------------------------------------------------


def test_a_deadline_skips_what_no_longer_fits_and_the_json_says_so(tmp_path):
    """`--smoke --deadline-s 20`: the sections run highest value first, each in its own process;
    what no longer fits in the 20 s is "skipped: deadline" (so is decode if a busy CPU makes it
    outlive the 20 s), the JSON (written after every section) and the last lines say which, and
    the exit code is 0: a deadline is no failed check."""
    out = tmp_path / "partial.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "bench_gpu.py"),
            "--smoke",
            "--deadline-s",
            "20",
            "--only",
            "decode",
            "speed",
            "torchrun",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    skipped = [k for k, v in result["sections"].items() if v.startswith("skipped: deadline")]
    assert {"speed", "torchrun"} <= set(
        skipped
    )  # their 30 s and 45 s do not fit in 20 s; decode's 8 s do
    assert all(f"{k:<8} skipped: deadline" in proc.stdout for k in skipped)
    assert result["sections"]["decode"] in ("ok", *[result["sections"][k] for k in skipped])
    assert list(result["sections"]) == ["speed", "decode", "torchrun"]  # the value order
    assert (
        not [r for r in result["rows"] if r["status"] == "FAIL"]
        and "0 failed checks" in proc.stdout
    )


def test_a_stop_at_the_deadline_is_a_skip_and_at_the_sections_own_limit_a_failure(
    tmp_path, monkeypatch
):
    """run_isolated: a child stopped where the deadline left less than the section's own limit is
    "skipped: deadline" and no FAIL row; the same stop at its own limit (a hang) is a FAIL row."""

    def stopped(cmd, timeout_s, **kwargs):
        return subprocess.CompletedProcess(cmd, 124, None, "stopped"), True

    monkeypatch.setattr(bench_gpu, "run_bounded", stopped)
    report = bench_gpu.Report()
    result, status = bench_gpu.run_isolated(
        "decode", ["--smoke"], report, 7, tmp_path, deadline_stop=True
    )
    assert (
        status.startswith("skipped: deadline") and not report.rows and result == {"error": status}
    )
    result, status = bench_gpu.run_isolated(
        "decode", ["--smoke"], report, 7, tmp_path, deadline_stop=False
    )
    assert status == "failed: stopped after its 7 s timeout" and len(report.failed) == 1


CHILD_TREE = """
import pathlib, signal, subprocess, sys, time
sleeper = [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]
same_group = subprocess.Popen(sleeper)                              # stays in the child's group
own_session = subprocess.Popen(sleeper, start_new_session=True)     # as torchrun starts each worker
pathlib.Path(sys.argv[1]).write_text(f"{same_group.pid} {own_session.pid}")
time.sleep(600)
"""


def test_a_child_past_its_limit_is_ended_with_every_process_it_started(tmp_path, monkeypatch):
    """run_bounded: the child runs in a session of its own; past its limit it, its group and the processes it
    started in sessions of their own (torchrun's workers) get SIGTERM, then (these ignore it) SIGKILL: none is
    alive afterwards, and the exit code is 124. Catches: subprocess's own timeout (SIGKILL to the child alone)."""
    monkeypatch.setattr(bench_gpu, "TERM_GRACE_S", 1.0)
    pid_file = tmp_path / "pids"
    proc, timed_out = bench_gpu.run_bounded([sys.executable, "-c", CHILD_TREE, str(pid_file)], 5)
    pids = [int(p) for p in pid_file.read_text().split()]
    survivors = [p for p in pids if bench_gpu.alive(p)]
    for p in survivors:  # a failing run leaves nothing behind either
        os.kill(p, signal.SIGKILL)
    assert timed_out and proc.returncode == 124 and len(pids) == 2
    assert not survivors


@pytest.mark.long
def test_a_section_past_its_limit_leaves_no_process_of_its_tree_alive(tmp_path, monkeypatch):
    """A real section (train.py's: torchrun and 2 workers, each in a session of its own) stopped by the deadline
    while its whole tree runs: "skipped: deadline", no FAIL row, and no process it started is alive afterwards
    (every process below this one is recorded while it runs). The deadline falls once torchrun's 2 workers
    exist, not after a fixed number of seconds: a fast machine finished the whole section inside 25 s."""
    seen, done = set(), threading.Event()

    class DeadlineOnceWorkersRun(subprocess.Popen):
        def communicate(self, input=None, timeout=None):
            if timeout is None:  # the wait after the tree was ended
                return super().communicate(input)
            while len(bench_gpu.descendants(self.pid)) < 3 and self.poll() is None:
                time.sleep(0.2)  # torchrun and its 2 workers
            # recorded here too: the watcher samples every 0.2 s and could miss the last worker
            seen.update(bench_gpu.descendants(os.getpid()))
            raise subprocess.TimeoutExpired(self.args, timeout)

    def record():
        while not done.is_set():
            seen.update(bench_gpu.descendants(os.getpid()))
            time.sleep(0.2)

    monkeypatch.setattr(bench_gpu.subprocess, "Popen", DeadlineOnceWorkersRun)
    watcher = threading.Thread(target=record)
    watcher.start()
    report = bench_gpu.Report()
    try:
        _, status = bench_gpu.run_isolated(
            "train.py",
            ["--smoke", "--json", str(tmp_path / "r.json")],
            report,
            600,
            tmp_path,
            deadline_stop=True,
        )
    finally:
        done.set()
        watcher.join()
    assert status.startswith("skipped: deadline") and not report.failed
    assert len(seen) >= 4  # the section's child, torchrun, its 2 workers (and their helpers)
    assert not [p for p in seen if bench_gpu.alive(p)]


def test_the_collective_probe_runs_every_collective_on_a_group_of_one(tmp_path):
    """At world 1 (one GPU; the 2-rank probe with send/recv runs in the smoke run): every collective but
    send/recv, which needs a peer; the row says it did not run."""
    report = bench_gpu.Report()
    out = bench_gpu.bench_nccl(
        dataclasses.replace(bench_gpu.Setup.smoke(), nproc=[1]), report, tmp_path
    )
    assert len(out) == 8 and all(out.values()) and not report.failed
    assert "all_to_all_single (expert parallel)" in out
    assert report.rows[-1]["value"] == "not run: 1 GPU"
    assert not torch.distributed.is_initialized()  # destroyed: the next section starts clean


def test_a_section_that_kills_its_process_loses_only_itself(tmp_path, monkeypatch):
    """A section's child that ends without its result (here: bad arguments, exit 2; on a GPU a
    broken CUDA context) is one FAIL row naming how it ended, in the parent, which goes on."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    report = bench_gpu.Report()
    result, status = bench_gpu.run_isolated(
        "decode", ["--smoke", "--nproc", "-5"], report, 120, tmp_path
    )
    assert status.startswith("failed: its process exited") and report.failed


# ---- this round's sections, the time they need, the command line ------------------------------------------------


def test_every_section_has_a_projection_and_the_gpu_run_fits_500_s():
    """README's one command is `--deadline-s 500`: the GPU projections of all sections add up to less."""
    assert set(bench_gpu.PROJECTED_S) == set(bench_gpu.SECTIONS) and bench_gpu.OPT_IN <= set(
        bench_gpu.SECTIONS
    )
    assert {"kernels", "ep_cp"} <= set(bench_gpu.SECTIONS)
    default = {k: v for k, v in bench_gpu.PROJECTED_S.items() if k not in bench_gpu.OPT_IN}
    assert sum(gpu for gpu, _ in default.values()) <= 500
    readme = (ROOT / "README.md").read_text()
    assert (
        "python bench/bench_gpu.py --deadline-s 500" in readme and "--deadline-s 540" not in readme
    )


def test_the_flash_checks_fail_on_a_kernel_that_is_wrong(monkeypatch):
    """The kernels section's flash checks can fail: a kernel without the causal mask is a FAIL row (fp32 equality,
    bf16 error), the real one passes them all (a small shape; torch.compile left out: the smoke run compiles)."""
    monkeypatch.setitem(bench_gpu.KERNEL_SHAPE, "cpu", (1, 1, 128, 8))
    monkeypatch.setattr(bench_gpu.torch, "compile", lambda fn, **kwargs: fn)
    setup = bench_gpu.Setup.smoke()
    report = bench_gpu.Report()
    bench_gpu.check_flash_kernel(setup, report)
    assert len(report.rows) == 3 and not report.failed
    real = model.flash_attention
    monkeypatch.setattr(
        bench_gpu.model_lib, "flash_attention", lambda q, k, v, causal: real(q, k, v, False)
    )
    report = bench_gpu.Report()
    bench_gpu.check_flash_kernel(setup, report)
    assert [r["item"].split(":")[0] for r in report.failed] == [
        "hand flash = SDPA, fp32, T=128",
        "hand flash, bf16, T=128",
    ]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["--nproc", "two"], "--nproc"),
        (["--deadline-s", "-1"], "--deadline-s"),
        (["--smoke", "--only", "nope"], "--only"),
    ],
)
def test_a_bad_flag_is_one_line_without_the_usage_block(capsys, argv, flag):
    with pytest.raises(SystemExit) as stop:
        bench_gpu.main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1 and flag in err and "usage:" not in err


# ---- the ablation: each GPU-step change on and off ---------------------------------------------------------------


class MatmulInputs(torch.utils._python_dispatch.TorchDispatchMode):
    """The dtype of the activation each matmul (aten.mm, addmm) of a forward reads."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
            self.seen.append(args[-2].dtype)
        return func(*args, **(kwargs or {}))


def test_the_ablation_switches_turn_each_change_off_and_back_on():
    """`separate_linears` makes q/k/v and w1/w3 five matmuls again (the fused forward has two per block, plus wo
    and w2), `fp32_stream` gives the blocks an fp32 residual stream (fp32 into every block under bf16 autocast),
    and leaving `ablated` restores model.fused_linear. The dispatcher's SDPA choice is a backend name."""
    cfg = model.GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32)
    x = torch.randint(0, 64, (2, 16))
    fused_linear = model.fused_linear
    for fused, bf16_stream, matmuls in ((True, True, 4), (False, True, 7), (True, False, 4)):
        gpt = model.GPT(cfg)
        if not bf16_stream:
            bench_gpu.fp32_stream(gpt)
        streams = []
        for block in gpt.blocks:
            block.register_forward_pre_hook(lambda b, args: streams.append(args[0].dtype))
        with bench_gpu.ablated(fused, None), MatmulInputs() as mm:
            with torch.autocast("cpu", torch.bfloat16):
                gpt(x, x)
        assert len(mm.seen) == 2 * matmuls + 1  # + the LM head
        assert set(mm.seen) == {torch.bfloat16}
        assert streams == [torch.bfloat16 if bf16_stream else torch.float32] * 2
        assert model.fused_linear is fused_linear
    setup = dataclasses.replace(bench_gpu.Setup.smoke(), dtype="bf16")
    assert bench_gpu.sdpa_choice(cfg, setup) in {"FLASH_ATTENTION", "MATH"}


def test_the_ablation_section_runs_every_variant_on_the_cpu(tmp_path):
    """--smoke --only ablation: a row per variant, eager and compiled (cuDNN: n/a off CUDA), and not part of the
    default run."""
    out = tmp_path / "ablation.json"
    assert (
        bench_gpu.main(["--smoke", "--only", "ablation", "--in-process", "--json", str(out)]) == 0
    )
    result = json.loads(out.read_text())
    rows = [r["item"] for r in result["rows"] if r["section"] == "ablation"]
    assert len(rows) == 1 + 2 * len(bench_gpu.ABLATIONS)
    assert result["ablation"]["compiled, all on"]["tokens_per_s"] > 0
    assert "ablation" in bench_gpu.OPT_IN


def test_an_ablation_variant_the_device_cannot_run_is_a_row_and_the_next_one_runs(
    tmp_path, monkeypatch
):
    """SDPA forced to a backend with no kernel here (the memory-efficient one has none on a CPU) raises "No viable
    backend": that variant is an n/a row, not the end of the section; the variant after it still runs."""
    monkeypatch.setattr(
        bench_gpu,
        "ABLATIONS",
        {"efficient": (True, True, "EFFICIENT_ATTENTION"), "all on": (True, True, None)},
    )
    monkeypatch.setattr(bench_gpu.torch, "compile", lambda fn, **kwargs: fn)
    report = bench_gpu.Report()
    out = bench_gpu.bench_ablation(bench_gpu.Setup.smoke(), report, tmp_path)
    values = {r["item"]: r["value"] for r in report.rows}
    assert values["eager, efficient"].startswith("n/a: ") and not report.failed
    assert out["eager, all on"]["tokens_per_s"] > 0 and out["compiled, all on"]["tokens_per_s"] > 0
