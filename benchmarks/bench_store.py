#!/usr/bin/env python
"""Store benchmarks: every figure is set against a baseline measured in the same run.

    python benchmarks/bench_store.py [--quick] [--profile] [--dir DIR]

Figures (each ratio is ours / baseline; lower is better):

1. CAS transition: ``MatrixStore.update(key, change, expected=token)`` on an existing entry
   (lock + re-read + encode + durable write) against a bare durable write of the same bytes in
   the same directory (temp O_EXCL + write + fsync + os.replace + directory fsync; no lock, no
   read). Medians over interleaved ops. Goal: ratio <= 1.3.
2. Contention: N writer processes (separate interpreters) doing CAS on one entry for a fixed
   time, each in a client's loop: read the entry (no lock), ``store.update(key, change,
   expected=generation)``, count a Conflict and retry. Each writer times, inside the store's
   own ``update``, how long entering ``store.locked(key)`` took (a ``MatrixStore`` subclass
   wraps ``locked``; no extra acquire) and how long the lock was held. Goal: p99 lock wait
   <= 150 ms. The baseline is the wait of an ideal FIFO queue, (N - 1) x the median hold.
   Per-writer min..max acknowledged CAS ops are set against the fair share; the final counter
   in the entry must equal the number of acknowledged CAS ops (no lost update).
3. ``ls --json`` over 1,000 and 10,000 entries through the CLI's own in-process path
   (``pi_tmux_matrix.cli.main([... "ls", "--json"])`` with an in-memory Io: ``MatrixStore.list``
   + rows with ``alive`` + ``json.dumps``) against a raw read of the same files (os.listdir +
   open/read + json.loads). Goal: ratio <= 2.0. To save time the entries are not written
   through the store: each is built as an ``Entry`` and its bytes from the store's own
   ``encode_entry`` are written straight into ``<key>.json`` (0600, no fsync), which is exactly
   what the store would have left on disk.

Prints one table and writes it as JSON to benchmarks/results/bench_store.json. ``--quick``
shrinks every size for a smoke run (its numbers mean nothing). ``--profile`` adds a cProfile
of the ours-side of figures 1 and 3.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pi_tmux_matrix import __version__, procs
from pi_tmux_matrix.cli import main as cli_main
from pi_tmux_matrix.cli.app import Io
from pi_tmux_matrix.errors import Conflict
from pi_tmux_matrix.identity import AgentIdentityContract, Mode, Role
from pi_tmux_matrix.matrix.codec import encode_entry
from pi_tmux_matrix.matrix.model import Entry, Status
from pi_tmux_matrix.matrix.store import MatrixStore, new_token, now_ms

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "bench_store.json"
HEADER = ("figure", "ours", "baseline", "ratio", "goal", "met")

FULL: dict[str, Any] = {
    "cas_ops": 300,
    "cas_warmup": 30,
    "writers": 8,
    "duration": 3.0,
    "ls_sizes": (1000, 10000),
    "ls_repeats": 5,
}
QUICK: dict[str, Any] = {
    "cas_ops": 20,
    "cas_warmup": 3,
    "writers": 3,
    "duration": 0.3,
    "ls_sizes": (50, 200),
    "ls_repeats": 2,
}

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


# --- entries -------------------------------------------------------------------------------------


def build_entry(session: str, *, pid: int | None = None, start: int | None = None) -> Entry:
    """A realistic worker entry (about 1 KB on disk)."""
    identity = AgentIdentityContract(
        agent_id=f"agent-{session}",
        session_id=session,
        session_file=f"/home/user/.pi/agent/sessions/{session}.jsonl",
        cwd="/home/user/src/project",
        worktree=f"/home/user/src/project-wt/{session}",
        lane=f"lane-{session[-1]}",
        profile="default",
        provider="pi",
        mode=Mode.RPC,
    )
    now = now_ms()
    token = new_token()
    return Entry(
        key=identity.key(Role.WORKER),
        role=Role.WORKER,
        status=Status.RUNNING,
        identity=identity,
        created_at=now,
        updated_at=now,
        generation=token,
        registration=token,
        pid=pid,
        proc_start=start,
        boot_id=procs.boot_id() if pid is not None else None,
        parent_pid=os.getpid(),
        parent_session_id="master-session",
        parent_proc_start=procs.current().start_ticks,
        task_ref="goal:bench#1",
        heartbeat_at=0,
    )


def bump(entry: Entry) -> Entry:
    """The transition every CAS in this benchmark makes: a heartbeat counter + 1."""
    return entry.moved(entry.status, heartbeat_at=(entry.heartbeat_at or 0) + 1)


def fresh_store(parent: str) -> MatrixStore:
    base = tempfile.mkdtemp(prefix="bench-store-", dir=parent)
    return MatrixStore(Path(base) / "state")


# --- figure 1: CAS transition vs bare durable write ---------------------------------------------


def durable_write(dir_fd: int, name: str, data: bytes) -> None:
    """The floor: temp O_EXCL + write + fsync + replace + directory fsync, nothing else."""
    tmp = f".{name}.tmp"
    fd = os.open(tmp, _CREATE, 0o600, dir_fd=dir_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def cas_loop(store: MatrixStore, entry: Entry, ops: int) -> Entry:
    """``ops`` CAS transitions (used for the profile)."""
    for _ in range(ops):
        entry = store.update(entry.key, bump, expected=entry.generation)
    return entry


def figure_cas(store: MatrixStore, cfg: dict[str, Any]) -> dict[str, Any]:
    entry = store.create(build_entry("cas0", pid=os.getpid(), start=procs.current().start_ticks))
    dir_fd = os.open(store.root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        ours: list[float] = []
        base: list[float] = []
        total = cfg["cas_warmup"] + cfg["cas_ops"]
        for i in range(total):
            data = encode_entry(entry)
            # Interleave, alternating which goes first, so drift and ordering cancel out.
            if i % 2:
                t0 = time.perf_counter()
                entry = store.update(entry.key, bump, expected=entry.generation)
                t1 = time.perf_counter()
                durable_write(dir_fd, "baseline-cas.bin", data)
                t2 = time.perf_counter()
                o, b = t1 - t0, t2 - t1
            else:
                t0 = time.perf_counter()
                durable_write(dir_fd, "baseline-cas.bin", data)
                t1 = time.perf_counter()
                entry = store.update(entry.key, bump, expected=entry.generation)
                t2 = time.perf_counter()
                b, o = t1 - t0, t2 - t1
            if i >= cfg["cas_warmup"]:
                ours.append(o)
                base.append(b)
    finally:
        os.close(dir_fd)
    assert entry.heartbeat_at == total, entry.heartbeat_at
    return {
        "ours_ms": statistics.median(ours) * 1e3,
        "baseline_ms": statistics.median(base) * 1e3,
        "ours_p90_ms": _pct(ours, 90) * 1e3,
        "baseline_p90_ms": _pct(base, 90) * 1e3,
        "ops": len(ours),
        "entry_bytes": len(encode_entry(entry)),
    }


# --- figure 2: contention ------------------------------------------------------------------------


class TimedStore(MatrixStore):
    """The real store, timing how long entering ``locked(key)`` takes and how long it is held.

    ``update`` calls ``self.locked(key)``, so this times the store's own lock path with no
    extra acquire.
    """

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.waits: list[float] = []
        self.holds: list[float] = []

    @contextmanager
    def locked(self, key: str) -> Iterator[int]:
        t0 = time.perf_counter()
        with super().locked(key) as root_fd:
            t1 = time.perf_counter()
            self.waits.append(t1 - t0)
            try:
                yield root_fd
            finally:
                self.holds.append(time.perf_counter() - t1)


def worker_main(state: str, key: str, duration: float) -> int:
    """One contending writer (run in its own interpreter by figure 2).

    A client's CAS loop: read the entry without the lock, then ``update(expected=generation)``;
    a :class:`Conflict` (someone wrote in between) is counted and retried with a fresh read.
    """
    store = TimedStore(state)
    store.get(key)  # warm imports and caches before the start signal
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        return 1
    ops = conflicts = 0
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        current = store.get(key)
        try:
            store.update(key, bump, expected=current.generation)
        except Conflict:
            conflicts += 1
        else:
            ops += 1
    report = {"ops": ops, "conflicts": conflicts, "waits": store.waits, "holds": store.holds}
    print(json.dumps(report), flush=True)
    return 0


def figure_contention(store: MatrixStore, cfg: dict[str, Any]) -> dict[str, Any]:
    entry = store.create(build_entry("hammer0"))
    writers: list[subprocess.Popen[str]] = []
    try:
        for _ in range(cfg["writers"]):
            writers.append(
                subprocess.Popen(
                    [sys.executable, __file__, "--worker", str(store.root), entry.key,
                     str(cfg["duration"])],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for writer in writers:
            assert writer.stdout is not None
            line = writer.stdout.readline()
            if line.strip() != "ready":
                raise RuntimeError(f"writer {writer.pid} did not start: {line!r}")
        for writer in writers:
            assert writer.stdin is not None
            writer.stdin.write("go\n")
            writer.stdin.close()
        reports = []
        for writer in writers:
            assert writer.stdout is not None
            out = writer.stdout.read()
            if writer.wait(timeout=cfg["duration"] + 120) != 0:
                raise RuntimeError(f"writer {writer.pid} failed with {writer.returncode}")
            reports.append(json.loads(out))
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()  # by pid (Popen.kill), our own child
                writer.wait(timeout=30)
    waits = [w for r in reports for w in r["waits"]]
    holds = [h for r in reports for h in r["holds"]]
    ops = [r["ops"] for r in reports]
    conflicts = [r["conflicts"] for r in reports]
    final = store.get(entry.key).heartbeat_at
    ideal_wait = (cfg["writers"] - 1) * statistics.median(holds)
    return {
        "writers": cfg["writers"],
        "duration_s": cfg["duration"],
        "wait_p50_ms": _pct(waits, 50) * 1e3,
        "wait_p99_ms": _pct(waits, 99) * 1e3,
        "wait_max_ms": max(waits) * 1e3,
        "hold_median_ms": statistics.median(holds) * 1e3,
        "ideal_fifo_wait_ms": ideal_wait * 1e3,
        "ops_per_writer": ops,
        "ops_total": sum(ops),
        "conflicts_per_writer": conflicts,
        "attempts_per_writer": [o + c for o, c in zip(ops, conflicts, strict=True)],
        "final_counter": final,
        "lost_updates": sum(ops) - (final or 0),
    }


# --- figure 3: ls --json vs raw read --------------------------------------------------------------


def populate(root: Path, count: int) -> None:
    """``count`` entries written with the store's own encoder, straight into files (no fsync).

    Recorded processes are all dead or reused pids (start ticks that never match), except one
    entry in a hundred that records this process, so ``alive`` costs one /proc read per entry.
    """
    os.makedirs(root, mode=0o700)
    os.chmod(root, 0o700)
    me = procs.current()
    for i in range(count):
        if i % 100 == 0:
            pid, start = me.pid, me.start_ticks
        else:
            pid, start = 300 + i % 32000, 10**9 + i
        entry = build_entry(f"ls{i:06d}", pid=pid, start=start)
        fd = os.open(root / f"{entry.key}.json", _CREATE, 0o600)
        try:
            os.write(fd, encode_entry(entry))
        finally:
            os.close(fd)


def ours_ls(root: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = cli_main(["--state-dir", root, "ls", "--json"], io=Io(out, err))
    if code != 0 or err.getvalue():
        raise RuntimeError(f"ls failed ({code}): {err.getvalue()}")
    return out.getvalue()


def raw_ls(root: str) -> list[Any]:
    rows = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".json"):
            with open(os.path.join(root, name), "rb") as handle:
                rows.append(json.loads(handle.read()))
    return rows


def figure_ls(parent: str, count: int, repeats: int) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-ls-", dir=parent)) / "state"
    t0 = time.perf_counter()
    populate(root, count)
    populate_s = time.perf_counter() - t0
    rows = json.loads(ours_ls(str(root)))  # warm-up, and a check that it lists them all
    assert len(rows) == count, len(rows)
    assert sum(1 for r in rows if r["alive"]) == (count + 99) // 100
    assert len(raw_ls(str(root))) == count
    ours: list[float] = []
    base: list[float] = []
    for i in range(repeats):
        for which in ((0, 1) if i % 2 else (1, 0)):
            t = time.perf_counter()
            if which:
                ours_ls(str(root))
                ours.append(time.perf_counter() - t)
            else:
                raw_ls(str(root))
                base.append(time.perf_counter() - t)
    return {
        "entries": count,
        "repeats": repeats,
        "ours_ms": statistics.median(ours) * 1e3,
        "baseline_ms": statistics.median(base) * 1e3,
        "populate_s": populate_s,
        "root": str(root),
    }


# --- reporting -----------------------------------------------------------------------------------


def _pct(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def _fs_type(path: str) -> str:
    best, kind = "", "?"
    real = os.path.realpath(path)
    with open("/proc/self/mounts", encoding="utf-8") as handle:
        for line in handle:
            parts = line.split()
            mount = parts[1]
            inside = real == mount or real.startswith(mount.rstrip("/") + "/")
            if inside and len(mount) > len(best):
                best, kind = mount, parts[2]
    return kind


def rows_from(
    cas: dict[str, Any], hammer: dict[str, Any], ls: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    rows = [
        {
            "figure": f"1 CAS transition, median of {cas['ops']}",
            "ours": cas["ours_ms"],
            "baseline": cas["baseline_ms"],
            "unit": "ms",
            "baseline_is": "bare durable write of the same bytes",
            "ratio": cas["ours_ms"] / cas["baseline_ms"],
            "goal": "ratio <= 1.3",
            "met": cas["ours_ms"] / cas["baseline_ms"] <= 1.3,
        },
        {
            "figure": f"2 lock wait p99, {hammer['writers']} writers x {hammer['duration_s']:g}s",
            "ours": hammer["wait_p99_ms"],
            "baseline": hammer["ideal_fifo_wait_ms"],
            "unit": "ms",
            "baseline_is": "ideal FIFO wait = (writers-1) x median hold",
            "ratio": hammer["wait_p99_ms"] / hammer["ideal_fifo_wait_ms"],
            "goal": "p99 <= 150 ms",
            "met": hammer["wait_p99_ms"] <= 150,
        },
        {
            "figure": "2 ops per writer, min..max",
            "ours": f"{min(hammer['ops_per_writer'])}..{max(hammer['ops_per_writer'])}",
            "baseline": hammer["ops_total"] / hammer["writers"],
            "unit": "ops",
            "baseline_is": "fair share = total / writers",
            "ratio": min(hammer["ops_per_writer"]) / max(hammer["ops_per_writer"]),
            "goal": "all progress, 0 lost",
            "met": min(hammer["ops_per_writer"]) > 0 and hammer["lost_updates"] == 0,
        },
    ]
    for item in ls:
        ratio = item["ours_ms"] / item["baseline_ms"]
        rows.append(
            {
                "figure": f"3 ls --json, {item['entries']:,} entries",
                "ours": item["ours_ms"],
                "baseline": item["baseline_ms"],
                "unit": "ms",
                "baseline_is": "os.listdir + read + json.loads",
                "ratio": ratio,
                "goal": "ratio <= 2.0",
                "met": ratio <= 2.0,
            }
        )
    return rows


def _cell(value: Any, unit: str) -> str:
    if isinstance(value, float):
        return f"{value:.3f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    return f"{value} {unit}"


def render(rows: list[dict[str, Any]]) -> str:
    cells = [HEADER] + [
        (
            r["figure"],
            _cell(r["ours"], r["unit"]),
            _cell(r["baseline"], r["unit"]),
            f"{r['ratio']:.2f}",
            r["goal"],
            "yes" if r["met"] else "NO",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def profile(label: str, call: Callable[[], object], top: int = 25) -> None:
    profiler = cProfile.Profile()
    profiler.enable()
    call()
    profiler.disable()
    print(f"\n=== cProfile: {label} (sorted by tottime) ===")
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    print(f"=== cProfile: {label} (sorted by cumulative) ===")
    stats.sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--profile", action="store_true", help="cProfile the ours-side too")
    parser.add_argument("--dir", default=None, help="where to create the state dirs (default: TMPDIR)")
    parser.add_argument("--keep", action="store_true", help="keep the state dirs")
    parser.add_argument(
        "--output", type=Path, default=RESULTS, help=f"the JSON results file (default: {RESULTS})"
    )
    parser.add_argument("--worker", nargs=3, metavar=("STATE", "KEY", "SECONDS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args.worker[0], args.worker[1], float(args.worker[2]))

    cfg = QUICK if args.quick else FULL
    parent = tempfile.mkdtemp(prefix="pi-matrix-bench-", dir=args.dir)
    started = time.perf_counter()
    try:
        cas = figure_cas(fresh_store(parent), cfg)
        hammer = figure_contention(fresh_store(parent), cfg)
        ls = [figure_ls(parent, n, cfg["ls_repeats"]) for n in cfg["ls_sizes"]]
        rows = rows_from(cas, hammer, ls)
        meta = {
            "mode": "quick" if args.quick else "full",
            "package_version": __version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "filesystem": _fs_type(parent),
            "state_parent": parent,
            "elapsed_s": round(time.perf_counter() - started, 1),
        }
        print(
            f"bench_store ({meta['mode']}): python {meta['python']}, {meta['cpus']} CPUs, "
            f"{meta['filesystem']} at {parent}, {meta['elapsed_s']} s"
        )
        print(render(rows))
        print(
            f"(fig 1: p90 ours {cas['ours_p90_ms']:.3f} ms vs {cas['baseline_p90_ms']:.3f} ms, "
            f"{cas['entry_bytes']} B entry; fig 2: wait p50 {hammer['wait_p50_ms']:.2f} ms, "
            f"max {hammer['wait_max_ms']:.1f} ms, hold median {hammer['hold_median_ms']:.2f} ms, "
            f"{hammer['ops_total']} CAS acknowledged, {sum(hammer['conflicts_per_writer'])} conflicts, "
            f"attempts per writer {min(hammer['attempts_per_writer'])}.."
            f"{max(hammer['attempts_per_writer'])}, {hammer['lost_updates']} lost)"
        )
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(
            json.dumps(
                {"meta": meta, "rows": rows, "details": {"cas": cas, "contention": hammer, "ls": ls}},
                indent=2,
            )
            + "\n"
        )
        print(f"written to {args.output}")
        if args.profile:
            store = fresh_store(parent)
            entry = store.create(build_entry("prof0"))
            profile(f"fig 1 ours: {cfg['cas_ops']} CAS transitions",
                    lambda: cas_loop(store, entry, cfg["cas_ops"]))
            biggest = ls[-1]
            profile(f"fig 3 ours: ls --json over {biggest['entries']:,} entries",
                    lambda: ours_ls(biggest["root"]))
    finally:
        if not args.keep:
            shutil.rmtree(parent, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
