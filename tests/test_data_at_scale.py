"""Tests for data_at_scale.py's promises beyond equal bytes (those are in test_data.py, test_data_ray.py and
test_data_objstore.py): the cache key hashes every file the prepare path imports; a SIGKILLed prepare leaves no
worker process behind; a Ray started for a run leaves no session in $TMPDIR; the dataset gets the umask's modes; a
full disk (here ulimit -f) is one line naming the file, exit 2, no traceback, nothing half-written."""

import ast
import contextlib
import os
import pathlib
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import data
from machinery import data_at_scale
from machinery import dataset
from machinery import formats
from test_data import random_doc, web_corpus, write_jsonl

ROOT = pathlib.Path(__file__).resolve().parent.parent


def imported_files(module: str) -> set[str]:
    """The repository's files that `module` (dotted: machinery.data_at_scale) imports, at any depth and inside
    functions too, followed transitively: the files whose bytes can change what the module computes. A
    chapter's `if __name__ == "__main__":` stub (its command line) is not followed: importing runs none."""
    found, todo = set(), [module]
    while todo:
        name = todo.pop()
        path = ROOT / (name.replace(".", "/") + ".py")
        if name in found or not path.is_file():
            continue
        found.add(name)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        tree.body = [
            node
            for node in tree.body
            if not (isinstance(node, ast.If) and "__main__" in ast.dump(node.test))
        ]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                todo += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return {name.replace(".", "/") + ".py" for name in found}


def test_cache_key_hashes_every_file_the_prepare_path_imports(tmp_path):
    """PREPARE_FILES is exactly the set of files data_at_scale.prepare (and data.py's command line, which imports
    it) reaches, and a change to the bytes of any one of them changes the code version in the cache key."""
    assert (
        set(dataset.PREPARE_FILES)
        == imported_files("machinery.data_at_scale")
        == imported_files("machinery.commands.data")
    )
    for name in dataset.CACHE_KEY_FILES:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    base = dataset.code_version(dataset.CACHE_KEY_FILES, tmp_path)
    assert base == dataset.code_version()  # the copies hash as the real files
    for name in dataset.CACHE_KEY_FILES:  # a retrained classifier too
        original = (tmp_path / name).read_bytes()
        (tmp_path / name).write_bytes(original + b"\n")
        assert dataset.code_version(dataset.CACHE_KEY_FILES, tmp_path) != base, name
        (tmp_path / name).write_bytes(original)
    (tmp_path / "machinery" / "store.py").unlink()  # data.py copied without a sibling
    assert dataset.code_version(dataset.CACHE_KEY_FILES, tmp_path) != base


def children_of(pid: int) -> set[int]:
    return {
        int(c)
        for task in pathlib.Path(f"/proc/{pid}/task").iterdir()
        for c in (task / "children").read_text().split()
    }


def alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a container's init may not reap the re-parented)."""
    try:
        status = pathlib.Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return "State:\tZ" not in status


@pytest.mark.skipif(
    not pathlib.Path("/proc/self/task").exists(), reason="reads child processes from Linux's /proc"
)
def test_sigkilled_prepare_leaves_no_worker_process_behind(tmp_path):
    """SIGKILL to `data.py prepare` alone (not its group) while its 2 workers read chunks: the workers are gone
    within seconds (the kernel's parent-death signal), instead of living on re-parented to init."""
    corpus = write_jsonl(
        tmp_path / "web.jsonl",
        [d for seed in range(6) for d in web_corpus(random.Random(seed), 600)],
    )
    process = subprocess.Popen(
        [
            sys.executable,
            "data.py",
            "prepare",
            "--data",
            str(corpus),
            "--out",
            str(tmp_path / "ds"),
            "--vocab-size",
            "300",
            "--workers",
            "2",
            "--chunk-mb",
            "0.05",
            "--engine",
            "stream",
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline, workers = time.time() + 120, set()
        while len(workers) < 2 or not list(tmp_path.glob(".ds.work-*/s1-*.json")):
            assert process.poll() is None and time.time() < deadline, (
                "the run ended before its workers were seen"
            )
            workers = children_of(process.pid)
            time.sleep(0.02)
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        deadline = time.time() + 10
        while any(map(alive, workers)) and time.time() < deadline:
            time.sleep(0.05)
        assert not [pid for pid in workers if alive(pid)], "workers outlived their killed parent"
    finally:
        with contextlib.suppress(
            ProcessLookupError
        ):  # whatever a failure left: not the next test's
            os.killpg(process.pid, signal.SIGKILL)


def test_published_dataset_has_the_umask_modes(tmp_path):
    """Folders 0755 and files 0644 under umask 022 (mkdtemp's 0700 and mkstemp's 0600 would lock out every other
    account), for both engines; 0750/0640 under umask 027."""
    corpus = write_jsonl(tmp_path / "web.jsonl", web_corpus(random.Random(1), 60))
    for mask, folder, file in ((0o022, 0o755, 0o644), (0o027, 0o750, 0o640)):
        old = os.umask(mask)
        try:
            outs = [
                data_at_scale.prepare(
                    [str(corpus)], tmp_path / f"stream-{mask:o}", vocab_size=300, workers=1
                ),
                dataset.prepare([str(corpus)], tmp_path / f"memory-{mask:o}", vocab_size=300),
            ]
        finally:
            os.umask(old)
        for out in outs:
            assert out.stat().st_mode & 0o777 == folder, out
            assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
                p.name: file for p in out.iterdir()
            }


def limited_run(args: list[str], limit_bytes: int) -> subprocess.CompletedProcess:
    """`python data.py prepare ARGS` under a file-size limit (ulimit -f): a write past it fails with EFBIG, as a
    full disk fails with ENOSPC."""

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    return subprocess.run(
        [sys.executable, "data.py", "prepare", "--engine", "stream", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
    )


def test_full_disk_is_one_line_naming_the_file_and_leaves_nothing(tmp_path):
    """Under ulimit -f: a work file of stage 1 past the limit (one 16 MiB chunk of ~0.7 MB), and, with small chunks,
    the train shard past it. Each is one line "no space left writing PATH: free space or pass --out elsewhere",
    exit 2, no traceback (never "cannot read" an input), no half-written dataset or temp folder beside --out; the
    work folder stays, as after a kill, and a rerun with the space back resumes from it."""
    rng = random.Random(2)
    corpus = write_jsonl(
        tmp_path / "web.jsonl", [random_doc(rng, 120) for _ in range(900)]
    )  # ~0.7 MB
    cases = {
        "work file": (["--workers", "1", "--filters", "none"], 200_000, "/s1-000000.txt:"),
        "shard": (
            ["--workers", "2", "--chunk-mb", "0.02", "--near-dup-threshold", "0"],
            300_000,
            "shard/ds:",
        ),
    }
    for case, (options, limit_bytes, named) in cases.items():
        out = tmp_path / case.replace(" ", "-") / "ds"
        done = limited_run(
            ["--data", str(corpus), "--out", str(out), "--vocab-size", "300", *options], limit_bytes
        )
        errors = [
            line for line in done.stderr.splitlines() if not line.startswith("  ")
        ]  # but progress lines
        assert done.returncode == 2 and "Traceback" not in done.stderr, (case, done.stderr)
        assert len(errors) == 1 and errors[0].startswith("error: no space left writing "), (
            case,
            done.stderr,
        )
        assert errors[0].endswith(": free space or pass --out elsewhere") and named in errors[0], (
            case,
            errors,
        )
        assert not out.exists() and not list(out.parent.glob(".ds.tmp-*")), (
            case
        )  # no dataset, no temp folder
        resumed = subprocess.run(
            [
                sys.executable,
                "data.py",
                "prepare",
                "--engine",
                "stream",
                "--data",
                str(corpus),
                "--out",
                str(out),
                "--vocab-size",
                "300",
                *options,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert resumed.returncode == 0, (case, resumed.stderr)
        assert case == "work file" or "read + filters" not in resumed.stderr, (
            resumed.stderr
        )  # no chunk read again


@pytest.mark.slow
def test_ray_started_here_leaves_no_session_in_tmpdir(tmp_path):
    """`prepare --engine ray` starts a Ray of its own: its session (logs, sockets) goes to a fresh folder of
    $TMPDIR and is removed with it; Ray by default keeps every session in $TMPDIR/ray for good."""
    pytest.importorskip("ray", reason="the Ray engine needs Ray: pip install ray")
    corpus = write_jsonl(tmp_path / "web.jsonl", web_corpus(random.Random(3), 80))
    temp = pathlib.Path(
        tempfile.mkdtemp(dir="/tmp" if os.path.isdir("/tmp") else None)
    )  # short: Ray's sockets
    env = {k: v for k, v in os.environ.items() if k != "RAY_TMPDIR"}
    try:
        done = subprocess.run(
            [
                sys.executable,
                "data.py",
                "prepare",
                "--data",
                str(corpus),
                "--out",
                str(tmp_path / "ds"),
                "--vocab-size",
                "300",
                "--engine",
                "ray",
                "--workers",
                "1",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=600,
            env={**env, "TMPDIR": str(temp)},
        )
        assert done.returncode == 0, done.stderr
        assert data.load_manifest(tmp_path / "ds")["timings"]["engine"] == "ray"
        assert list(temp.iterdir()) == []
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def test_auto_engine_runs_the_reference_for_small_inputs_and_streams_above(tmp_path, monkeypatch):
    """engine="auto" (data.py prepare's and train.py's default): a small local corpus goes
    through the in-memory engine, which runs data.clean_corpus, the code the chapter teaches; above
    IN_MEMORY_MAX_BYTES it streams; the bytes agree."""
    calls = []
    reference = data.clean_corpus
    monkeypatch.setattr(data, "clean_corpus", lambda *a, **k: calls.append(1) or reference(*a, **k))
    corpus = write_jsonl(tmp_path / "web.jsonl", web_corpus(random.Random(4), 60))
    assert data_at_scale.fits_in_memory([formats.open_source(str(corpus))], [])
    small = data_at_scale.prepare([str(corpus)], tmp_path / "small", vocab_size=300, engine="auto")
    assert calls == [1] and data.load_manifest(small)["timings"]["engine"] == "in-memory"
    monkeypatch.setattr(data_at_scale, "IN_MEMORY_MAX_BYTES", corpus.stat().st_size - 1)
    big = data_at_scale.prepare(
        [str(corpus)], tmp_path / "big", vocab_size=300, engine="auto", workers=1
    )
    assert calls == [1] and data.load_manifest(big)["timings"]["engine"].startswith("streaming")
    assert all((small / p.name).read_bytes() == p.read_bytes() for p in big.glob("*.bin"))
    assert (small / "tokenizer.json").read_bytes() == (big / "tokenizer.json").read_bytes()
