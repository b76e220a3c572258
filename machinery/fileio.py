"""Files in and out, the same way in every chapter: untrusted JSON read in one line of error, files
published whole.

Serves: every chapter (bpe, dedup, data, train, evaluate, scaling) and the engine, bridge and bench
files.

Depends on the standard library only (no sibling files), so a chapter copied into another project
takes this one small file along.

Three promises of the README live here, so each chapter keeps them in one way:

1. **Untrusted JSON gives one line, never a traceback.** `json.loads` raises four different things
   on bad input: `JSONDecodeError` (bad syntax), `UnicodeDecodeError` (bytes that are not UTF-8),
   `ValueError` (an integer of more than 4,300 digits) and `RecursionError` (arrays nested a few
   thousand deep: `"[" * 5000`). `parse_json` turns each into the chapter's own error class with the
   file's name and the fix:

   >>> parse_json('{"a": [1, 2]}', "config.json")
   {'a': [1, 2]}
   >>> parse_json("[" * 5000, "config.json")  # doctest: +ELLIPSIS
   Traceback (most recent call last):
   ...
   ValueError: config.json: JSON nested more than 1,000 levels deep; ...: regenerate the file

   A parsed document is then checked field by field with `expect` (a type, a range, a file name
   that stays in its folder), so a tokenizer.json, a checkpoint or a shard index with a string
   where an object belongs is one line naming the file and the field, not a traceback later.

2. **Nothing half-written.** `write_atomic` writes a temp file in the destination's folder, flushes
   and fsyncs it, then renames it over the destination: a reader (or a crash) sees the old file or
   the new one, never half.

3. **Files for others to read get the umask's modes, and a full disk is one line.**
   `tempfile.mkstemp` creates 0600 files and `mkdtemp` 0700 folders, private to their owner; renamed
   into place they would stay private, so a dataset prepared on a shared machine could not be read
   by another account. `publish_mode` gives what `open()` would have: 0666 & ~umask (0644 under the
   usual umask 022). A write that fails with ENOSPC, EDQUOT or EFBIG (a full disk, a quota, `ulimit
   -f`) becomes `no space left writing PATH: free space or <fix>`, and the temp file is removed.

4. **One process at a time in a folder, and no lock outlives its holder.** `hold` takes an
   exclusive POSIX record lock (`lockf`) on a lock file and writes its pid there. The kernel drops
   it when the process dies, SIGKILL included, and a forked child (a worker) does not inherit it
   (a `flock` it would: a surviving worker would keep it), so a lock never stays stuck; a killed
   holder only leaves its pid in the file, which the next holder reports as stale (`train.py`
   says so), while a clean exit removes the file. data.py's prepare waits for the lock (the second
   of two identical prepares then reuses the first's dataset); train.py refuses a held --out-dir.
   The lock file is opened without following a link and without truncating, and must be a regular
   file of one link: the prepare's lock sits beside --out, which may be a folder others write
   (/tmp), and a link planted there would have our pid overwrite its target. A link, directory or
   FIFO is refused in one line instead.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import pathlib
import stat
import tempfile
from typing import Callable, Iterator

# deeper than anything we write by two orders of magnitude, shallower than the C stack
MAX_JSON_DEPTH = 1000
NO_SPACE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def _depth_exceeds(text: str, limit: int) -> bool:
    """True when brackets outside strings nest deeper than `limit` (a linear scan, no recursion).

    >>> _depth_exceeds('[[["]]]]]]"]]]', 3), _depth_exceeds('[[[[]]]]', 3)
    (False, True)
    """
    depth, in_string, escaped = 0, False, False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def parse_json(
    text: str | bytes,
    where: str,
    error: type[Exception] = ValueError,
    fix: str = "regenerate the file",
):
    """json.loads for text from outside: any failure raises `error` with one line naming `where` and
    the fix.

    >>> parse_json('{"vocab": 3', "tok.json", fix="re-run bpe.py train")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: tok.json: not valid JSON (Expecting ',' delimiter at line 1, column 12); re-run ...
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as e:
            raise error(f"{where}: not UTF-8 text (byte {e.start}); {fix}") from None
    # The C decoder recurses once per level; a deep document would reach Python's recursion limit
    # somewhere inside it. Only a document that opens more brackets than the limit allows needs the
    # scan.
    if text.count("[") + text.count("{") > MAX_JSON_DEPTH and _depth_exceeds(text, MAX_JSON_DEPTH):
        raise error(
            f"{where}: JSON nested more than {MAX_JSON_DEPTH:,} levels deep; this project writes "
            f"at most a few levels: {fix}"
        )
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(
            f"{where}: not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); {fix}"
        ) from None
    except RecursionError:
        raise error(f"{where}: JSON nested too deeply to read; {fix}") from None
    # e.g. an integer longer than int's 4,300-digit string limit
    except ValueError as e:
        raise error(f"{where}: not valid JSON ({str(e).splitlines()[0]}); {fix}") from None


def expect(
    value,
    kind,
    where: str,
    shape: str,
    error: type[Exception] = ValueError,
    fix: str = "regenerate the file",
    ok: Callable = lambda value: True,
):
    """`value` if it is a `kind` (a bool never stands for a number) and `ok(value)`, else `error`
    with one line naming the file's field and what it must be: every reader of a format from
    outside (tokenizer.json, a checkpoint, a shard index) checks its fields with this one helper.

    >>> expect(-5, int, "tok.json: model.vocab['a']", "an id >= 0", ok=lambda i: i >= 0)
    Traceback (most recent call last):
    ...
    ValueError: tok.json: model.vocab['a'] is '-5', not an id >= 0; regenerate the file
    """
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool or not ok(value):
        raise error(f"{where} is {str(value)[:40]!r}, not {shape}; {fix}")
    return value


def read_json(
    path: str | os.PathLike, error: type[Exception] = ValueError, fix: str = "regenerate the file"
):
    """Read and parse a JSON file; a missing, unreadable or damaged file raises `error` in one
    line."""
    path = pathlib.Path(path)
    if path.is_dir():
        raise error(f"{path}: is a folder, not a JSON file; {fix}")
    try:
        data = path.read_bytes()
    except OSError as e:
        raise error(f"{path}: cannot read it ({e.strerror or e}); {fix}") from None
    return parse_json(data, str(path), error, fix)


def umask() -> int:
    """The process's umask (reading it means setting it, so it is set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish_mode(is_dir: bool = False) -> int:
    """The mode `open()` or `mkdir()` would give a new file or folder: 0666 (0777) less the umask.

    >>> old = os.umask(0o022)
    >>> oct(publish_mode()), oct(publish_mode(is_dir=True))
    ('0o644', '0o755')
    >>> _ = os.umask(old)
    """
    return (0o777 if is_dir else 0o666) & ~umask()


def publish_tree(root: str | os.PathLike) -> None:
    """Give a folder made by mkdtemp, and everything under it, the umask's modes before it is
    renamed into place."""
    root = pathlib.Path(root)
    root.chmod(publish_mode(is_dir=True))
    for path in root.rglob("*"):
        if not path.is_symlink():
            path.chmod(publish_mode(is_dir=path.is_dir()))


def is_no_space(exc: BaseException) -> bool:
    """True for the errors of a full disk, a full quota or a file-size limit (ulimit -f)."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            return True
        # torch.save wraps the OSError in a RuntimeError from its C++ writer; safetensors' Rust
        # writer raises its own SafetensorError (an Exception), "... No space left on device (os
        # error 28)", with neither cause nor context
        text = str(exc)
        wrapped = isinstance(exc, RuntimeError) or type(exc).__name__ == "SafetensorError"
        if wrapped and (
            "No space left" in text
            or "File too large" in text
            or "file write failed" in text
            or "Disk quota exceeded" in text
        ):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def no_space_message(path, fix: str) -> str:
    return f"no space left writing {path}: free space or {fix}"


def write_atomic(
    path: str | os.PathLike,
    content: str | bytes | Callable,
    *,
    error: type[Exception] = OSError,
    fix: str = "write it elsewhere",
    fsync: bool = True,
) -> pathlib.Path:
    """Write `content` (text, bytes, or a function given the open binary file) to `path` whole, or
    not at all.

    >>> import tempfile; d = pathlib.Path(tempfile.mkdtemp())
    >>> write_atomic(d / "a.txt", "hello").read_text(), [p.name for p in d.iterdir()]
    ('hello', ['a.txt'])
    """
    path = pathlib.Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(content):
                content(f)
            else:
                f.write(content.encode("utf-8") if isinstance(content, str) else content)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.chmod(tmp, publish_mode())
        os.replace(tmp, path)
    except BaseException as e:
        pathlib.Path(tmp).unlink(missing_ok=True)
        if isinstance(e, Exception) and is_no_space(e):
            raise error(no_space_message(path, fix)) from None
        raise
    return path


# bytes in one file name, in a whole path (Linux, most file systems)
NAME_MAX, PATH_MAX = 255, 4095


def output_path_problem(path: str | os.PathLike) -> str | None:
    """What makes `path` unusable as an output, in words, or None: a name over 255 bytes, a path
    over 4,095, or on the way to it a symbolic link that loops or points nowhere (mkdir and
    rename would fail on each only at the end of the work). Checks only.

    >>> output_path_problem("out/" + "x" * 300)
    'a name of 300 bytes (xxxxxxxxxxxxxxxxxxxx...), over the 255-byte limit'
    """
    absolute = pathlib.Path(path).absolute()
    for name in absolute.parts:
        size = len(os.fsencode(name))
        if size > NAME_MAX:
            return f"a name of {size:,} bytes ({name[:20]}...), over the {NAME_MAX}-byte limit"
    size = len(os.fsencode(str(absolute)))
    if size > PATH_MAX:
        return f"a path of {size:,} bytes, over the {PATH_MAX:,}-byte limit"
    for step in (*reversed(absolute.parents), absolute):
        if not os.path.lexists(step):
            return None
        if not step.is_symlink():
            continue
        try:
            step.stat()
        except OSError as e:
            if e.errno == errno.ELOOP:
                return f"{step} is a symbolic link that loops"
            if e.errno == errno.ENOENT:
                return f"{step} is a symbolic link to {os.readlink(step)}, which does not exist"
            return f"{step} cannot be followed ({e.strerror})"
    return None


def missing_folders(folder: str | os.PathLike) -> list[pathlib.Path]:
    """`folder` and its parents that do not exist yet, deepest first: what mkdir(parents=True)
    makes."""
    folder = pathlib.Path(folder).absolute()
    return [p for p in (folder, *folder.parents) if not p.exists()]


def remove_if_empty(folders: list[pathlib.Path]) -> None:
    """Remove the folders a failed run made (deepest first), unless something else has been put
    in them since."""
    for folder in folders:
        with contextlib.suppress(OSError):
            folder.rmdir()


def lock_kind(mode: int) -> str | None:
    """What an opened lock path is, in words, when it is not a regular file we may write our pid
    in (None for a regular file)."""
    kinds = (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next(
        (name for is_kind, name in kinds if is_kind(mode)),
        None if stat.S_ISREG(mode) else "not a regular file",
    )


def open_lock(path: pathlib.Path, error: type[Exception], fix: str) -> int:
    """Open (or create) the lock file `path` for reading and writing, never through a symbolic
    link and never truncating: the lock path may sit in a folder others can write (the system
    temporary folder), where a link planted there would make our pid overwrite its target. A path
    that is a link, a directory, a FIFO or a device (or a hard link to another file) raises
    `error` in one line naming it and what it is."""
    try:
        # One open, then fstat, so nothing can be swapped in between a check and the open:
        # O_NOFOLLOW fails on a link (ELOOP), O_RDWR on a directory (EISDIR) and a socket (ENXIO);
        # O_NONBLOCK keeps a FIFO from hanging the open (fstat then refuses it); no O_TRUNC: the
        # file is only written once it is ours and locked.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, publish_mode())
    except OSError as e:
        what = {
            errno.ELOOP: "a symbolic link",
            errno.EISDIR: "a directory",
            errno.ENXIO: "a socket",
        }.get(e.errno)
        if what:
            raise error(f"lock file {path} is {what}, not a regular file: {fix}") from None
        raise error(f"cannot open lock file {path} ({e.strerror}): {fix}") from None
    info = os.fstat(fd)
    kind = lock_kind(info.st_mode)
    if not kind and info.st_nlink > 1:
        kind = "a hard link to another file"
    if kind:
        os.close(fd)
        raise error(f"lock file {path} is {kind}, not a regular file: {fix}")
    return fd


@contextlib.contextmanager
def hold(
    path: str | os.PathLike,
    on_busy: Callable[[str], None],
    error: type[Exception] = OSError,
    fix: str = "remove it",
) -> Iterator[tuple[str | None, str | None]]:
    """Hold an exclusive lock on the file `path` for the block (the file and its folders made,
    our pid written in it).

    When another live process holds it, `on_busy(its pid)` is called first: raise there to
    refuse, or return to wait until the holder ends (or dies). Yields (busy, stale): the pid
    waited for, and the pid a killed holder left in the file, each None when there was none. On
    leaving, the file (and the folders made) are removed. A lock path that is not a regular file
    (a symbolic link, a directory, a FIFO) raises `error` with the `fix` (`open_lock`): it is
    never followed, truncated or written.

    >>> import tempfile; lock = pathlib.Path(tempfile.mkdtemp()) / "x.lock"
    >>> with hold(lock, print) as (busy, stale):
    ...     lock.read_text() == str(os.getpid()), busy, stale
    (True, None, None)
    >>> lock.exists()
    False
    """
    import fcntl  # POSIX only: imported here, so the rest works everywhere

    path, busy = pathlib.Path(path), None
    made = missing_folders(path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        how = fcntl.LOCK_EX | fcntl.LOCK_NB
        while True:
            fd = open_lock(path, error, fix)
            try:
                fcntl.lockf(fd, how)
            except (BlockingIOError, PermissionError):  # EAGAIN or EACCES: held
                busy = os.pread(fd, 32, 0).decode(errors="replace") or "unknown"  # not written yet
                os.close(fd)
                on_busy(busy)
                how = fcntl.LOCK_EX  # then wait for it
                continue
            # A holder that ended cleanly removed the file we waited on: lock the new one instead.
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    break
            os.close(fd)
        stale = os.pread(fd, 33, 0).decode(errors="replace").strip() or None
        if stale is not None and not (stale.isascii() and stale.isdigit() and len(stale) < 33):
            os.close(fd)
            raise error(f"lock file {path} holds something other than a pid: {fix}")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield busy, stale
        finally:
            path.unlink(missing_ok=True)  # still locked: no one locks the file being removed
            os.close(fd)
    finally:
        remove_if_empty(made)


if __name__ == "__main__":
    # no commands of its own: --help (or no argument) says what runs this file
    from machinery import cli

    cli.help_only(
        __doc__, "No commands of its own: every chapter reads and writes its files through it."
    )
