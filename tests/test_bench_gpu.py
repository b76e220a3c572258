"""Tests for bench/bench_gpu.py: its CPU version (--smoke) runs every section's code path and its checks pass;
the layouts it tries, the memory it predicts and its exit codes are checked on their own."""
import json
import pathlib
import sys

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "bench"))
import bench_gpu  # noqa: E402
import model  # noqa: E402
import parallel  # noqa: E402
import scaling  # noqa: E402


@pytest.mark.slow
def test_smoke_runs_every_section_and_every_check_passes(tmp_path, capsys):
    out = tmp_path / "smoke.json"
    assert bench_gpu.main(["--smoke", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"speed", "memory", "decode", "resume", "torchrun"} <= set(result)
    checks = [r for r in result["rows"] if r["status"] in ("ok", "FAIL")]
    assert checks and all(r["status"] == "ok" for r in checks)
    assert result["resume"]["exact"] and result["resume"]["cpu_close"]
    for n in (1, 2):                                   # torchrun ran every layout of world 1 and 2 on gloo
        run = result["torchrun"][str(n)]
        assert run["backend"] == "gloo" and run["world"] == n
        assert len(run["layouts"]) == len(bench_gpu.layouts(n)) + (n == 1)   # + the one-stage pipeline executor
    assert result["speed"]["eager"]["tokens_per_s"] > 0 and result["speed"]["max_micro_batch"] == 8
    assert "0 failed checks" in capsys.readouterr().out


def test_layouts_cover_what_the_world_allows_and_nothing_parallel_refuses():
    one = [(l["dp"], l["tp"], l["pp"], l["zero"], l["bf16"]) for l in bench_gpu.layouts(1)]
    assert one == [(1, 1, 1, 0, False), (1, 1, 1, 1, False), (1, 1, 1, 2, False), (1, 1, 1, 3, False),
                   (1, 1, 1, 3, True)]
    eight = bench_gpu.layouts(8)
    assert {(l["dp"], l["tp"], l["pp"]) for l in eight} == {
        (8 // (t * p), t, p) for t in (1, 2, 4, 8) for p in (1, 2, 4, 8) if 8 % (t * p) == 0}
    for lay in eight:
        parallel.check_combination(lay["zero"], lay["tp"], lay["pp"])      # raises on a refused combination
        assert lay["dp"] * lay["tp"] * lay["pp"] == 8
    assert not any(l["zero"] == 3 and l["tp"] > 1 for l in eight)
    assert not any(l["zero"] >= 2 and l["pp"] > 1 for l in eight)


def test_predicted_memory_is_the_accounting_of_scaling_and_model():
    cfg = model.PRESETS["124m"]
    n = cfg.num_params()
    parts = bench_gpu.predicted_memory(cfg, 16, 1024, checkpointing=False, dtype="bf16")
    assert (parts["weights"], parts["grads"], parts["optimizer"]) == (4 * n, 4 * n, 8 * n)
    assert parts["activations"] == scaling.activation_memory(12, 768, 12, 1024, 16)
    assert parts["logits"] == 12 * 16 * 1024 * 50304 and parts["autocast_copies"] == 2 * n
    assert parts["total"] == sum(v for k, v in parts.items() if k != "total")
    ckpt = bench_gpu.predicted_memory(cfg, 16, 1024, checkpointing=True, dtype="bf16")
    assert ckpt["activations"] < parts["activations"] / 5


def test_a_failed_check_exits_1_and_no_gpu_without_smoke_exits_2(tmp_path, monkeypatch, capsys):
    def failing(setup, report, tmp):
        report.check("resume", "a check that fails", 1.0, False)
        return {}
    monkeypatch.setitem(bench_gpu.SECTIONS, "resume", failing)
    assert bench_gpu.main(["--smoke", "--only", "resume", "--json", str(tmp_path / "r.json")]) == 1
    assert "FAILED: resume: a check that fails" in capsys.readouterr().err
    assert json.loads((tmp_path / "r.json").read_text())["rows"][0]["status"] == "FAIL"
    if not torch.cuda.is_available():
        assert bench_gpu.main(["--json", str(tmp_path / "x.json")]) == 2
        assert "no CUDA GPU is visible" in capsys.readouterr().err
    assert bench_gpu.main(["--smoke", "--json", str(tmp_path / "missing" / "x.json")]) == 2
