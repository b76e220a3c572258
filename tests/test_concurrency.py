"""Two runs that share a folder, as real processes. Two `data.py prepare` of one recipe take turns
(the second waits, then reuses the first's dataset; if the first is SIGKILLed it builds it
itself), and two `train.py` into one --out-dir: the second refuses in one line naming the first's
pid; after a SIGKILL the next run takes the stale lock over and says so. The first prepare stops
itself (SIGSTOP) the moment it holds the lock, and stays stopped while the second one arrives, so
no timing can race: the small build holds its lock for ~60 ms, less than a poll could be sure to
see."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

from machinery import fileio

ROOT = pathlib.Path(__file__).resolve().parent.parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def start(*argv) -> subprocess.Popen:
    """A CLI in its own process group (its worker processes die with it on a kill of the group)."""
    return subprocess.Popen(
        [sys.executable, *map(str, argv)],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(condition, what: str, timeout_s: float = 60):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def lock_holder(lock: pathlib.Path) -> str:
    try:
        return lock.read_text()
    except FileNotFoundError:
        return ""


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=120)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> pathlib.Path:
    import random

    rng, words = random.Random(0), "alpha beta gamma delta epsilon zeta eta theta iota".split()
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text("\n\n".join(" ".join(rng.choice(words) for _ in range(60)) for _ in range(300)))
    return path


def prepare(corpus, out, pause_holding_the_lock=False) -> subprocess.Popen:
    """`data.py prepare` as a user runs it; paused, it says "locked" on stderr and stops itself
    (SIGSTOP) as soon as fileio.hold has given it the lock, before any work."""
    argv = ["prepare", "--data", corpus, "--vocab-size", 300, "--workers", 1, "--out", out]
    if not pause_holding_the_lock:
        return start("data.py", *argv)
    code = (
        "import contextlib, os, runpy, signal, sys\nfrom machinery import fileio\n"
        "hold = fileio.hold\n"
        "@contextlib.contextmanager\n"
        "def hold_then_stop(path, on_busy, *how):\n"
        "    with hold(path, on_busy, *how) as held:\n"
        "        print('locked', file=sys.stderr, flush=True)\n"
        "        os.kill(os.getpid(), signal.SIGSTOP)\n"
        "        yield held\n"
        "fileio.hold = hold_then_stop\n"
        "sys.argv = ['data.py', *sys.argv[1:]]\n"
        "runpy.run_path('data.py', run_name='__main__')\n"
    )
    return start("-c", code, *argv)


def stopped(pid: int) -> bool:
    """The process is stopped by a signal (state T in /proc/PID/stat)."""
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


@pytest.mark.parametrize("kill_first", [False, True])
def test_two_prepares_of_one_recipe_take_turns(corpus, tmp_path, kill_first):
    out, lock = tmp_path / "ds", tmp_path / ".ds.lock"
    first = prepare(corpus, out, pause_holding_the_lock=True)
    assert first.stderr.readline() == "locked\n"
    wait_for(lambda: stopped(first.pid), "the first prepare to stop itself")
    assert lock_holder(lock) == str(first.pid)
    second = prepare(corpus, out)
    waiting = second.stderr.readline()
    assert waiting == f"waiting for process {first.pid}, which is preparing {out}\n"
    if kill_first:
        os.killpg(first.pid, signal.SIGKILL)  # the holder and its workers
    else:
        os.kill(first.pid, signal.SIGCONT)
    first_rc, _, first_err = finish(first)
    rc, stdout, stderr = finish(second)
    assert rc == 0 and "Traceback" not in stderr, stderr
    assert first_rc == (-signal.SIGKILL if kill_first else 0), first_err
    # Not killed, the first built it and the second reused it; killed, the second built it.
    assert ("reusing" in stdout) != kill_first, stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["splits"]["train"]["tokens"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds"]  # no lock, work or temp left


def test_hold_refuses_in_the_callback_and_survives_a_killed_holder(tmp_path):
    """fileio.hold across processes: held -> on_busy gets the holder's pid; killed -> stale pid."""
    lock = tmp_path / "sub" / "x.lock"
    # The holder forks a worker that outlives it (as a killed prepare's workers may): the lock
    # must not pass to it (a flock would).
    code = (
        f"import os, time\nfrom machinery import fileio\nwith fileio.hold({str(lock)!r}, print):\n"
        f"    if os.fork() == 0:\n        time.sleep(60)\n        os._exit(0)\n"
        f"    print('held', flush=True)\n    time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert holder.stdout.readline() == "held\n"
    busy = []

    def refuse(pid):
        busy.append(pid)
        raise RuntimeError("busy")

    with pytest.raises(RuntimeError):
        with fileio.hold(lock, refuse):
            pass
    assert busy == [str(holder.pid)] and lock.read_text() == str(holder.pid)  # file untouched
    holder.kill()  # the holder alone: its worker lives on
    holder.wait()
    try:
        with fileio.hold(lock, refuse) as (was_busy, stale):
            assert (was_busy, stale) == (None, str(holder.pid))
            assert lock.read_text() == str(os.getpid())
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
    assert not lock.exists()
    with fileio.hold(tmp_path / "new" / "deeper" / "y.lock", refuse):
        assert (tmp_path / "new" / "deeper").is_dir()
    assert not (tmp_path / "new").exists()  # the folders made for it go with it


TRAIN_ARGS = [
    "--model",
    "tiny",
    "--model-args",
    "n_layer=1,n_head=2,n_kv_head=2,n_embd=16,block_size=16",
    "--batch-size",
    "2",
    "--block-size",
    "16",
    "--eval-batches",
    "1",
    "--num-samples",
    "0",
    "--log-interval",
    "1000",
    "--peak-flops",
    "1e12",
]


def test_second_train_into_one_out_dir_refuses_and_a_killed_runs_lock_is_taken_over(
    corpus, tmp_path
):
    from machinery import dataset

    data_dir = dataset.prepare([str(corpus)], tmp_path / "data", vocab_size=300)
    out, lock = tmp_path / "run", tmp_path / "run" / ".train.lock"
    run = ["train.py", "--data", data_dir, "--out-dir", out, *TRAIN_ARGS]
    first = start(
        *run, "--max-steps", 100_000, "--eval-interval", 100_000, "--ckpt-interval", 100_000
    )
    wait_for(lambda: lock_holder(lock) == str(first.pid), "the first run to hold --out-dir")
    rc, stdout, stderr = finish(start(*run, "--max-steps", 2))
    assert (
        rc == 2
        and stdout == ""
        and stderr
        == (
            f"train.py: error: --out-dir {out} is in use by another run (pid {first.pid}): wait for it "
            f"to end, stop it (kill {first.pid}), or pick another --out-dir\n"
        )
    )
    assert first.poll() is None and lock_holder(lock) == str(first.pid)  # the first goes on
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    assert lock_holder(lock) == str(first.pid)  # a SIGKILL removes nothing: its pid stays
    rc, stdout, stderr = finish(start(*run, "--max-steps", 2, "--eval-interval", 2, "--overwrite"))
    assert rc == 0 and "Traceback" not in stderr, stderr
    assert (
        f"--out-dir {out}: taking over the lock of process {first.pid}, which ended without "
        f"releasing it (killed?)"
    ) in stdout.splitlines()
    assert not lock.exists() and (out / "metrics.jsonl").is_file()


# issue 43: a lock path planted by someone else (in --out's parent, which may be the system
# temporary folder) is never followed, opened or written: a link to a victim, a directory, a FIFO,
# a hard link are each refused in one line naming the path and what it is.
def plant(kind: str, lock: pathlib.Path, victim: pathlib.Path) -> None:
    if kind == "symbolic link":
        lock.symlink_to(victim)
    elif kind == "directory":
        lock.mkdir()
    elif kind == "FIFO":
        os.mkfifo(lock)
    else:
        os.link(victim, lock)


LOCK_KINDS = ["symbolic link", "directory", "FIFO", "hard link to another file"]


@pytest.mark.parametrize("kind", LOCK_KINDS)
def test_hold_refuses_a_lock_path_that_is_not_a_regular_file_and_changes_nothing(tmp_path, kind):
    victim, lock = tmp_path / "victim.txt", tmp_path / "x.lock"
    victim.write_text("keep\n")
    plant(kind, lock, victim)
    with pytest.raises(ValueError) as info:
        with fileio.hold(lock, print, ValueError, "remove it"):
            pass
    assert str(info.value) == f"lock file {lock} is a {kind}, not a regular file: remove it"
    assert victim.read_text() == "keep\n" and os.path.lexists(lock)


def test_hold_takes_over_a_dead_holders_file_but_never_truncates_other_data(tmp_path):
    lock = tmp_path / "x.lock"
    lock.write_text("999999999\n")  # a pid no process has: a killed holder's
    with fileio.hold(lock, print, ValueError) as (busy, stale):
        assert (busy, stale, lock.read_text()) == (None, "999999999", str(os.getpid()))
    lock.write_text("a file of the user's that happens to have this name\n")
    with pytest.raises(ValueError, match="holds something other than a pid"):
        with fileio.hold(lock, print, ValueError):
            pass
    assert lock.read_text() == "a file of the user's that happens to have this name\n"


@pytest.mark.parametrize("kind", ["symbolic link", "FIFO"])
def test_prepare_and_train_refuse_a_planted_lock_in_one_line(corpus, tmp_path, kind, capsys):
    from machinery.commands import train as train_command

    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    plant(kind, tmp_path / ".ds.lock", victim)
    (tmp_path / "run").mkdir()
    plant(kind, tmp_path / "run" / ".train.lock", victim)
    from machinery.commands import data as data_command

    runs = (
        (
            "data",
            lambda argv: sys.exit(data_command.main(argv)),
            [
                "prepare",
                "--data",
                str(corpus),
                "--vocab-size",
                "300",
                "--out",
                str(tmp_path / "ds"),
            ],
            ".ds.lock",
            "--out",
        ),
        (
            "train.py",
            lambda argv: sys.exit(train_command.main(argv)),
            ["--data", str(corpus), "--out-dir", str(tmp_path / "run"), *TRAIN_ARGS],
            "run/.train.lock",
            "--out-dir",
        ),
    )
    for name, main, argv, lock, flag in runs:
        with pytest.raises(SystemExit) as info:
            main(argv)
        err = capsys.readouterr().err
        assert info.value.code == 2 and len(err.splitlines()) == 1, (name, err)
        assert err.endswith(
            f"error: lock file {tmp_path / lock} is a {kind}, not a regular file: "
            f"remove it, or pick another {flag}\n"
        ), err
    assert victim.read_text() == "keep\n"
    assert sorted(p.name for p in tmp_path.rglob("*")) == [
        ".ds.lock",
        ".train.lock",
        "run",
        "victim.txt",
    ]


def test_out_dir_check_survives_another_rank_removing_its_empty_folder(tmp_path, monkeypatch):
    """Every rank checks --out-dir; a rank that fails removes the empty folder it made. The check
    must then look again, not call the vanished folder "not a directory" (seen in CI at world 2).
    Here the folder vanishes between the check's stat and its access call, every time it could."""
    from machinery import run as train_run

    out = tmp_path / "run"
    real_access = os.access

    def access_after_the_other_rank_removed_it(path, mode):
        if pathlib.Path(path) == out and out.exists():
            out.rmdir()
        return real_access(path, mode)

    out.mkdir()
    monkeypatch.setattr(train_run.os, "access", access_after_the_other_rank_removed_it)
    train_run.check_writable_dir(out)  # the parent tmp_path is writable: no error
    (tmp_path / "blocker").write_text("")
    with pytest.raises(train_run.TrainError, match="blocker is not a directory"):
        train_run.check_writable_dir(tmp_path / "blocker" / "run")
    with pytest.raises(train_run.TrainError, match="is a file; choose a directory"):
        train_run.check_writable_dir(tmp_path / "blocker")
