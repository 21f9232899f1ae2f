"""A fleet of N stand-in agents in tmux under one master, each figure against a baseline measured
in the same run (docs/decisions.md#a-host-loads-only-what-it-uses).

    python benchmarks/bench_fleet.py [--quick] [--agents N]

A real ``pi-matrix master --headless`` (heartbeating) owns N agents fired one after another by
``Dispatcher.fire`` (the bundled stand-in, task ``HANG``, so each stays up) into a private tmux
server. Default settings, except ``maxConcurrentAgents`` (a cap per working directory, bounded at
256): set to N, in one working directory (more than 256 spread over as many as that needs).

1. PSS (``/proc/PID/smaps_rollup``) of our processes per agent: its host, and apart from it the
   helpers tmux runs for us (the ``cat`` of each pane's ``pipe-pane``). Baseline: the PSS of a
   bare ``python -c`` sleeper (the interpreter alone). Goal: <= 15 MiB per agent, all of ours.
   With it, the RSS of one host.
2. Idle CPU of all the hosts (and the master) over 30 s (utime + stime from ``/proc/PID/stat``),
   opened once the last fire is past every host's first heartbeat and parent poll (they load
   what they need on first use: start-up, not idling), as a share of one core. Goal: <= 1 %.
3. Fire: N fires one after another until every agent is up, against the same pane commands by
   raw ``tmux new-window`` calls (into a state dir of their own, after ours are stopped).
4. ``ls``, ``tree``, ``jobs``, ``top --once`` with N agents, as subprocesses (median of 3),
   against ``pi-matrix --version`` (the interpreter and the CLI's own start). Goal: <= 1 s each.
5. Activation: the master is killed with SIGKILL and a new ``pi-matrix master --once`` of the same
   session and task re-adopts the N orphans; wall time until it reports, against the same
   activation over an empty state dir. Goal: <= 2 s.

The machine's other load shows in every figure (times above all): a shared box is noisy.
Everything started is stopped by identity, and the private tmux servers are killed at the end,
also when the run fails. Prints one table and writes benchmarks/results/bench_fleet.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from _baseline import with_ours_jobs
from _wait import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.manager import Dispatcher
from pi_tmux_matrix.dispatch.request import FireRequest
from pi_tmux_matrix.identity import AgentIdentityContract, ProcessIdentity, Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
from pi_tmux_matrix.settings import BOUNDS, load_settings
from pi_tmux_matrix.testing.knobs import plugins_with_knobs

RESULTS = Path(__file__).resolve().parent / "results"
SESSION = "bench-fleet"
GOAL = "bench-fleet-goal"
CAP = BOUNDS["maxConcurrentAgents"][2]  # the setting's upper bound: agents per working directory
MIB = 2**20
TICK = os.sysconf("SC_CLK_TCK")
# settle: from the last fire to the idle window. Past the first heartbeat (30 s) and parent poll
# (25 s) of the last host: each host's first of those pays one-time costs (modules and the codec
# loaded on first use), which are start-up, not idling.
FULL = {"agents": 100, "window": 30.0, "settle": 32.0}
QUICK = {"agents": 10, "window": 10.0, "settle": 3.0}


def pss_bytes(pid: int) -> int:
    """Proportional set size: shared pages (the interpreter's text, say) split among their
    users, so N hosts add up to what they really cost (their RSS counts the shared pages N times)."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    return 0


def rss_bytes(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK  # fields 14 and 15 of stat(5)


def descendants(root_pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root_pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def workers(store: MatrixStore) -> list[Any]:
    return [e for e in store.list().entries if e.role is Role.WORKER]


def all_up(store: MatrixStore, count: int) -> bool:
    found = workers(store)
    return len(found) >= count and all(e.status is Status.RUNNING and e.child_pid for e in found)


def cli(env: dict[str, str], state: Path, *words: str, timeout: float = 60) -> tuple[float, str]:
    """One ``pi-matrix`` run as a subprocess: its wall time and its output (it must succeed)."""
    t0 = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), *words],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    took = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"pi-matrix {' '.join(words)}: exit {done.returncode}: {done.stderr[-2000:]}")
    return took, done.stdout


def median_cli(env: dict[str, str], state: Path, *words: str, repeats: int = 3) -> float:
    return statistics.median(cli(env, state, *words)[0] for _ in range(repeats))


def spawn_master(env: dict[str, str], state: Path) -> subprocess.Popen[bytes]:
    """The fleet's master: a real, heartbeating ``pi-matrix master`` (no agent of its own)."""
    master = subprocess.Popen(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(state), "master", "--session-id",
         SESSION, "--task-ref", GOAL, "--headless"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    up = state / f"master-{SESSION}.json"
    wait_for("master", lambda: up.exists() or master.poll() is not None, 30, step=0.05)
    if master.poll() is not None:
        raise RuntimeError(f"the bench master ended with {master.returncode}")
    return master


def stop_all(identities: Iterable[ProcessIdentity]) -> None:
    """TERM, then KILL what is left, each process by its identity (a reused pid is left alone)."""
    procs.stop(identities, 5.0, kill_wait_s=5.0)


def fleet_processes(store: MatrixStore) -> list[ProcessIdentity]:
    found = []
    for entry in store.list().entries:
        found += [i for i in (entry.process, entry.child_process) if i is not None]
    return found


def kill_server(socket: str) -> None:
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False, timeout=10)


def server_pid(socket: str) -> int | None:
    done = subprocess.run(
        ["tmux", "-L", socket, "display-message", "-p", "#{pid}"],
        capture_output=True, text=True, check=False, timeout=10,
    )  # fmt: skip
    return int(done.stdout) if done.returncode == 0 and done.stdout.strip().isdigit() else None


def interpreter_pss() -> tuple[int, int]:
    """PSS and RSS of a bare interpreter (``python -c`` sleeping): what any Python host costs."""
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], stdin=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        return pss_bytes(bare.pid), rss_bytes(bare.pid)
    finally:
        bare.kill()
        bare.wait()


def fire_fleet(
    env: dict[str, str], store: MatrixStore, works: list[Path], *, socket: str, master: int, count: int
) -> tuple[float, list[tuple[list[str], dict[str, str], str]]]:
    """Fire ``count`` agents one after another; the time until all are up, and what was launched."""
    settings = load_settings(works[0], env)
    dispatcher = Dispatcher(
        store, settings, env=dict(env, PI_MATRIX_STATE_DIR=str(store.root)),
        plugins=plugins_with_knobs(env, matrix=settings.enabled),
    )  # fmt: skip
    planned: list[tuple[list[str], dict[str, str], str]] = []
    t0 = time.perf_counter()
    for i in range(count):
        work = works[i % len(works)]
        request = FireRequest(
            task=f"HANG fleet agent {i}", profile="stand-in", path=str(work), socket=socket,
            parent_pid=master, parent_session=SESSION, goal_id=GOAL,
        )  # fmt: skip
        result = dispatcher.fire(request)
        planned += [(list(p.argv), dict(p.env), str(work)) for p in result.planned]
    wait_for(f"{count} agents up", lambda: all_up(store, count), 300, step=0.05)
    return time.perf_counter() - t0, planned


def raw_fleet(
    env: dict[str, str], store: MatrixStore, socket: str, ours_root: Path,
    planned: list[tuple[list[str], dict[str, str], str]],
) -> float:  # fmt: skip
    """The same pane commands by raw tmux calls, into ``store``; the time until all are up."""
    with_ours_jobs(ours_root, store)  # before the clock starts
    t0 = time.perf_counter()
    ours, theirs = str(ours_root), str(store.root)
    for i, (planned_argv, planned_env, cwd) in enumerate(planned):
        argv = [theirs if word == ours else word for word in planned_argv]
        command = ["tmux", "-L", socket]
        command += ["new-window", "-d"] if i else ["new-session", "-d", "-s", "bench"]
        for key, value in planned_env.items():
            command += ["-e", f"{key}={theirs if value == ours else value}"]
        subprocess.run([*command, "-c", cwd, "--", *argv], check=True, env=env, cwd=cwd, timeout=30)
    wait_for(f"{len(planned)} raw agents up", lambda: all_up(store, len(planned)), 300, step=0.05)
    return time.perf_counter() - t0


def run(count: int, window: float, settle: float, root: Path) -> dict[str, Any]:
    agent_dir = root / "agent"
    agent_dir.mkdir()
    (agent_dir / "settings.json").write_text(
        json.dumps({"processMatrix": {"maxConcurrentAgents": min(count, CAP)}})
    )
    works = [root / f"work-{i}" for i in range(-(-count // CAP))]
    for work in works:
        work.mkdir()
    env = dict(os.environ, PI_CODING_AGENT_DIR=str(agent_dir), STANDIN_STEPS="100000", STANDIN_STEP_S="1")
    for name in ("PI_PARENT_PID", "PI_PARENT_SESSION", "PI_TASK_REF", "PI_ORCHESTRATION_AGENT_ID", "TMUX"):
        env.pop(name, None)
    tag = os.getpid()
    socket, base_socket = f"pm-bench-fleet-{tag}", f"pm-bench-fleet-{tag}-base"
    store = MatrixStore(root / "state")
    base_store = MatrixStore(root / "state-base")
    figures: dict[str, Any] = {"agents": count, "working_dirs": len(works), "window_s": window}
    figures["settle_s"] = settle
    started: list[ProcessIdentity] = []
    try:
        master = spawn_master(env, store.root)
        master_id = procs.identify(master.pid)
        assert master_id is not None
        started.append(master_id)

        # -- fire ---------------------------------------------------------------------------------
        figures["fire_up_s"], planned = fire_fleet(
            env, store, works, socket=socket, master=master.pid, count=count
        )
        fired_at = time.monotonic()
        entries = workers(store)
        hosts = [e.process for e in entries if e.process is not None]
        agents = {e.child_pid for e in entries}
        started += fleet_processes(store)

        # -- idle CPU -----------------------------------------------------------------------------
        time.sleep(max(0.0, settle - (time.monotonic() - fired_at)))
        watched = [h.pid for h in hosts] + [master.pid]
        before, master_before = sum(cpu_s(p) for p in watched), cpu_s(master.pid)
        time.sleep(window)
        used = sum(cpu_s(p) for p in watched) - before
        figures["idle_master_cpu_s"] = cpu_s(master.pid) - master_before  # of the total
        figures["idle_cpu_s"] = used
        figures["idle_share_of_core"] = used / window
        figures["alive_after_window"] = sum(procs.is_alive(h) for h in hosts)

        # -- memory, after the idle window: steady state (a host loads some modules at its first
        # heartbeat and parent poll) -----------------------------------------------------------
        server = server_pid(socket)
        helpers = [p for p in (descendants(server) if server else []) if p not in agents]
        helpers = [p for p in helpers if p not in {h.pid for h in hosts}]
        names: dict[str, int] = {}
        for pid in helpers:
            names[comm(pid)] = names.get(comm(pid), 0) + 1
        host_pss = sum(pss_bytes(h.pid) for h in hosts)
        helper_pss = sum(pss_bytes(p) for p in helpers)
        figures["host_pss_per_agent"] = host_pss / count
        figures["helper_pss_per_agent"] = helper_pss / count
        figures["helpers"] = names
        figures["ours_pss_per_agent"] = (host_pss + helper_pss) / count
        figures["host_rss"] = statistics.median(rss_bytes(h.pid) for h in hosts)
        figures["master_pss"] = pss_bytes(master.pid)
        figures["agent_pss_per_agent"] = sum(pss_bytes(p) for p in agents if p) / count
        figures["python_pss"], figures["python_rss"] = interpreter_pss()

        # -- listings -----------------------------------------------------------------------------
        figures["version_s"] = median_cli(env, store.root, "--version")
        for verb, words in {
            "ls": ("ls",), "tree": ("tree",), "jobs": ("jobs", "--socket", socket),
            "top": ("top", "--once", "--parent-pid", str(master.pid), "--parent-session", SESSION),
        }.items():  # fmt: skip
            figures[f"{verb}_s"] = median_cli(env, store.root, *words)

        # -- baseline fire: the same panes by raw tmux calls, into a state dir of their own --------
        # Under the same master (registered there too), beside ours; stopped before activation.
        contract = AgentIdentityContract(agent_id=SESSION, session_id=SESSION)
        base_store.register(
            lifecycle.new_entry(
                role=Role.MASTER, identity=contract, process=master_id, now=now_ms(), task_ref=GOAL
            )
        )
        try:
            figures["raw_fire_up_s"] = raw_fleet(env, base_store, base_socket, store.root, planned)
        finally:
            started += fleet_processes(base_store)
            stop_all(fleet_processes(base_store))
            kill_server(base_socket)

        # -- activation after kill -9 -------------------------------------------------------------
        empty = root / "state-empty"
        activate = ("master", "--session-id", SESSION, "--task-ref", GOAL, "--headless", "--once", "--json")
        figures["activation_empty_s"], _ = cli(env, empty, *activate)
        procs.send_signal(master_id, signal.SIGKILL)
        master.wait(timeout=10)
        # The hosts see their parent die (their status, a second later, is recorded); the new
        # master's scan finds them orphans by the dead parent's identity either way.
        time.sleep(1.0)
        statuses: dict[str, int] = {}
        for e in workers(store):
            statuses[e.status.value] = statuses.get(e.status.value, 0) + 1
        figures["statuses_before_activation"] = statuses
        took, out = cli(env, store.root, *activate)
        report = json.loads(out)
        figures["activation_s"] = took
        figures["activation_orphans"] = len(report.get("orphans", []))
        figures["activation_readopted"] = sum(
            1 for o in report.get("orphans", []) if o.get("action") == "re-adopted"
        )

    finally:
        for st in (store, base_store):
            started += fleet_processes(st)
        stop_all(started)
        for sock in (socket, base_socket):
            kill_server(sock)
    return figures


def rows_of(f: dict[str, Any]) -> list[dict[str, Any]]:
    n = f["agents"]
    per = "per agent"
    listing_goal = 1.0

    def row(  # noqa: PLR0917 - one table row, in the table's column order
        figure: str, ours: float, unit: str, base: float, base_is: str, goal: str, met: bool | None
    ) -> dict[str, Any]:
        return {"figure": figure, "ours": ours, "unit": unit, "baseline": base, "baseline_is": base_is,
                "ratio": ours / base if base else None, "goal": goal, "met": met}  # fmt: skip

    rows = [
        row(f"PSS of ours {per}, {n} agents (host + pipe helpers)", f["ours_pss_per_agent"] / MIB, "MiB",
            f["python_pss"] / MIB, "a bare python -c sleeper's PSS", "<= 15 MiB",
            f["ours_pss_per_agent"] <= 15 * MIB),
        row(f"PSS of the host {per}, {n} agents", f["host_pss_per_agent"] / MIB, "MiB",
            f["python_pss"] / MIB, "a bare python -c sleeper's PSS", "-", None),
        row(f"PSS of the pipe helpers {per} ({_names(f['helpers'])})", f["helper_pss_per_agent"] / MIB, "MiB",
            f["python_pss"] / MIB, "a bare python -c sleeper's PSS", "-", None),
        row("RSS of one host (median)", f["host_rss"] / MIB, "MiB", f["python_rss"] / MIB,
            "a bare python -c sleeper's RSS", "-", None),
        row(f"idle CPU of {n} hosts + master over {f['window_s']:.0f} s", f["idle_share_of_core"] * 100, "%",
            100.0, "one core", "<= 1 % of a core", f["idle_share_of_core"] <= 0.01),
        row(f"fire {n} agents until all are up", f["fire_up_s"], "s", f["raw_fire_up_s"],
            "the same panes by raw tmux new-window calls", "-", None),
    ]  # fmt: skip
    for verb, name in (("ls", "ls"), ("tree", "tree"), ("jobs", "jobs"), ("top", "top --once")):
        rows.append(
            row(f"pi-matrix {name}, {n} agents", f[f"{verb}_s"], "s", f["version_s"], "pi-matrix --version",
                f"<= {listing_goal:g} s", f[f"{verb}_s"] <= listing_goal)
        )  # fmt: skip
    rows.append(
        row(f"master activation over {n} orphans after kill -9 ({f['activation_readopted']} re-adopted)",
            f["activation_s"], "s", f["activation_empty_s"], "the same activation over an empty state dir",
            "<= 2 s", f["activation_s"] <= 2.0 and f["activation_readopted"] == n)
    )  # fmt: skip
    return rows


def _names(helpers: dict[str, int]) -> str:
    return ", ".join(f"{count} {name}" for name, count in sorted(helpers.items())) or "none"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 agents, a 10 s window (numbers mean little)")
    parser.add_argument("--agents", type=int, default=None)
    parser.add_argument("--window", type=float, default=None, help="the idle CPU window, seconds")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_fleet.json", help="the JSON file")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("bench_fleet: tmux is not installed", file=sys.stderr)
        return 2
    sizes = QUICK if args.quick else FULL
    count = args.agents or int(sizes["agents"])
    window = args.window or float(sizes["window"])
    with tempfile.TemporaryDirectory(prefix="pi-matrix-bench-fleet-") as tmp:
        figures = run(count, window, float(sizes["settle"]), Path(tmp))
    rows = rows_of(figures)
    print(f"bench_fleet ({'quick' if args.quick else 'full'}): {count} stand-in agents in tmux under one "
          f"master, {os.cpu_count()} CPUs (shared: noisy)")  # fmt: skip
    print(f"{'figure':<62}  {'ours':>10}  {'baseline':>10}  {'ratio':>6}  {'goal':<16}  met")
    for r in rows:
        met = "-" if r["met"] is None else ("yes" if r["met"] else "NO")
        ratio = f"{r['ratio']:.2f}" if r["ratio"] is not None else "-"
        ours, base = f"{r['ours']:.3g} {r['unit']}", f"{r['baseline']:.3g} {r['unit']}"
        print(f"{r['figure'][:62]:<62}  {ours:>10}  {base:>10}  {ratio:>6}  {r['goal']:<16}  {met}")
    out: Path = args.output
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(dict(figures, rows=rows), indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
