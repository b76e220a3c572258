"""store.py: object-store I/O for data.py and its engine: URIs in, files and datasets out, one line
per failure.

Serves: data.py (its sources and --out may be URIs) and data_at_scale.py (a cluster's corpus and
datasets live in an object store). It is the layer below them, so it imports neither.

Depends on the standard library only (no sibling files), and on pyarrow, imported only when a URI is
met (a plain path never imports it).

A source or --out may be a URI that pyarrow.fs understands: s3://bucket/key, gs://bucket/key,
hdfs://host:port/path, file:///abs/path. Its query configures the store, as FileSystem.from_uri
reads it (s3://bucket/key?endpoint_override=HOST:PORT&scheme=http for MinIO or a local S3; or set
AWS_ENDPOINT_URL):

    s3://bkt/web/a.jsonl?endpoint_override=minio:9000
        ->  (S3FileSystem of minio:9000, "bkt/web/a.jsonl")

A file of a source is then named by its own URI (a str), a local one by a pathlib.Path, so a chunk
on any node opens it: a .jsonl byte range is one seek and sequential reads, a .parquet row group a
byte range. The cache key fingerprints each object by its size and mtime (`list_files`).

An object store has no directory rename, so publishing a dataset is a protocol (`publish`): upload
everything under OUT.tmp-XXXX/, copy each object inside the store to OUT/ with manifest.json last,
delete the temporary prefix. A reader that waits for OUT/manifest.json never sees half a dataset.

Every function that can fail takes `error`, the class the caller's chapter raises (data.py passes
DataError), as fileio.py's readers do: the message is one line naming the URI, and STORE_HINT says
what to check.
"""

from __future__ import annotations

import contextlib
import fnmatch
import functools
import gzip
import io
import itertools
import os
import pathlib
import re
import shutil
import time
import urllib.parse
from typing import Callable, Iterator

_URI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
STORE_HINT = (
    "check the bucket and key, the endpoint (?endpoint_override=HOST:PORT&scheme=http or "
    "AWS_ENDPOINT_URL) "
    "and the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the node's role)"
)


class StoreError(ValueError):
    """A store that cannot be reached or read, when the caller names no error class of its own."""


def is_uri(path) -> bool:
    """Whether a path names an object-store location rather than a local file.

    >>> is_uri("s3://bucket/web/a.jsonl"), is_uri("file:///data/a.jsonl"), is_uri("web/a.jsonl")
    (True, True, False)
    """
    return isinstance(path, str) and bool(_URI.match(path))


def first_line(error: BaseException) -> str:
    """The first line of an exception's message (pyarrow's run over many), at most 240
    characters."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:240]


@functools.lru_cache(maxsize=None)
def filesystem_root(
    scheme: str, netloc: str, query: str, error: type[Exception] = StoreError
) -> tuple:
    """(pyarrow FileSystem, its path of the URI's root), one per bucket and settings: from_uri may
    ask the network (an S3 bucket's region), so it runs once per process, not once per file. A
    forked worker clears this cache (`filesystem_root.cache_clear`) to make its own clients."""
    try:
        import pyarrow.fs as pafs
    except ImportError:
        raise error(
            f"{scheme}:// paths need pyarrow (pip install pyarrow), or copy the files to local disk"
        ) from None
    uri = f"{scheme}://{netloc}/" + (f"?{query}" if query else "")
    try:
        fs, root = pafs.FileSystem.from_uri(uri)
    # ArrowInvalid is a ValueError: an unknown scheme or option
    except (OSError, ValueError) as e:
        raise error(f"{uri}: {first_line(e)}; {STORE_HINT}") from None
    return fs, root.rstrip("/")


def filesystem(uri: str, error: type[Exception] = StoreError) -> tuple:
    """(FileSystem, path inside it) of a URI: s3://bkt/web/a.jsonl?... -> (S3FileSystem,
    'bkt/web/a.jsonl')."""
    parts = urllib.parse.urlsplit(uri)
    fs, root = filesystem_root(parts.scheme, parts.netloc, parts.query, error)
    inside = urllib.parse.unquote(parts.path).strip("/")
    return fs, f"{root}/{inside}" if inside else root or "/"


def uri_of(uri: str, path: str, error: type[Exception] = StoreError) -> str:
    """The URI of `path` in the store of `uri` (the inverse of `filesystem`, keeping uri's
    query)."""
    parts = urllib.parse.urlsplit(uri)
    root = filesystem_root(parts.scheme, parts.netloc, parts.query, error)[1]
    return urllib.parse.urlunsplit(
        (parts.scheme, parts.netloc, urllib.parse.quote(path[len(root) :]), parts.query, "")
    )


def pure_path(path: pathlib.Path | str) -> pathlib.PurePath:
    """The path part of a URI (for names and suffixes), or the local path itself."""
    return (
        pathlib.PurePosixPath(urllib.parse.unquote(urllib.parse.urlsplit(path).path))
        if is_uri(path)
        else pathlib.Path(path)
    )


@contextlib.contextmanager
def open_input(
    path: pathlib.Path | str,
    unzip: bool = False,
    buffer: int = 1 << 20,
    error: type[Exception] = StoreError,
) -> Iterator[io.BufferedIOBase]:
    """A local file or an object (pyarrow's random-access file, buffered: a seek, then a request per
    `buffer` bytes, not one per line), read as is or through gzip."""
    if is_uri(path):
        fs, key = filesystem(path, error)
        raw = io.BufferedReader(fs.open_input_file(key), buffer)
    else:
        raw = open(path, "rb")
    with raw:
        yield gzip.GzipFile(fileobj=raw) if unzip else raw


def exists(uri: str, name: str, error: type[Exception] = StoreError) -> bool:
    """Whether the object URI/NAME exists. An endpoint that refuses or does not answer (or denies
    access) is `error`, not False: "no dataset there" and "no store there" need different fixes."""
    fs, path = filesystem(uri, error)
    import pyarrow.fs as pafs  # `filesystem` has checked it is installed

    try:
        return fs.get_file_info(f"{path}/{name}").type != pafs.FileType.NotFound
    except OSError as e:
        raise error(f"{uri}: cannot reach it ({first_line(e)}); {STORE_HINT}") from None


def file_size(path: pathlib.Path | str, error: type[Exception] = StoreError) -> int:
    if is_uri(path):
        fs, key = filesystem(path, error)
        return fs.get_file_info(key).size
    return path.stat().st_size


def match_glob(pattern: list[str], parts: list[str]) -> bool:
    """A key's parts against a glob's, as glob.glob(recursive=True) matches folders: * and [...]
    within a part, ** across any number of parts.

    >>> match_glob("web/**/*.jsonl".split("/"), "web/2024/01/a.jsonl".split("/"))
    True
    >>> match_glob("web/*.jsonl".split("/"), "web/2024/a.jsonl".split("/"))
    False
    """
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(match_glob(pattern[1:], parts[k:]) for k in range(len(parts) + 1))
    return (
        bool(parts)
        and fnmatch.fnmatchcase(parts[0], pattern[0])
        and match_glob(pattern[1:], parts[1:])
    )


def list_files(
    spec: str,
    readable: Callable[[pathlib.PurePath], bool],
    kinds: str,
    error: type[Exception] = StoreError,
) -> list[tuple[str, int, int]]:
    """(URI, size, mtime in ns) of the objects a source URI names: one object, every object
    `readable` accepts under a prefix ("a directory"), or those matching a glob in the key (* [...]
    **; in a URI ? starts the query). kinds names the readable file types for the message. One line
    naming the spec for a missing bucket, key or endpoint, bad credentials, or a glob matching
    nothing."""
    fs, path = filesystem(spec, error)
    import pyarrow.fs as pafs  # `filesystem` has checked it is installed

    key = path.split("/")
    fixed = next((k for k, part in enumerate(key) if any(c in part for c in "*[")), len(key))
    try:
        if fixed == len(key):
            info = fs.get_file_info(path)
            if info.type == pafs.FileType.File:
                return [(spec, info.size, info.mtime_ns)]
            # name the first part that is missing: the bucket?
            if info.type == pafs.FileType.NotFound:
                missing = next(
                    (
                        p
                        for p in itertools.accumulate(key, lambda a, b: f"{a}/{b}")
                        if p and fs.get_file_info(p).type == pafs.FileType.NotFound
                    ),
                    path,
                )
                raise error(f"source {spec!r} not found: {missing!r} does not exist; {STORE_HINT}")
        base = "/".join(key[:fixed])
        found = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    # no such bucket, no answer from the endpoint, access denied
    except OSError as e:
        raise error(f"source {spec!r}: {first_line(e)}; {STORE_HINT}") from None
    files = []
    for info in sorted(found, key=lambda i: i.path):
        inside = info.path[len(base) :].strip("/").split("/")
        if (
            info.type == pafs.FileType.File
            and readable(pure_path(info.path))
            and not any(part.startswith(".") for part in inside)
            and (fixed == len(key) or match_glob(key[fixed:], inside))
        ):
            files.append((uri_of(spec, info.path, error), info.size, info.mtime_ns))
    if not files:
        raise error(
            f"source {spec!r} matches no {kinds} objects; check the "
            f"{'pattern' if fixed < len(key) else 'prefix'}"
        )
    return files


# Publishing a dataset into a store, and taking one out.


def check_out(out_uri: str, dataset_file: re.Pattern, error: type[Exception] = StoreError) -> None:
    """Before any work: OUT/ in the store is empty, or holds what a killed publish left (files whose
    names dataset_file matches, without a manifest, replaced by the next publish); a missing bucket,
    no answer or other objects are one line."""
    import pyarrow.fs as pafs

    fs, out = filesystem(out_uri, error)
    if "/" not in out.strip("/"):
        raise error(
            f"`out` {out_uri} is a bucket: give a prefix inside it, e.g. s3://bucket/datasets/name"
        )
    try:
        if fs.get_file_info(out).type == pafs.FileType.File:
            raise error(
                f'`out` {out_uri} is an object, not a prefix; give a prefix (a "directory") URI'
            )
        found = fs.get_file_info(pafs.FileSelector(out, recursive=True, allow_not_found=True))
    except OSError as e:
        raise error(f"`out` {out_uri}: {first_line(e)}; {STORE_HINT}") from None
    foreign = [
        i.path
        for i in found
        if i.type == pafs.FileType.File and not dataset_file.fullmatch(i.base_name)
    ]
    if foreign:
        raise error(
            f"`out` {out_uri} holds objects that are not a dataset ({foreign[0]}); remove them or "
            "pick another `out`"
        )


def check_writable(out_uri: str, error: type[Exception] = StoreError) -> None:
    """Raise `error` unless an object can be written (and deleted) beside OUT: a probe
    OUT.tmp-check-* object."""
    fs, out = filesystem(out_uri, error)
    probe = f"{out}.tmp-check-{os.getpid()}-{time.time_ns()}"
    try:
        fs.open_output_stream(probe).close()
        fs.delete_file(probe)
    except OSError as e:
        raise error(f"cannot write in {out_uri} ({first_line(e)}); {STORE_HINT}") from None


def publish(tmp_dir: pathlib.Path, out_uri: str, error: type[Exception] = StoreError) -> None:
    """Publish a finished dataset folder to OUT in an object store, which has no directory rename:
    upload every file under OUT.tmp-XXXX/, copy each inside the store to OUT/ (a server-side copy),
    manifest.json last, then delete the temporary prefix. A reader that waits for OUT/manifest.json
    never sees part of a dataset, and a run killed on the way leaves no manifest. Objects already in
    OUT/ are a killed publish's (`check_out`)."""
    import pyarrow.fs as pafs

    fs, out = filesystem(out_uri, error)
    tmp = f"{out}.tmp-{os.getpid()}-{time.time_ns()}"
    # the manifest last
    names = sorted(p.name for p in tmp_dir.iterdir() if p.name != "manifest.json")
    names += ["manifest.json"]
    try:
        # a no-op in a bucket; a folder for file:// and hdfs://
        fs.create_dir(tmp)
        fs.create_dir(out)
        # streamed: a multipart upload for a large shard
        for name in names:
            with (
                open(tmp_dir / name, "rb") as local,
                fs.open_output_stream(f"{tmp}/{name}", compression=None) as remote,
            ):
                shutil.copyfileobj(local, remote, 8 << 20)
        for info in fs.get_file_info(pafs.FileSelector(out, recursive=True, allow_not_found=True)):
            if info.type == pafs.FileType.File and info.base_name not in names:
                fs.delete_file(info.path)
        for name in names:
            fs.copy_file(f"{tmp}/{name}", f"{out}/{name}")
    except OSError as e:
        raise error(
            f"publishing to {out_uri} failed ({first_line(e)}); run again to retry"
        ) from None
    finally:
        with contextlib.suppress(OSError):
            fs.delete_dir(tmp)


def remove_stale_publishes(out_uri: str, error: type[Exception] = StoreError) -> None:
    """Delete the OUT.tmp-* prefixes that killed publishes left beside OUT (never read: a publish
    ends with the manifest's copy)."""
    import pyarrow.fs as pafs

    fs, out = filesystem(out_uri, error)
    parent, _, leaf = out.rpartition("/")
    for info in fs.get_file_info(pafs.FileSelector(parent, allow_not_found=True)):
        if info.base_name.startswith(f"{leaf}.tmp-") and info.type == pafs.FileType.Directory:
            fs.delete_dir(info.path)


def copy_down(
    uri: str, names: list[str], directory: pathlib.Path, error: type[Exception] = StoreError
) -> None:
    """Copy the objects URI/NAME for each name into a local directory, streamed in 8 MiB pieces."""
    fs, path = filesystem(uri, error)
    for name in names:
        with (
            fs.open_input_stream(f"{path}/{name}", compression=None) as remote,
            open(directory / name, "wb") as local,
        ):
            shutil.copyfileobj(remote, local, 8 << 20)


if __name__ == "__main__":
    # no commands of its own: --help (or no argument) says what runs this file
    from machinery import cli

    cli.help_only(
        __doc__,
        "No commands of its own: `python data.py prepare --data s3://... --out s3://...` runs it.",
    )
