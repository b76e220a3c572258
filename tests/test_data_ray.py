"""Tests for data.py's Ray engine (section 11): it writes what the local engine writes, byte for byte; a worker
SIGKILLed in the middle of a task is retried by Ray and the output does not change; a bad input file fails the job
with one line naming it (exit 2 from the CLI); a missing Ray or a dead address is one line before any work.

Ray starts once for the whole module (20-40 s on the shared 2-core machine) and every test reuses it: prepare()
uses a Ray that its caller already started. The tests that need Ray are marked slow (over 20 s each here)."""

import gzip
import json
import logging
import os
import pathlib
import random
import socket
import subprocess
import sys

import pytest

import data
from machinery import data_at_scale, dataset, formats
from machinery.commands import data as data_command
from data import DataError
from test_data import dataset_files, random_doc, web_corpus, write_jsonl

ray = pytest.importorskip("ray", reason="the Ray engine's tests need Ray: pip install ray")

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> pathlib.Path:
    """Two sources in several files: web .jsonl (cut into many chunks) and .jsonl.gz, and a .txt of books."""
    rng = random.Random(11)
    root = tmp_path_factory.mktemp("ray-inputs")
    (root / "web").mkdir()
    write_jsonl(root / "web" / "a.jsonl", web_corpus(rng, 60))
    with gzip.open(root / "web" / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in web_corpus(rng, 20)))
    write_jsonl(root / "web" / "c.jsonl", web_corpus(rng, 25))
    (root / "books.txt").write_text("\n\n".join(random_doc(rng, 70) for _ in range(20)))
    return root


# The funnel on every source; test_kept_whole_text_and_val_data_as_local keeps books.txt whole.
SETTINGS = dict(
    vocab_size=300,
    weights=[0.7, 0.3],
    val_fraction=0.1,
    seed=4,
    chunk_mb=3 / 1024,
    clean_settings=data.CleanSettings(cleaning="web"),
)


def sources(inputs: pathlib.Path) -> list[str]:
    return [str(inputs / "web"), str(inputs / "books.txt")]


@pytest.fixture(scope="module")
def local_dataset(inputs, tmp_path_factory) -> dict:
    """The local engine's output (2 worker processes): the oracle."""
    out = data_at_scale.prepare(
        sources(inputs), tmp_path_factory.mktemp("local") / "ds", workers=2, **SETTINGS
    )
    return dataset_files(out)


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """A local Ray of 2 CPUs whose workers can be told to die: when the file `armed` exists, the first stage_clean
    task to start (the one that creates `fired`) SIGKILLs its own worker process, as a lost node or the OOM killer
    would. The hook runs in every worker at start-up and wraps data_at_scale.stage_clean there (Ray sends functions by
    name, so the task finds the wrapper)."""
    folder = tmp_path_factory.mktemp("kill")
    armed, fired, root = folder / "armed", folder / "fired", str(ROOT)

    def install_killer():
        import os
        import signal
        import sys

        sys.path.insert(0, root)
        from machinery import data_at_scale as worker_engine

        stage_clean = worker_engine.stage_clean

        def stage_clean_or_die(*args):
            if os.path.exists(armed):
                try:
                    os.close(os.open(fired, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    pass
                else:
                    os.kill(os.getpid(), signal.SIGKILL)
            return stage_clean(*args)

        worker_engine.stage_clean = stage_clean_or_die

    for attempt in range(
        3
    ):  # a loaded machine can miss the 30 s Ray gives its raylet to start: try again
        try:
            ray.init(
                address="local",
                num_cpus=2,
                object_store_memory=data_at_scale.RAY_LOCAL_OBJECT_STORE,
                include_dashboard=False,
                logging_level=logging.ERROR,
                log_to_driver=False,
                runtime_env={"worker_process_setup_hook": install_killer},
            )
            break
        except Exception:
            ray.shutdown()
            if attempt == 2:
                raise
    yield armed, fired
    ray.shutdown()


@pytest.mark.slow
def test_ray_engine_writes_the_local_engines_bytes(
    inputs, local_dataset, ray_cluster, tmp_path, monkeypatch
):
    """Shards, tokenizer and manifest (but its timings) equal, over 3 files cut into many chunks, two sources mixed
    by weight: stable document ids and ordering by chunk index keep the order tasks finish in out of the output.
    Each join runs its key ranges as Ray tasks (4 per CPU: 8 here), none in this process."""
    cuts = []
    key_ranges = data_at_scale._key_ranges
    monkeypatch.setattr(
        data_at_scale, "_key_ranges", lambda *args: cuts.append(key_ranges(*args)) or cuts[-1]
    )
    monkeypatch.setattr(
        data_at_scale, "_in_processes", None
    )  # the local engine's runner: not called
    out = data_at_scale.prepare(sources(inputs), tmp_path / "ds", engine="ray", **SETTINGS)
    assert [len(ranges) for ranges in cuts] == [8, 8, 8]
    assert data.load_manifest(out)["timings"]["engine"] == "ray"
    got = dataset_files(out)
    assert got.keys() == local_dataset.keys()
    for name in local_dataset:
        assert got[name] == local_dataset[name], name
    assert (
        len(data_at_scale.plan_chunks([formats.open_source(s) for s in sources(inputs)], 3 << 10))
        > 10
    )
    assert not [
        p.name for p in tmp_path.iterdir() if p.name.startswith(".")
    ]  # no work folder left behind


@pytest.mark.slow
def test_worker_killed_mid_task_is_retried_and_changes_nothing(
    inputs, local_dataset, ray_cluster, tmp_path
):
    armed, fired = ray_cluster
    armed.touch()
    try:
        out = data_at_scale.prepare(sources(inputs), tmp_path / "ds", engine="ray", **SETTINGS)
    finally:
        armed.unlink()
    assert fired.exists()  # a worker did die in the middle of stage 2
    assert dataset_files(out) == local_dataset


@pytest.mark.slow
def test_kept_whole_text_and_val_data_as_local(inputs, ray_cluster, tmp_path):
    """books.txt kept whole (the default for a .txt: its pieces cut by the stage functions in Ray tasks) beside the
    web funnel, and --val-data (the 13-gram lookups in stage 3's tasks, the val files encoded and the overlap
    gathered as tasks): the same bytes as the local engine."""
    val = tmp_path / "held_out.txt"
    val.write_text(
        " ".join((inputs / "books.txt").read_text().split()[:40]) + "\nand a sentence of its own.\n"
    )
    settings = {**SETTINGS, "clean_settings": data.CleanSettings(), "val_data": [str(val)]}
    local = data_at_scale.prepare(sources(inputs), tmp_path / "local", workers=2, **settings)
    on_ray = data_at_scale.prepare(sources(inputs), tmp_path / "ray", engine="ray", **settings)
    manifest = data.load_manifest(on_ray)
    assert (
        manifest["timings"]["engine"] == "ray"
        and manifest["splits"]["val"]["overlap"]["shared"] == 28
    )
    assert any(s["name"].startswith("kept whole (books.txt") for s in manifest["funnel"])
    assert dataset_files(on_ray) == dataset_files(local)


@pytest.mark.slow
def test_bad_file_fails_the_job_with_one_line(inputs, ray_cluster, tmp_path, capsys):
    """A .gz whose header is fine but whose body is cut short passes the up-front checks; the Ray task reading it
    raises, and the CLI prints the task's one line (no Ray traceback) after its progress lines, exits 2 and leaves
    nothing behind."""
    web = tmp_path / "web"
    web.mkdir()
    for name in ("a.jsonl", "c.jsonl"):
        (web / name).write_bytes((inputs / "web" / name).read_bytes())
    whole = gzip.compress((inputs / "web" / "a.jsonl").read_bytes())
    (web / "b.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(SystemExit) as exit_info:
        sys.exit(
            data_command.main(
                [
                    "prepare",
                    "--engine",
                    "ray",
                    "--data",
                    str(web),
                    "--out",
                    str(tmp_path / "ds"),
                    "--vocab-size",
                    "300",
                    "--chunk-mb",
                    str(3 / 1024),
                ]
            )
        )
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()  # progress lines, then the error
    assert err[-1].startswith("error: ") and "b.jsonl.gz: damaged gzip file" in err[-1], err
    assert not [line for line in err if not line.startswith(("  ", "error: "))], (
        err
    )  # no Ray traceback
    assert sorted(p.name for p in tmp_path.iterdir()) == ["web"]


def test_ray_missing_or_unreachable_is_one_line_before_any_work(inputs, tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DataError, match=rf"`ray_address` 127.0.0.1:{port}: nothing answers there"):
        data_at_scale.prepare(
            sources(inputs), tmp_path / "ds", engine="ray", ray_address=f"127.0.0.1:{port}"
        )
    with pytest.raises(DataError, match="only ray takes an address"):
        data_at_scale.prepare(sources(inputs), tmp_path / "ds", ray_address="auto")
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # as if Ray were not installed
    with pytest.raises(DataError, match=r"`engine` ray needs Ray: pip install ray"):
        data_at_scale.prepare(sources(inputs), tmp_path / "ds", engine="ray")
    assert list(tmp_path.iterdir()) == []


def test_a_clusters_workers_get_the_code_and_the_classifiers_as_their_working_folder(monkeypatch):
    """--ray-address: ray.init ships dataset.CACHE_KEY_FILES as the workers' working folder (their cwd and
    sys.path), where classify.py finds classifiers/ beside it; the folder is removed when Ray stops.
    Catches: runtime_env py_modules of the .py files alone, each unpacked into a folder of its own, so
    a cluster's workers found no classifiers/ beside classify.py (--lang, --quality-threshold)."""
    seen = {}

    def init(**options):  # instead of dialling a cluster: look at what it would get
        folder = seen["folder"] = pathlib.Path(options["runtime_env"]["working_dir"])
        seen["files"] = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
        code = (
            "import classify; print(classify.identify_language('Bonjour tout le monde, merci')[0])"
        )
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        seen["worker"] = subprocess.run(
            [sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True
        )
        raise RuntimeError("no cluster in this test")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: None)  # the module's own Ray keeps running
    with pytest.raises(DataError, match="Ray did not start: no cluster in this test"):
        with data_at_scale.ray_engine("127.0.0.1:6379", None):
            pass
    assert seen["files"] == sorted(dataset.CACHE_KEY_FILES)
    assert seen["worker"].stdout == "fr\n", seen["worker"].stderr[-1500:]
    assert not seen["folder"].exists()
