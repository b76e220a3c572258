"""Benchmark: data.py prepare on Ray (`--engine ray`, a Ray started on this machine) against the local engine
(worker processes), side by side on the same corpus, same settings, same number of cores.

For each engine: wall time, MB/s of input and MB/s per core, CPU seconds, peak RSS of every process of the run (the
driver, its worker processes, and for Ray its raylet, GCS and workers: the run's whole process tree, sampled from
/proc), and the check that both wrote the same bytes. Then Ray's overhead as a ratio to the local engine's time, and
its fixed part: `ray.init` + a map of trivial tasks + `ray.shutdown`, timed alone.

    python bench/bench_data_ray.py                     # bench_data.py's ~300 MB web-like corpus (built once, kept)
    python bench/bench_data_ray.py --corpus DIR        # any input data.py reads
    python bench/bench_data_ray.py --overhead-only     # only the fixed cost of starting and stopping Ray
    python bench/bench_data_ray.py --corpus small.txt --workers 1    # Ray's start alone: ~20 s

The engines run one after the other, each in its own `python data.py prepare` subprocess, so on a shared machine
the neighbours weigh on both; CPU seconds (summed over the process tree) are the steadier figure.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
import time

from benchcli import Parser, in_range

ROOT = pathlib.Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ProcessTreeSampler:
    """Samples /proc every `interval` seconds for a process and all its descendants: per pid, the command, the peak
    resident memory (VmHWM: the kernel's own high-water mark, so a peak between two samples is not missed) and
    the CPU seconds (user + system) last seen."""

    def __init__(self, root_pid: int, interval: float = 0.2) -> None:
        self.root_pid, self.interval = root_pid, interval
        self.seen: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _children(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        parent = int(f.read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                children.setdefault(parent, []).append(int(entry))
        return children

    def _sample(self) -> None:
        children, stack = self._children(), [self.root_pid]
        while stack:
            pid = stack.pop()
            stack += children.get(pid, [])
            try:
                with open(f"/proc/{pid}/status") as f:
                    status = dict(line.split(":", 1) for line in f if ":" in line)
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    command = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            except OSError:
                continue
            peak = int(status.get("VmHWM", "0 kB").split()[0]) * 1024
            cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
            record = self.seen.setdefault(pid, {"command": command, "peak_rss": 0, "cpu_s": 0.0})
            record["peak_rss"], record["cpu_s"] = (
                max(record["peak_rss"], peak),
                max(record["cpu_s"], cpu),
            )
            record["command"] = command or record["command"]

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)


ROLES = (
    ("raylet", "ray raylet"),
    ("gcs_server", "ray gcs"),
    ("DashboardAgent", "ray dashboard agent"),
    ("dashboard/agent.py", "ray dashboard agent"),
    ("dashboard", "ray dashboard"),
    ("log_monitor", "ray log monitor"),
    ("monitor.py", "ray autoscaler monitor"),
    ("RuntimeEnvAgent", "ray runtime-env agent"),
    ("runtime_env/agent", "ray runtime-env agent"),
    ("default_worker", "ray worker"),
    ("ray::", "ray worker"),
)


def role(pid: int, root_pid: int, command: str) -> str:
    """A process's part in the run: the driver (prepare itself), or what its command line names (Ray names its
    processes; a Ray worker's title is ray::TASK while it runs one)."""
    if pid == root_pid:
        return "driver"
    return next((name for key, name in ROLES if key in command), "worker process")


def run_engine(engine: str, corpus: str, out: pathlib.Path, workers: int, extra: list[str]) -> dict:
    command = [
        sys.executable,
        str(ROOT / "data.py"),
        "prepare",
        "--data",
        corpus,
        "--out",
        str(out),
        "--workers",
        str(workers),
        "--engine",
        engine,
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    with ProcessTreeSampler(process.pid) as sampler:
        output, _ = process.communicate()
    wall = time.perf_counter() - start
    if process.returncode == 2:  # data.py refused the input in one line: pass it on
        print(f"bench_data_ray.py: error: {output.strip().splitlines()[-1]}", file=sys.stderr)
        sys.exit(2)
    if process.returncode:
        sys.exit(f"{engine} engine failed:\n{output[-3000:]}")
    manifest = json.loads((out / "manifest.json").read_text())
    by_role: dict[str, list[int]] = {}
    for pid, record in sampler.seen.items():
        by_role.setdefault(role(pid, process.pid, record["command"]), []).append(record["peak_rss"])
    return {
        "wall_s": wall,
        "input_bytes": manifest["timings"]["input_bytes"],
        "cpu_s": sum(r["cpu_s"] for r in sampler.seen.values()),
        "processes": len(sampler.seen),
        "peak_rss_by_role": {k: (len(v), max(v)) for k, v in sorted(by_role.items())},
        "peak_rss_sum": sum(r["peak_rss"] for r in sampler.seen.values()),
    }


def dataset_bytes(directory: pathlib.Path) -> dict:
    """The files of a dataset, the manifest without its timings (the only field allowed to differ)."""
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest.pop("timings")
    return {
        **{p.name: p.read_bytes() for p in directory.iterdir() if p.name != "manifest.json"},
        "manifest": manifest,
    }


OVERHEAD_SCRIPT = """
import json, logging, sys, time
start = time.perf_counter()
import ray
imported = time.perf_counter()
ray.init(address="local", num_cpus={cpus}, object_store_memory=256 << 20, include_dashboard=False,
         logging_level=logging.ERROR)
started = time.perf_counter()
square = ray.remote(lambda x: x * x)
assert ray.get([square.remote(i) for i in range({tasks})]) == [i * i for i in range({tasks})]
mapped = time.perf_counter()
assert ray.get([square.remote(i) for i in range({tasks})]) == [i * i for i in range({tasks})]
warm = time.perf_counter()
ray.shutdown()
stopped = time.perf_counter()
print(json.dumps({{"import_s": imported - start, "init_s": started - imported, "first_map_s": mapped - started,
                  "warm_map_s": warm - mapped, "shutdown_s": stopped - warm}}))
"""


OVERHEAD_TASKS = 100


def ray_fixed_overhead(cpus: int, tasks: int = OVERHEAD_TASKS) -> dict:
    """Seconds to import Ray, start it, map `tasks` trivial tasks (cold workers, then warm) and stop it."""
    result = subprocess.run(
        [sys.executable, "-c", OVERHEAD_SCRIPT.format(cpus=cpus, tasks=tasks)],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    if result.returncode:
        sys.exit(f"Ray did not start:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--corpus", default=None, help="input for prepare (default: bench_data.py's corpus of --mb)"
    )
    parser.add_argument(
        "--mb",
        type=in_range(float, 0.01, 100_000),
        default=300,
        help="size of bench_data.py's corpus (default %(default)g)",
    )
    parser.add_argument(
        "--work", default="/tmp/bench_data", help="where bench_data.py keeps its corpora"
    )
    parser.add_argument(
        "--workers",
        type=in_range(int, 1, 1024),
        default=len(os.sched_getaffinity(0)),
        help="cores for both engines",
    )
    parser.add_argument(
        "--chunk-mb",
        type=in_range(float, 0.001, 4096),
        default=None,
        help="passed to prepare (default: its own)",
    )
    parser.add_argument(
        "--overhead-only", action="store_true", help="only time Ray's start, trivial map and stop"
    )
    args = parser.parse_args(argv)

    overhead = ray_fixed_overhead(args.workers)
    fixed = overhead["init_s"] + overhead["first_map_s"] + overhead["shutdown_s"]
    print(
        f"Ray fixed overhead ({args.workers} CPUs, {OVERHEAD_TASKS} trivial tasks): import {overhead['import_s']:.1f}s, "
        f"init {overhead['init_s']:.1f}s, first map {overhead['first_map_s']:.2f}s (workers start), "
        f"warm map {overhead['warm_map_s'] * 1e3:.0f} ms ({overhead['warm_map_s'] * 1e3 / OVERHEAD_TASKS:.1f} ms/task), "
        f"shutdown {overhead['shutdown_s']:.1f}s: {fixed:.1f}s in all"
    )
    if args.overhead_only:
        return
    if args.corpus is None:  # bench_data.py's web-like corpus, built once into --work
        sys.path.insert(0, str(ROOT / "bench"))
        import bench_data
        from bench_dedup import DATA, sentence_pool

        corpus = pathlib.Path(args.work) / f"corpus-{args.mb:g}MB.jsonl"
        corpus.parent.mkdir(parents=True, exist_ok=True)
        bench_data.build_corpus(corpus, args.mb, sentence_pool(DATA))
        args.corpus = str(corpus)
    extra = ["--chunk-mb", str(args.chunk_mb)] if args.chunk_mb else []
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="bench-data-ray-"))
    try:
        results = {
            engine: run_engine(engine, args.corpus, scratch / engine, args.workers, extra)
            for engine in ("local", "ray")
        }
        identical = dataset_bytes(scratch / "local") == dataset_bytes(scratch / "ray")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    mb = results["local"]["input_bytes"] / 1e6
    print(
        f"\ncorpus {args.corpus}: {mb:,.1f} MB, {args.workers} cores, load average {os.getloadavg()[0]:.1f}"
    )
    print(
        f"{'engine':<8}{'wall s':>9}{'MB/s':>8}{'MB/s/core':>11}{'CPU s':>9}{'MB/CPU-s':>10}{'processes':>11}"
        f"{'sum of peak RSS':>17}"
    )
    for engine, r in results.items():
        print(
            f"{engine:<8}{r['wall_s']:>9.1f}{mb / r['wall_s']:>8.2f}{mb / r['wall_s'] / args.workers:>11.2f}"
            f"{r['cpu_s']:>9.1f}{mb / max(r['cpu_s'], 1e-9):>10.2f}{r['processes']:>11}"
            f"{r['peak_rss_sum'] / 2**20:>14,.0f} MiB"
        )
    for engine, r in results.items():
        roles = ", ".join(
            f"{name} {n}x {peak / 2**20:,.0f}" for name, (n, peak) in r["peak_rss_by_role"].items()
        )
        print(f"peak RSS per process, {engine} (MiB): {roles}")
    ratio = results["ray"]["wall_s"] / results["local"]["wall_s"]
    print(
        f"\nRay / local wall time: {ratio:.2f}x (target <= 1.5x); CPU seconds {results['ray']['cpu_s'] / results['local']['cpu_s']:.2f}x; "
        f"Ray's fixed start/stop cost {fixed:.1f}s = {fixed / results['ray']['wall_s']:.0%} of its run"
    )
    print(f"same shards, tokenizer and manifest (timings apart): {identical}")


if __name__ == "__main__":
    main()
