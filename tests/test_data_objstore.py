"""Tests for data.py's object-store inputs and outputs (URIs through pyarrow.fs): prepare reads a corpus from
s3:// (a .jsonl cut into byte ranges, a .jsonl.gz, a .parquet cut by row groups) and publishes the dataset to s3://,
object for object the bytes of the in-memory reference engine's local run, with either engine; file:// URIs work
the same; a publish that fails or is SIGKILLed half-way leaves no manifest at the final prefix; a bad bucket, key,
glob or endpoint is one line, exit 2; `download` brings a dataset back for the loader.

The S3 is moto's server, started in this process on 127.0.0.1 (a free port) for the module, so no network is
needed. pyarrow reaches it through the URI's query, ?endpoint_override=127.0.0.1:PORT&scheme=http (and, as tested,
through the AWS_ENDPOINT_URL environment variable), with dummy credentials in the environment."""

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
from machinery import data_at_scale
from machinery.commands import data as data_command
from machinery import dataset
from machinery import formats
from machinery import store
from data import DataError
from test_data import dataset_files, web_corpus, write_jsonl

pa = pytest.importorskip(
    "pyarrow", reason="object-store URIs go through pyarrow.fs: pip install pyarrow"
)
pytest.importorskip(
    "moto.server", reason="the S3 oracle is moto's server: pip install 'moto[server]'"
)
import pyarrow.fs as pafs  # noqa: E402  (after the skips)
import pyarrow.parquet as pq  # noqa: E402
from moto.server import ThreadedMotoServer  # noqa: E402

RECIPE = dict(vocab_size=300, val_fraction=0.2, seed=1)  # the dataset; dataset.prepare takes these
SETTINGS = dict(RECIPE, workers=2, chunk_mb=3 / 1024)  # and the engine's: data_at_scale.prepare


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3():
    """moto's S3 on 127.0.0.1, with buckets `corpus` and `datasets`; yields (the URI query that points pyarrow at
    it, a pyarrow S3FileSystem on it). Dummy credentials; AWS_EC2_METADATA_DISABLED so that nothing asks the
    network for a role."""
    port = free_port()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # not a line per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    with pytest.MonkeyPatch.context() as env:
        for name, value in (
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_DEFAULT_REGION", "us-east-1"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ):
            env.setenv(name, value)
        env.delenv("AWS_ENDPOINT_URL", raising=False)
        store.filesystem_root.cache_clear()
        fs = pafs.S3FileSystem(
            endpoint_override=f"127.0.0.1:{port}",
            scheme="http",
            region="us-east-1",
            allow_bucket_creation=True,
        )
        fs.create_dir("corpus")
        fs.create_dir("datasets")
        yield f"endpoint_override=127.0.0.1:{port}&scheme=http", fs
        store.filesystem_root.cache_clear()
    server.stop()


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> pathlib.Path:
    """web/: a .jsonl of ~15 KB (five 3 KiB byte ranges), a .jsonl.gz, a .parquet of 4 row groups."""
    rng = random.Random(8)
    web = tmp_path_factory.mktemp("objstore-inputs") / "web"
    web.mkdir()
    write_jsonl(web / "a.jsonl", web_corpus(rng, 30))
    with gzip.open(web / "b.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in web_corpus(rng, 15)))
    pq.write_table(pa.table({"text": web_corpus(rng, 20)}), web / "c.parquet", row_group_size=8)
    return web


@pytest.fixture(scope="module")
def uploaded(s3, inputs) -> str:
    """The web/ folder copied to s3://corpus/web/; the URI of that prefix."""
    query, fs = s3
    for path in sorted(inputs.iterdir()):
        with fs.open_output_stream(
            f"corpus/web/{path.name}", compression=None
        ) as f:  # bytes as they are
            f.write(path.read_bytes())
    return f"s3://corpus/web?{query}"


@pytest.fixture(scope="module")
def reference(inputs, tmp_path_factory) -> dict:
    """The oracle: the in-memory engine on the local files (whole files, no byte ranges, no URIs)."""
    out = dataset.prepare([str(inputs)], tmp_path_factory.mktemp("reference") / "web", **RECIPE)
    return dataset_files(out)


def objects(fs, prefix: str) -> dict:
    """Every object under a prefix, as dataset_files gives a local dataset: name -> bytes, the manifest parsed
    without its timings."""
    found = fs.get_file_info(pafs.FileSelector(prefix, recursive=True, allow_not_found=True))
    files = {}
    for info in sorted(found, key=lambda i: i.path):
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path, compression=None) as f:
                files[info.path[len(prefix) + 1 :]] = f.read()
    if "manifest.json" in files:
        files["manifest"] = json.loads(files.pop("manifest.json"))
        files["manifest"].pop("timings")
    return files


def same_dataset(got: dict, expected: dict, spec: str, local_spec: str) -> None:
    """Equal file for file; the manifests equal but for the cache key (a hash of the inputs' names, sizes and
    mtimes) once the source's URI reads as the local path."""
    assert got.keys() == expected.keys()
    for name in expected:
        if name != "manifest":
            assert got[name] == expected[name], name
    manifest = json.loads(
        json.dumps(got["manifest"]).replace(json.dumps(spec)[1:-1], json.dumps(local_spec)[1:-1])
    )
    assert {**manifest, "cache_key": None} == {**expected["manifest"], "cache_key": None}


def test_s3_in_s3_out_writes_the_local_bytes(s3, inputs, uploaded, reference, tmp_path):
    """A prefix of three file types, the .jsonl cut into byte ranges at 3 KiB, read from S3 and published to S3:
    every object equals the in-memory reference's file. A rerun finds the finished manifest and returns at once."""
    query, fs = s3
    out = f"s3://datasets/web?{query}"
    assert data_at_scale.prepare([uploaded], out, work_dir=tmp_path / "work", **SETTINGS) == out
    assert (
        len(data_at_scale.plan_chunks([formats.open_source(uploaded)], 3 << 10)) >= 8
    )  # byte ranges and row groups
    same_dataset(objects(fs, "datasets/web"), reference, uploaded, str(inputs))
    assert [i.base_name for i in fs.get_file_info(pafs.FileSelector("datasets"))] == [
        "web"
    ]  # no OUT.tmp-*
    assert list((tmp_path / "work").iterdir()) == []  # no work files left
    assert dataset.load_manifest(out)["splits"] == reference["manifest"]["splits"]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(
            data_at_scale,
            "build_streaming",
            lambda *a, **k: pytest.fail("rebuilt a finished dataset"),
        )
        assert data_at_scale.prepare([uploaded], out, work_dir=tmp_path / "work", **SETTINGS) == out


def test_kept_whole_text_streams_from_s3(s3, tmp_path, monkeypatch):
    """A .txt and a .txt.gz kept whole, read from S3 in 7-byte blocks (markers and "\\r\\n" cut by blocks): the
    local in-memory engine's bytes."""
    query, fs = s3
    rng = random.Random(3)
    text = "\r\n\r\n".join(
        " ".join(rng.choices("river stone paper winter bridge".split(), k=60))
        + data.EOT * (i % 3 == 0)
        for i in range(30)
    )
    books = tmp_path / "books"
    books.mkdir()
    (books / "a.txt").write_text(text, newline="")
    (books / "b.txt.gz").write_bytes(gzip.compress(text[::-1].encode()))
    fs.create_dir("own")  # its own bucket: the others' listings are checked
    for path in books.iterdir():
        with fs.open_output_stream(f"own/books/{path.name}", compression=None) as f:
            f.write(path.read_bytes())
    monkeypatch.setattr(data_at_scale, "TEXT_BLOCK_BYTES", 7)
    expected = dataset_files(dataset.prepare([str(books)], tmp_path / "reference", **RECIPE))
    spec = f"s3://own/books?{query}"
    got = dataset_files(
        data_at_scale.prepare([spec], tmp_path / "ds", work_dir=tmp_path / "work", **SETTINGS)
    )
    same_dataset(got, expected, spec, str(books))
    assert got["manifest"]["funnel"][1]["name"].startswith("kept whole")


def test_jsonl_byte_ranges_over_s3_read_every_line_once(s3, inputs, uploaded):
    """Ranges that tile the object read each line once: a line belongs to the range holding its first byte, found
    by a seek to the byte before and a readline. The cuts fall on line starts and one byte after them, where an
    off-by-one loses or repeats a line."""
    uri = uploaded.replace("corpus/web?", "corpus/web/a.jsonl?")
    raw = (inputs / "a.jsonl").read_bytes()
    line_starts = [0] + [k + 1 for k, byte in enumerate(raw[:-1]) if byte == ord("\n")]
    cuts = [0] + [line_starts[k] + k % 2 for k in range(1, len(line_starts), 3)] + [len(raw)]
    got = [
        d
        for start, stop in zip(cuts, cuts[1:])
        for d in formats.read_jsonl(uri, start=start, stop=stop)
    ]
    assert got == list(formats.read_jsonl(inputs / "a.jsonl")) and len(cuts) > 10


def test_file_uris_and_globs(inputs, tmp_path):
    """file:// URIs take the same road as s3:// (pyarrow's LocalFileSystem): a glob in, a URI out. The cache key
    sees an object change size even when its mtime is put back."""
    spec = f"file://{inputs}/*.jsonl*"
    oracle = dataset_files(
        dataset.prepare([str(inputs / "*.jsonl*")], tmp_path / "local", **RECIPE)
    )
    assert (
        data_at_scale.prepare([spec], f"file://{tmp_path}/uri", **SETTINGS)
        == f"file://{tmp_path}/uri"
    )
    same_dataset(dataset_files(tmp_path / "uri"), oracle, spec, str(inputs / "*.jsonl*"))
    assert [f.rsplit("/", 1)[1] for f in formats.open_source(spec).files] == [
        "a.jsonl",
        "b.jsonl.gz",
    ]
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "a.jsonl").write_bytes((inputs / "a.jsonl").read_bytes())
    stat = (copy / "a.jsonl").stat()
    first = data_at_scale.prepare([f"file://{copy}"], f"file://{tmp_path}/again", **SETTINGS)
    with open(copy / "a.jsonl", "a") as f:
        f.write(json.dumps({"text": "one more line"}) + "\n")
    os.utime(copy / "a.jsonl", ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same mtime, another size
    with pytest.raises(DataError, match="already holds a different dataset"):
        data_at_scale.prepare([f"file://{copy}"], first, **SETTINGS)


class FailingCopies:
    """A pyarrow FileSystem whose copy_file fails on its second call, as a publish killed half-way stops."""

    def __init__(self, fs) -> None:
        self.fs, self.copies = fs, 0

    def __getattr__(self, name):
        return getattr(self.fs, name)

    def copy_file(self, src: str, dest: str) -> None:
        self.copies += 1
        if self.copies == 2:
            raise OSError("connection reset by peer (injected)")
        self.fs.copy_file(src, dest)


def test_failed_publish_leaves_no_manifest(s3, inputs, uploaded, reference, tmp_path, monkeypatch):
    """The upload goes to OUT.tmp-*/ and is copied to OUT/ with the manifest last: a publish that fails after its
    first copy leaves no OUT/manifest.json (a reader waits for it) and no temporary prefix; the next run replaces
    the partial objects and publishes the same bytes."""
    query, fs = s3
    out = f"s3://datasets/failed?{query}"
    filesystem = store.filesystem
    monkeypatch.setattr(
        store,
        "filesystem",
        lambda uri, error: (
            (FailingCopies(filesystem(uri, error)[0]), filesystem(uri, error)[1])
            if "datasets/failed" in uri
            else filesystem(uri, error)
        ),
    )
    with pytest.raises(
        DataError, match=r"publishing to s3://datasets/failed\?.* failed \(connection reset"
    ):
        data_at_scale.prepare([uploaded], out, work_dir=tmp_path, **SETTINGS)
    monkeypatch.undo()
    left = objects(fs, "datasets/failed")
    assert len(left) == 1 and "manifest" not in left  # one object copied, no manifest
    assert [
        i.base_name
        for i in fs.get_file_info(pafs.FileSelector("datasets"))
        if i.base_name.startswith("failed")
    ] == ["failed"]  # no failed.tmp-* prefix
    data_at_scale.prepare([uploaded], out, work_dir=tmp_path, **SETTINGS)
    same_dataset(objects(fs, "datasets/failed"), reference, uploaded, str(inputs))


KILLED_RUN = """
import os, signal, sys
sys.path.insert(0, {root!r})
from machinery import data_at_scale, store
filesystem = store.filesystem

class DiesOnSecondCopy:
    def __init__(self, fs):
        self.fs, self.copies = fs, 0
    def __getattr__(self, name):
        return getattr(self.fs, name)
    def copy_file(self, src, dest):
        self.copies += 1
        if self.copies == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        self.fs.copy_file(src, dest)

store.filesystem = lambda uri, error: ((DiesOnSecondCopy(filesystem(uri, error)[0]), filesystem(uri, error)[1])
                                      if "killed" in uri else filesystem(uri, error))
data_at_scale.prepare([{source!r}], {out!r}, work_dir={work!r}, **{settings!r})
"""


def test_killed_publish_leaves_no_manifest_and_the_next_run_cleans_up(
    s3, inputs, uploaded, reference, tmp_path
):
    """SIGKILL in the middle of the publish (after the first server-side copy): no OUT/manifest.json, the
    OUT.tmp-* prefix stays behind; the next run removes it and publishes the reference's bytes."""
    query, fs = s3
    out = f"s3://datasets/killed?{query}"
    script = KILLED_RUN.format(
        root=str(pathlib.Path(data.__file__).parent),
        source=uploaded,
        out=out,
        work=str(tmp_path),
        settings=SETTINGS,
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == -9, run.stderr
    left = objects(fs, "datasets/killed")
    assert len(left) == 1 and "manifest" not in left
    stale = [
        i.base_name
        for i in fs.get_file_info(pafs.FileSelector("datasets"))
        if i.base_name.startswith("killed.")
    ]
    assert len(stale) == 1 and stale[0].startswith("killed.tmp-")
    data_at_scale.prepare([uploaded], out, work_dir=tmp_path, **SETTINGS)
    same_dataset(objects(fs, "datasets/killed"), reference, uploaded, str(inputs))
    assert [
        i.base_name
        for i in fs.get_file_info(pafs.FileSelector("datasets"))
        if i.base_name.startswith("killed")
    ] == ["killed"]


def test_bad_uris_are_one_line_exit_2_before_any_work(s3, uploaded, tmp_path, capsys):
    query, fs = s3
    hint = "check the bucket and key, the endpoint"
    cases = [
        (
            ["--data", f"s3://no-such-bucket/web?{query}"],
            f"not found: 'no-such-bucket' does not exist; {hint}",
        ),
        (
            ["--data", f"s3://corpus/nothing-here?{query}"],
            f"not found: 'corpus/nothing-here' does not exist; {hint}",
        ),
        (["--data", f"s3://corpus/web/*.txt?{query}"], "matches no .htm/.html/"),
        (
            ["--data", uploaded, "--out", f"s3://no-such-bucket/ds?{query}"],
            "cannot write in s3://no-such-bucket",
        ),
        (
            ["--data", f"s3://corpus/web?endpoint_override=127.0.0.1:{free_port()}&scheme=http"],
            "Could not connect",
        ),
        (
            ["--data", uploaded, "--work-dir", f"s3://corpus/work?{query}"],
            "--work-dir s3://corpus/work",
        ),
        (
            ["--data", uploaded, "--val-data", f"s3://corpus/val.txt?{query}"],
            "--val-data s3://corpus/val.txt",
        ),
    ]
    for args, message in cases:
        defaults = {"--out": str(tmp_path / "ds"), "--work-dir": str(tmp_path / "work")}
        with pytest.raises(SystemExit) as exit_info:
            sys.exit(
                data_command.main(
                    [
                        "prepare",
                        *args,
                        "--vocab-size",
                        "300",
                        *[
                            word
                            for flag, value in defaults.items()
                            if flag not in args
                            for word in (flag, value)
                        ],
                    ]
                )
            )
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    with pytest.raises(
        DataError, match="with `ray_address`: pass `work_dir` on a folder every node mounts"
    ):
        data_at_scale.prepare(
            [uploaded], f"s3://datasets/ds?{query}", engine="ray", ray_address="auto", **SETTINGS
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing written, not even a work dir
    assert [i.base_name for i in fs.get_file_info(pafs.FileSelector("corpus"))] == ["web"]


def test_download_for_the_loader_and_aws_endpoint_url(
    s3, inputs, uploaded, reference, tmp_path, monkeypatch
):
    """The loader memory-maps local shards: a URI is refused with the command that copies it down; `download`
    copies it (here with the endpoint from AWS_ENDPOINT_URL, which pyarrow reads when the URI has no query)."""
    query, fs = s3
    out = data_at_scale.prepare(
        [uploaded], f"s3://datasets/dl?{query}", work_dir=tmp_path, **SETTINGS
    )
    with pytest.raises(
        DataError, match=r"copy it down first: python data.py download s3://datasets/dl"
    ):
        data.TokenData(out)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://" + query.split("=")[1].split("&")[0])
    store.filesystem_root.cache_clear()
    try:
        local = data_at_scale.download("s3://datasets/dl", tmp_path / "dl")
    finally:
        store.filesystem_root.cache_clear()
    same_dataset(dataset_files(local), reference, uploaded, str(inputs))
    assert data.TokenData(local).get_batch("train", 2, 16)[0].shape == (2, 16)


@pytest.mark.slow
def test_ray_engine_reads_s3(s3, inputs, uploaded, reference, tmp_path):
    """--engine ray with an s3:// source and --out: each task opens its chunk's URI itself (a byte range, a row
    group), and the published objects are the reference's bytes. Starts a local Ray (20-40 s here)."""
    pytest.importorskip("ray", reason="the Ray engine needs Ray: pip install ray")
    query, fs = s3
    out = data_at_scale.prepare(
        [uploaded],
        f"s3://datasets/ray?{query}",
        engine="ray",
        work_dir=tmp_path,
        **{**SETTINGS, "workers": 2},
    )
    assert dataset.load_manifest(out)["timings"]["engine"] == "ray"
    same_dataset(objects(fs, "datasets/ray"), reference, uploaded, str(inputs))
    assert list(tmp_path.iterdir()) == []


def test_local_paths_never_import_pyarrow(inputs, tmp_path):
    """pyarrow stays optional: a local .jsonl is listed, planned, read and its manifest checked without it."""
    code = (
        f"import sys; from machinery import data_at_scale, formats; s = formats.open_source({str(inputs / '*.jsonl*')!r}); "
        f"chunks = data_at_scale.plan_chunks([s], 1 << 10); "
        f"job = data_at_scale.Job('.', (('web', 'prose'),), ('text', 'auto', False, None), None, 0, 0.1, 32, 4); "
        f"assert sum(1 for c in chunks for _ in data_at_scale.chunk_documents(job, c, formats.JsonlStats())) > 40; "
        f"assert formats.read_manifest_or_none({str(tmp_path)!r}) is None; "
        f"assert 'pyarrow' not in sys.modules, 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], cwd=pathlib.Path(data.__file__).parent, check=True)
