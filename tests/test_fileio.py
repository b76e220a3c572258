"""fileio.py: untrusted JSON in one line, atomic writes with the umask's modes, a file-size limit in one line."""

import os
import subprocess
import sys
import textwrap

import pytest

from machinery import fileio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class ChapterError(ValueError):
    pass


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "[" * 5000 + "]" * 5000,
            "nested more than",
        ),  # RecursionError in the C decoder without the scan
        ('{"a":' * 3000 + "1" + "}" * 3000, "nested more than"),
        ('{"a": 1', "not valid JSON"),
        ("9" * 5000, "not valid JSON"),  # int's digit limit: a ValueError, not a decode error
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_parse_json_turns_every_failure_into_one_line_of_the_chapters_error(text, words):
    with pytest.raises(ChapterError) as info:
        fileio.parse_json(text, "corpus.jsonl line 3", ChapterError, fix="fix that line")
    message = str(info.value)
    assert (
        words in message
        and message.startswith("corpus.jsonl line 3: ")
        and message.endswith("fix that line")
    )
    assert "\n" not in message


def test_brackets_inside_strings_do_not_count_as_depth():
    text = '["' + "[" * 5000 + '"]'
    assert fileio.parse_json(text, "x") == ["[" * 5000]


def test_read_json_names_the_file_when_missing_or_a_folder(tmp_path):
    for path in (tmp_path / "nope.json", tmp_path):
        with pytest.raises(ChapterError, match=str(path)):
            fileio.read_json(path, ChapterError)


def test_write_atomic_gives_files_the_umask_modes(tmp_path):
    old = os.umask(0o022)
    try:
        path = fileio.write_atomic(tmp_path / "a.json", "{}")
        assert oct(path.stat().st_mode & 0o777) == "0o644"  # mkstemp alone would leave 0600
        os.umask(0o077)
        assert (
            oct(fileio.write_atomic(tmp_path / "b.json", b"{}").stat().st_mode & 0o777) == "0o600"
        )
    finally:
        os.umask(old)


def test_publish_tree_opens_a_mkdtemp_folder_to_the_umask(tmp_path):
    import tempfile

    old = os.umask(0o022)
    try:
        folder = tempfile.mkdtemp(dir=tmp_path)
        open(os.path.join(folder, "x"), "w").close()
        os.chmod(os.path.join(folder, "x"), 0o600)
        fileio.publish_tree(folder)
        assert oct(os.stat(folder).st_mode & 0o777) == "0o755"
        assert oct(os.stat(os.path.join(folder, "x")).st_mode & 0o777) == "0o644"
    finally:
        os.umask(old)


def test_a_file_size_limit_is_one_line_and_leaves_no_temp_file(tmp_path):
    # Under ulimit -f (RLIMIT_FSIZE) a write past the limit fails with EFBIG: Python ignores SIGXFSZ.
    script = textwrap.dedent(f"""
        import resource, sys
        sys.path.insert(0, {ROOT!r})
        from machinery import fileio
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
        try:
            fileio.write_atomic({str(tmp_path / "big.bin")!r}, b"x" * (1 << 20), error=SystemExit,
                                fix="pass --out elsewhere")
        except SystemExit as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (
        out.stdout.strip()
        == f"no space left writing {tmp_path / 'big.bin'}: free space or pass --out elsewhere"
    )
    assert list(tmp_path.iterdir()) == []


# issue 43: output paths through a link that loops or points nowhere, or with a name over 255 bytes, were
# tracebacks (or, for book/build.py, a site built at the dangling link's target)
def test_book_build_refuses_an_odd_out_in_one_line_and_builds_nothing(tmp_path, capsys):
    sys.path.insert(0, os.path.join(ROOT, "book"))
    try:
        import build
    finally:
        sys.path.remove(os.path.join(ROOT, "book"))
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "dangling").symlink_to("nowhere")
    for out, words in (
        (tmp_path / "loop", f"{tmp_path / 'loop'} is a symbolic link that loops"),
        (tmp_path / "dangling", "is a symbolic link to nowhere, which does not exist"),
        (tmp_path / ("x" * 256), "a name of 256 bytes"),
    ):
        assert build.main(["--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert (
            err.startswith("book/build.py: error: --out: ")
            and words in err
            and len(err.splitlines()) == 1
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dangling", "loop"]
