"""Starting the processes of a parallel run: joining the process group torchrun describes
(`init_distributed`, what machinery/run.py calls for train.py) and a launcher for tests, demos and
benchmarks (`launch`: n local processes on gloo, with a store in a temporary folder, their results
or the first worker's error). The plumbing that gives parallel.py's and model_parallel.py's
lessons their process group; no lesson of its own.

Serves: parallel.py and model_parallel.py (their tests and demos), and train.py's runs."""

from __future__ import annotations

import datetime
import gc
import io
import os
import socket
import sys
import tempfile
import time
import traceback
from typing import Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from parallel import ParallelError
# --------------------------------------------------------------------------------------------------
# 1. Joining torchrun's process group: `init_distributed`, what machinery/run.py calls for train.py
# --------------------------------------------------------------------------------------------------


def init_distributed(timeout_s: float | None = None) -> tuple[int, int, torch.device]:
    """Join the process group that torchrun describes in the environment (RANK, WORLD_SIZE,
    MASTER_ADDR, ...).

    Returns (rank, world_size, device): gloo on CPU, nccl on CUDA (one GPU per local rank). Without
    torchrun's variables it is a plain single-process run: (0, 1, device), no process group. Every
    variable is checked before the group starts (`check_launch_env`, MASTER_PORT's range,
    MASTER_ADDR resolved): a bad one is one line naming it. A rank that never joins ends the
    rendezvous, and a rank that dies later the collectives of the others, with one line after
    `timeout_s` (env PARALLEL_TIMEOUT_S, default 600, torch's own default for nccl) instead of
    hanging; work that only rank 0 does is waited for in `Mesh.wait_for_rank0` instead.
    """
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        return 0, 1, torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rank, world = check_launch_env()
    host, port = os.environ.get("MASTER_ADDR", ""), launch_variable("MASTER_PORT", 1, 65_535)
    try:
        socket.getaddrinfo(host, port)  # an empty host (not set) fails too
    except (OSError, UnicodeError) as e:
        problem = "MASTER_ADDR is not set"
        if host:
            problem = f"MASTER_ADDR={host}: cannot resolve this host ({e})"
        raise ParallelError(
            f"{problem}: it names rank 0's host, which every rank must reach; torchrun sets it "
            "(its master address, or in standalone mode)"
        ) from None
    timeout_s = timeout_s or float(os.environ.get("PARALLEL_TIMEOUT_S", 600))
    if torch.cuda.is_available():
        local = launch_variable("LOCAL_RANK", 0, torch.cuda.device_count() - 1, "0")  # a GPU each
        torch.cuda.set_device(local)
        device, backend = torch.device("cuda", local), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    if not dist.is_initialized():
        # device_id binds nccl to this rank's GPU at once (torch >= 2.3), so no collective has to
        # guess it.
        try:
            dist.init_process_group(
                backend,
                timeout=datetime.timedelta(seconds=timeout_s),
                device_id=device if backend == "nccl" else None,
            )
        except dist.DistError as e:  # the rendezvous: a rank that never came, a port in use
            raise ParallelError(
                f"rank {rank} of WORLD_SIZE={world} could not join the process "
                f"group at {host}:{port} within {timeout_s:g} s "
                f"(PARALLEL_TIMEOUT_S): {str(e).splitlines()[0][:200]}; start "
                f"every rank, with the same MASTER_ADDR and MASTER_PORT"
            ) from None
    return dist.get_rank(), dist.get_world_size(), device


def launch_variable(name: str, low: int, high: int, default: str | None = None) -> int:
    """A torchrun variable that must be an integer in [low, high]; else one line naming it.

    >>> launch_variable("MASTER_PORT", 1, 65_535, default="99999")
    Traceback (most recent call last):
    parallel.ParallelError: MASTER_PORT=99999: must be an integer in [1, 65535] (torchrun sets the \
launch variables: launch with torchrun, one process per device, or unset them for one process)
    """
    text = os.environ.get(name, default)
    if text is None or not text.strip().isdigit() or not low <= int(text) <= high:
        raise ParallelError(
            f"{name}{'' if text is None else '=' + text}: "
            f"{'not set, ' if text is None else ''}must be an integer in "
            f"[{low}, {high}] (torchrun sets the launch variables: launch with "
            f"torchrun, one process per device, or unset them for one process)"
        )
    return int(text)


def check_launch_env() -> tuple[int, int]:
    """(RANK, WORLD_SIZE) of torchrun's environment, checked with LOCAL_RANK before any process
    group starts (torch would fail minutes later, or deep inside, on a typo): a bad one is one
    line naming the variable. Neither RANK nor WORLD_SIZE set is a plain run, (0, 1); one of them
    set needs the other."""
    world = launch_variable("WORLD_SIZE", 1, 1 << 20, None if "RANK" in os.environ else "1")
    launch_variable("LOCAL_RANK", 0, world - 1, "0")
    return launch_variable("RANK", 0, world - 1, None if "WORLD_SIZE" in os.environ else "0"), world


# --------------------------------------------------------------------------------------------------
# 2. The launcher for tests, demos and benchmarks
#
# `launch(fn, world)` runs fn(rank, world, *args) in `world` fresh processes joined by a gloo group
# over a FileStore (no ports to collide), and returns each rank's result: the tests, demos and
# benchmarks start their ranks with it. If a rank raises, the parent stops the others and raises
# WorkerError naming the rank and its error; if the whole run exceeds `timeout_s`, it stops them
# all. Nothing can hang a test. On Linux "fork" starts a worker in ~0.05 s (it inherits the imported
# torch); "spawn" re-imports torch (3-6 s each here) and is what other systems need.
# --------------------------------------------------------------------------------------------------


class WorkerError(RuntimeError):
    """A worker of `launch` failed or the run timed out."""


def _shut_down_process_group() -> None:
    """Tear gloo down in a fixed order, all ranks together (a no-op if `fn` already destroyed the
    group).

    1. A barrier: no rank closes its connections while a peer still has a message in flight to or
       from it.
    2. A garbage collection: modules, hooks and wrappers form reference cycles that keep Comm
       objects, hence ProcessGroups and async work handles, alive; they are freed now, while every
       backend still runs, not by a GC pass at some later point of the process's exit.
    3. destroy_process_group: every backend shuts down and joins its worker threads, here, on this
       thread.
    """
    if not dist.is_initialized():
        return
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()


def _worker_main(fn, rank, world, store_path, timeout_s, results, args):
    torch.set_num_threads(1)  # world processes share the cores; more threads would only fight
    try:
        store = dist.FileStore(store_path, world)
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        value = fn(rank, world, *args)
        buffer = io.BytesIO()
        # tensors travel as bytes: the worker may exit before the parent reads them
        torch.save(value, buffer)
        del value
        results.put((rank, "ok", buffer.getvalue()))
        _shut_down_process_group()
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the parent as one line
        frames = traceback.extract_tb(e.__traceback__)
        frames = [f for f in frames if f"{os.sep}torch{os.sep}" not in f.filename]
        last = frames[-1] if frames else None
        where = f" (at {os.path.basename(last.filename)}:{last.lineno})" if last else ""
        results.put((rank, "error", f"{type(e).__name__}: {e}{where}".encode()))


def launch(
    fn: Callable, world: int, *args, timeout_s: float = 120.0, start_method: str | None = None
) -> list:
    """Run fn(rank, world, *args) on `world` processes; return the list of their return values, by
    rank. fn must be a module-level function (spawn pickles it by name); its return value may hold
    tensors."""
    method = start_method or ("fork" if sys.platform.startswith("linux") else "spawn")
    ctx = mp.get_context(method)
    results = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        worker_args = [(fn, r, world, store_path, timeout_s, results, args) for r in range(world)]
        procs = [ctx.Process(target=_worker_main, args=a) for a in worker_args]
        for p in procs:
            p.start()
        done: dict[int, object] = {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(done) < world:
                if not results.empty():
                    rank, status, payload = results.get()
                    if status == "error":
                        raise WorkerError(f"rank {rank} failed: {payload.decode()}")
                    done[rank] = torch.load(io.BytesIO(payload), weights_only=True)
                    continue
                dead = [
                    r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in done
                ]
                if dead and results.empty():
                    raise WorkerError(
                        f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}"
                    )
                if time.monotonic() > deadline:
                    missing = sorted(set(range(world)) - set(done))
                    raise WorkerError(
                        f"ranks {missing} did not finish within {timeout_s:.0f} s; stopped them"
                    )
                time.sleep(0.01)
        finally:
            for p in procs:
                p.join(timeout=5 if len(done) == world else 0.2)
                if p.is_alive():
                    p.kill()
                    p.join()
    return [done[r] for r in range(world)]
