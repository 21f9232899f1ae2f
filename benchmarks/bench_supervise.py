#!/usr/bin/env python
"""Supervision benchmarks, each figure against a baseline measured in the same run.

    python benchmarks/bench_supervise.py [--quick]

1. Parent death -> ``winding_down`` latency: a real ``pi-matrix host`` watches a real parent;
   the parent is SIGKILLed and the host's own event timestamp of the ``winding_down`` write is
   compared with the kill time. p50/p99 over >= 20 trials, and p99 / ``watcherPollMs`` (the
   cadence a polling watcher would need; the TypeScript origin polls every 25 s). Goal: p99 <=
   100 ms.
2. Host RSS vs its child's RSS (the child: the bundled stand-in agent, a small Python program).
3. Total CPU of N idle watching hosts over a window opened once each has made its first
   heartbeat and parent poll, which load what they need on first use (default settings:
   heartbeat 30 s, watcher poll 25 s), against one core-second per second. Goal: <= 1% of a core for 50 hosts
   over 30 s.

Prints one table and writes it to benchmarks/results/bench_supervise.json.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pi_tmux_matrix import inotify, procs
from pi_tmux_matrix.identity import AgentIdentityContract, Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _wait import wait_for
from bench_store import durable_write  # the floor bench_store measures CAS against

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "bench_supervise.json"
# settle: how long after the last host started before the idle window opens. Past the first
# heartbeat (30 s) and parent poll (25 s): each host's first of those pays one-time costs (modules
# and the codec loaded on first use, ~25 ms of CPU), which are start-up, not idling.
FULL = {"trials": 100, "hosts": 50, "window": 30.0, "settle": 32.0}
QUICK = {"trials": 3, "hosts": 4, "window": 2.0, "settle": 2.0}


def events(state: Path, key: str) -> list[dict[str, Any]]:
    path = state / "events" / f"{key}.jsonl"
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def host_argv(
    state: Path, session: str, parent: int, child: list[str], mode: str = "interactive"
) -> list[str]:
    return [
        sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), "host",
        "--parent-pid", str(parent), "--parent-session", "bench-master", "--session-id", session,
        "--provider", "bench", "--mode", mode, "--", *child,
    ]  # fmt: skip


def spawn(argv: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def spawn_master(state: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The hosts' parent: a real, heartbeating ``pi-matrix master`` (a host counts a parent that is
    no running master lost); returns once it is registered."""
    master = spawn(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), "master", "--session-id",
         "bench-master", "--headless"],
        env,
    )  # fmt: skip
    wait_for("master", lambda: (state / "master-bench-master.json").exists() or master.poll() is not None, 30)
    if master.poll() is not None:
        raise RuntimeError(f"the bench master ended with {master.returncode}")
    return master


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()


def spawn_parent(state: Path) -> subprocess.Popen[bytes]:
    """A parent for one death trial: a bare ``sleep`` registered as the running master of the
    hosts' parent session (what a host checks its parent against), so a trial costs one host
    start, and the parent's death is the kernel's alone (no interpreter to tear down)."""
    parent = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL)
    identity = procs.identify(parent.pid)
    assert identity is not None
    contract = AgentIdentityContract(agent_id="bench-master", session_id="bench-master")
    MatrixStore(state).register(
        lifecycle.new_entry(role=Role.MASTER, identity=contract, process=identity, now=now_ms())
    )
    return parent


def _status_line(path: Path, status: str) -> bool:
    try:
        text = path.read_text()
    except OSError:
        return False
    return f'"status": "{status}"' in text or f'"status":"{status}"' in text


def death_latency(root: Path, env: dict[str, str], trials: int, poll_ms: int) -> dict[str, Any]:
    """From the parent's death (the bench's own pidfd on it turning readable, as the host's does)
    until the host's ``winding_down`` is durable: the host appends its ``status`` event right after
    the CAS's write and directory fsync return, and the bench wakes on that append (inotify),
    so the figure is the host's whole reaction plus the bench's own wake-up. Against bare durable
    writes of the entry's bytes, ten after each trial, on the same file system."""
    latencies: list[float] = []
    from_kill: list[float] = []
    writes: list[float] = []
    for trial in range(trials):
        state = root / f"death-{trial}"
        parent = spawn_parent(state)
        key = f"worker-w{trial}"
        host = spawn(host_argv(state, f"w{trial}", parent.pid, ["sleep", "600"]), env)
        watch: inotify.Watches | None = None
        try:
            wait_for(
                "host start",
                lambda s=state, k=key: any(e["event"] == "child_started" for e in events(s, k)),
                30,
            )
            time.sleep(0.2)  # let the host settle into its select loop
            log = state / "events" / f"{key}.jsonl"
            watch = inotify.Watches()  # each event line's append closes the file: a wake
            watch.add(log.parent, lambda _names: None)
            pidfd = os.pidfd_open(parent.pid)
            killed_at = time.perf_counter()
            parent.kill()
            select.select([pidfd], [], [], 10)
            dead_at = time.perf_counter()
            os.close(pidfd)
            seen_at = None
            deadline = dead_at + 10
            while seen_at is None and time.perf_counter() < deadline:
                select.select([watch.fd] if watch.fd is not None else [], [], [], 0.5)
                woke = time.perf_counter()
                watch.dispatch()
                if _status_line(log, "winding_down"):
                    seen_at = woke
            if seen_at is None:
                raise TimeoutError("winding_down")
            latencies.append((seen_at - dead_at) * 1000)
            from_kill.append((seen_at - killed_at) * 1000)
            writes += bare_writes(root / f"bare-{trial}", (state / f"{key}.json").read_bytes(), 10)
        finally:
            if watch is not None:
                watch.close()
            stop(parent)
            host.send_signal(signal.SIGTERM)
            try:
                host.wait(10)
            except subprocess.TimeoutExpired:
                stop(host)
    return {
        "trials": trials, "p50_ms": _pct(latencies, 50), "p99_ms": _pct(latencies, 99),
        "from_kill_p99_ms": _pct(from_kill, 99), "watcher_poll_ms": poll_ms,
        "bare_writes": len(writes), "bare_write_p50_ms": _pct(writes, 50),
        "bare_write_p99_ms": _pct(writes, 99), "all_ms": sorted(latencies),
    }  # fmt: skip


def _pct(values: list[float], pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def bare_writes(folder: Path, data: bytes, count: int) -> list[float]:
    """The baseline: one bare durable write of the entry's own bytes (temp + fsync + rename +
    directory fsync, nothing else) on the same file system, in the same run."""
    folder.mkdir(parents=True)
    dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    took: list[float] = []
    try:
        for _ in range(count):
            began = time.perf_counter()
            durable_write(dir_fd, "entry.json", data)  # bench_store's floor, the same bytes
            took.append((time.perf_counter() - began) * 1000)
    finally:
        os.close(dir_fd)
    return took


def rss(root: Path, env: dict[str, str]) -> dict[str, Any]:
    state = root / "rss"
    parent = spawn_master(state, env)
    child = [sys.executable, "-m", "pi_tmux_matrix.testing.standin", "--no-session", "HANG"]
    host = spawn(host_argv(state, "rss", parent.pid, child), env)
    try:
        started = wait_for(
            "host start",
            lambda: [e for e in events(state, "worker-rss") if e["event"] == "child_started"],
            30,
        )
        time.sleep(1.0)
        host_rss = procs.rss_bytes(host.pid) or 0
        child_rss = procs.rss_bytes(started[0]["pid"]) or 0
    finally:
        host.send_signal(signal.SIGTERM)
        try:
            host.wait(10)
        except subprocess.TimeoutExpired:
            stop(host)
        stop(parent)
    return {"host_rss": host_rss, "child_rss": child_rss}


def idle_cpu(root: Path, env: dict[str, str], count: int, window: float, settle: float) -> dict[str, Any]:
    state = root / "idle"
    parent = spawn_master(state, env)
    hosts = [spawn(host_argv(state, f"idle{i}", parent.pid, ["sleep", "3600"]), env) for i in range(count)]
    try:
        for i in range(count):
            wait_for(
                "hosts start",
                lambda i=i: any(e["event"] == "child_started" for e in events(state, f"worker-idle{i}")),
                120,
            )
        time.sleep(settle)  # start-up CPU (and each host's first beat and poll) is not idle CPU
        before = sum(procs.cpu_seconds(h.pid) or 0.0 for h in hosts)
        time.sleep(window)
        after = sum(procs.cpu_seconds(h.pid) or 0.0 for h in hosts)
    finally:
        for h in hosts:
            h.send_signal(signal.SIGTERM)
        for h in hosts:
            try:
                h.wait(15)
            except subprocess.TimeoutExpired:
                stop(h)
        stop(parent)
    used = after - before
    share = used / window
    return {"hosts": count, "window_s": window, "settle_s": settle, "cpu_s": used, "share_of_core": share}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes for a smoke run")
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    sizes = QUICK if args.quick else FULL
    root = Path(tempfile.mkdtemp(prefix="pi-matrix-bench-sup-"))
    agent = root / "agent"
    agent.mkdir()
    env = dict(os.environ, PI_CODING_AGENT_DIR=str(agent), HOME=str(root))
    env.pop("PI_MATRIX_STATE_DIR", None)
    started = time.monotonic()
    try:
        poll_ms = 25_000  # the default watcherPollMs: a pidfd, not the poll, sees the death
        death = death_latency(root, env, int(sizes["trials"]), poll_ms)
        memory = rss(root, env)
        cpu = idle_cpu(root, env, int(sizes["hosts"]), float(sizes["window"]), float(sizes["settle"]))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = death["p99_ms"] / max(death["bare_write_p99_ms"], 1e-6)
    rows = [
        (
            (
                f"1 parent death -> durable winding_down p99 ({death['trials']} trials)"
                f" / bare durable write p99 ({death['bare_writes']})"
            ),
            f"{death['p99_ms']:.2f} ms",
            f"{death['bare_write_p99_ms']:.2f} ms",
            f"{ratio:.2f}",
            "ratio <= 3",
            "yes" if ratio <= 3 else "NO",
        ),
        (
            "1 parent death -> winding_down p50 / bare durable write p50",
            f"{death['p50_ms']:.2f} ms",
            f"{death['bare_write_p50_ms']:.2f} ms",
            f"{death['p50_ms'] / max(death['bare_write_p50_ms'], 1e-6):.2f}",
            "-",
            "-",
        ),
        (
            "1 kill() -> winding_down p99 / watcherPollMs (the cadence a polling watcher would need)",
            f"{death['from_kill_p99_ms']:.1f} ms",
            f"{poll_ms} ms poll",
            f"{death['from_kill_p99_ms'] / poll_ms:.4f}",
            "p99 <= 100 ms",
            "yes" if death["from_kill_p99_ms"] <= 100 else "NO",
        ),
        (
            "2 host RSS / child RSS (stand-in)",
            f"{memory['host_rss'] / 2**20:.1f} MiB",
            f"{memory['child_rss'] / 2**20:.1f} MiB",
            f"{memory['host_rss'] / max(memory['child_rss'], 1):.2f}",
            "-",
            "-",
        ),
        (
            f"3 CPU of {cpu['hosts']} idle hosts over {cpu['window_s']:.0f} s",
            f"{cpu['cpu_s']:.3f} cpu-s",
            f"{cpu['window_s']:.0f} cpu-s (1 core)",
            f"{cpu['share_of_core']:.4f}",
            "<= 0.01 of a core",
            "yes" if cpu["share_of_core"] <= 0.01 else "NO",
        ),
    ]
    header = ("figure", "ours", "baseline", "ratio", "goal", "met")
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    print(f"bench_supervise ({'quick' if args.quick else 'full'}): {os.cpu_count()} CPUs, "
          f"{time.monotonic() - started:.1f} s")  # fmt: skip
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(
        json.dumps({"death": death, "rss": memory, "idle_cpu": cpu, "table": rows}, indent=2) + "\n"
    )
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
