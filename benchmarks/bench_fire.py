"""Dispatcher benchmark: firing N stand-in agents vs launching the same panes by raw tmux calls.

    python benchmarks/bench_fire.py [--quick] [--agents N]

Both sides launch the same pane command (the agent host running the bundled stand-in, with the
same env) on a private tmux socket, one after the other in one run, and are timed from the first
call until every agent is up (its host registered in the matrix and its agent process started):

* ours: ``Dispatcher.fire`` once per agent — profile, parent, cap and lane checks, the job
  record, the tmux window, the pane tags, the published ``launching`` entry (the agent's host
  watches its rounds itself, no watcher process:
  docs/decisions.md#the-agents-host-watches-its-own-rounds);
* ours again with ``confirm_s=5`` (``fire --confirm-start``, the default before fires stopped
  waiting for starts: docs/decisions.md#fires-do-not-wait-for-starts): each fire waits until its
  agent's host has started it, so twenty fires one after another wait twenty host start-ups; by
  default a fire waits on no start (a failed start still reaches the job and ``show``,
  dispatch/confirm.py);
* baseline: ``tmux -L <socket> new-window -d -e K=V … -- <the same argv>`` per agent, nothing else.

Prints the ratios (the goals: until all are up <= 1.2, the launch calls alone <= 2;
docs/decisions.md#fires-do-not-wait-for-starts) and writes benchmarks/results/bench_fire.json.
Everything started is stopped by identity and the private tmux servers are killed at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
from _baseline import with_ours_jobs
from _wait import wait_for
from bench_fleet import stop_all

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.confirm import CONFIRM_S
from pi_tmux_matrix.dispatch.manager import Dispatcher
from pi_tmux_matrix.dispatch.request import FireRequest
from pi_tmux_matrix.identity import AgentIdentityContract, ProcessIdentity, Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
from pi_tmux_matrix.settings import load_settings
from pi_tmux_matrix.testing.knobs import plugins_with_knobs

RESULTS = Path(__file__).resolve().parent / "results"


def _up(store: MatrixStore, count: int) -> bool:
    workers = [e for e in store.list().entries if e.role is Role.WORKER]
    return len(workers) >= count and all(e.status is Status.RUNNING and e.child_pid for e in workers)


def _wait_up(store: MatrixStore, count: int, timeout: float = 120.0) -> None:
    try:
        wait_for(f"{count} agents up", lambda: _up(store, count), timeout)
    except TimeoutError as exc:
        raise SystemExit(f"bench_fire: {exc}") from None


def _stop_all(store: MatrixStore, extra: list[ProcessIdentity]) -> None:
    targets = list(extra)
    for entry in store.list().entries:
        if entry.role is Role.WORKER:  # the master lives on for the next side
            targets += [i for i in (entry.process, entry.child_process) if i is not None]
    stop_all(targets)


def _kill_server(socket: str) -> None:
    subprocess.run(["tmux", "-L", socket, "kill-server"], capture_output=True, check=False, timeout=10)


def run(agents: int, root: Path) -> dict[str, Any]:
    agent_dir = root / "agent"
    agent_dir.mkdir()
    # The agents' master is a registered sleeper that never beats: the longest heartbeat makes its
    # window (2 x heartbeatMs + watcherPollMs, over 20 min) outlast any run.
    settings = {"processMatrix": {"heartbeatMs": 600000, "maxConcurrentAgents": 64}}
    (agent_dir / "settings.json").write_text(json.dumps(settings))
    work = root / "work"
    work.mkdir()
    env = dict(os.environ, PI_CODING_AGENT_DIR=str(agent_dir), STANDIN_STEPS="100000", STANDIN_STEP_S="1")
    for name in ("PI_PARENT_PID", "PI_PARENT_SESSION", "PI_TASK_REF", "PI_ORCHESTRATION_AGENT_ID"):
        env.pop(name, None)
    master = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"],
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    master_id = procs.identify(master.pid)
    assert master_id is not None
    tag = os.getpid()
    figures: dict[str, Any] = {"agents": agents}
    base_socket = f"pm-bench-fire-{tag}-base"
    sockets = [base_socket]
    try:
        # -- ours ------------------------------------------------------------------------------------
        # Twice: as fire runs by default (it waits on no host's start), and asked to confirm each
        # start (confirm_s=CONFIRM_S, ``fire --confirm-start``: each fire waits for its host).
        for side, confirm_s in (("ours", None), ("ours_confirmed", CONFIRM_S)):
            store = MatrixStore(root / f"state-{side}")
            _register_master(store, master_id)
            dispatcher = Dispatcher(
                store, load_settings(work, env), env=dict(env, PI_MATRIX_STATE_DIR=str(store.root)),
                plugins=plugins_with_knobs(env),
            )  # fmt: skip
            socket = f"pm-bench-fire-{tag}-{side}"
            sockets.append(socket)
            planned: list[tuple[list[str], dict[str, str]]] = []
            t0 = time.perf_counter()
            for i in range(agents):
                request = FireRequest(
                    task=f"HANG bench agent {i}", profile="stand-in", path=str(work), socket=socket,
                    parent_pid=master.pid, parent_session="bench",
                )  # fmt: skip
                if confirm_s is not None:
                    request = attrs.evolve(request, confirm_s=confirm_s)
                result = dispatcher.fire(request)
                planned += [(list(p.argv), dict(p.env)) for p in result.planned]
            fired = time.perf_counter()
            _wait_up(store, agents)
            up = time.perf_counter()
            figures[f"{side}_fire_s"] = fired - t0
            figures[f"{side}_up_s"] = up - t0
            _stop_all(store, [])
            _kill_server(socket)
            if side == "ours":
                ours_root, ours_planned = store.root, planned

        # -- baseline: the same argv and env, raw tmux calls ----------------------------------------
        base_store = MatrixStore(root / "state-base")
        _register_master(base_store, master_id)
        with_ours_jobs(ours_root, base_store)  # before the clock starts
        t0 = time.perf_counter()
        for i, (planned_argv, planned_env) in enumerate(ours_planned):
            # The same pane command, pointed at the baseline's own state dir.
            argv = [str(base_store.root) if word == str(ours_root) else word for word in planned_argv]
            pane_env = dict(planned_env, PI_MATRIX_STATE_DIR=str(base_store.root))
            command = ["tmux", "-L", base_socket]
            command += ["new-window", "-d"] if i else ["new-session", "-d", "-s", "bench"]
            for key, value in pane_env.items():
                command += ["-e", f"{key}={value}"]
            subprocess.run([*command, "--", *argv], check=True, env=env, cwd=work, timeout=30)
        fired = time.perf_counter()
        _wait_up(base_store, agents)
        up = time.perf_counter()
        figures["base_fire_s"] = fired - t0
        figures["base_up_s"] = up - t0
        _stop_all(base_store, [])
        _kill_server(base_socket)
    finally:
        for socket in sockets:  # a run that failed half-way leaves no server
            _kill_server(socket)
        procs.send_signal(master_id, signal.SIGKILL)
        master.wait(timeout=10)
    figures["ratio_up"] = figures["ours_up_s"] / figures["base_up_s"]
    figures["ratio_launch_calls"] = figures["ours_fire_s"] / figures["base_fire_s"]
    figures["ratio_launch_confirmed"] = figures["ours_confirmed_fire_s"] / figures["base_fire_s"]
    return figures


def _register_master(store: MatrixStore, master: ProcessIdentity) -> None:
    """The sleeper as a running master of ``store``: a host counts a parent that is none lost."""
    identity = AgentIdentityContract(agent_id="bench-master", session_id="bench")
    store.register(lifecycle.new_entry(role=Role.MASTER, identity=identity, process=master, now=now_ms()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 agents (a smoke run; numbers mean little)")
    parser.add_argument("--agents", type=int, default=None)
    parser.add_argument("--profile", action="store_true", help="cProfile the fires and print where they go")
    parser.add_argument("--output", type=Path, default=RESULTS / "bench_fire.json", help="the JSON file")
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        print("bench_fire: tmux is not installed", file=sys.stderr)
        return 2
    agents = args.agents or (5 if args.quick else 20)
    profiler = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory(prefix="pi-matrix-bench-fire-") as tmp:
        if profiler is not None:
            profiler.enable()
        figures = run(agents, Path(tmp))
        if profiler is not None:
            profiler.disable()
    if profiler is not None:
        # Where a fire's time goes, both sides of ours together (unconfirmed and confirmed).
        stats = pstats.Stats(profiler, stream=sys.stdout).strip_dirs().sort_stats("cumulative")
        stats.print_stats("manager|confirm|tmux|fsio|plan|store", 16)
    rows = [
        (
            "fire N agents until all are up",
            figures["ours_up_s"],
            figures["base_up_s"],
            figures["ratio_up"],
            "<= 1.2",
        ),
        (
            "until all are up, confirmed",
            figures["ours_confirmed_up_s"],
            figures["base_up_s"],
            figures["ours_confirmed_up_s"] / figures["base_up_s"],
            "-",
        ),
        (
            "the launch calls alone",
            figures["ours_fire_s"],
            figures["base_fire_s"],
            figures["ratio_launch_calls"],
            "<= 2",
        ),
        (
            "the launch calls, confirmed",
            figures["ours_confirmed_fire_s"],
            figures["base_fire_s"],
            figures["ratio_launch_confirmed"],
            "-",
        ),
    ]
    print(
        f"bench_fire ({'quick' if args.quick else 'full'}): {agents} stand-in agents, {os.cpu_count()} CPUs"
    )
    print(f"{'figure':<32}  {'ours':>9}  {'raw tmux':>9}  {'ratio':>6}  goal    met")
    for name, ours, base, ratio, goal in rows:
        met = "-" if goal == "-" else ("yes" if ratio <= float(goal.removeprefix("<= ")) else "NO")
        print(f"{name:<32}  {ours:>8.2f}s  {base:>8.2f}s  {ratio:>6.2f}  {goal:<6}  {met}")
    out: Path = args.output
    out.parent.mkdir(parents=True, exist_ok=True)
    figures["rows"] = [
        {"figure": f"fire {agents} agents until all are up", "ours": figures["ours_up_s"], "unit": "s",
         "baseline": figures["base_up_s"], "baseline_is": "the same panes by raw tmux new-window calls",
         "ratio": figures["ratio_up"], "goal": "ratio <= 1.2", "met": figures["ratio_up"] <= 1.2},
        {"figure": f"fire {agents} agents until all are up, each start confirmed (--confirm-start)",
         "ours": figures["ours_confirmed_up_s"], "unit": "s", "baseline": figures["base_up_s"],
         "baseline_is": "the same panes by raw tmux new-window calls",
         "ratio": figures["ours_confirmed_up_s"] / figures["base_up_s"], "goal": "-", "met": None},
        {"figure": f"fire {agents} agents: the launch calls alone", "ours": figures["ours_fire_s"],
         "unit": "s",
         "baseline": figures["base_fire_s"], "baseline_is": "raw tmux new-window calls",
         "ratio": figures["ratio_launch_calls"], "goal": "ratio <= 2",
         "met": figures["ratio_launch_calls"] <= 2},
        {"figure": f"fire {agents} agents: the launch calls alone, each start confirmed (--confirm-start)",
         "ours": figures["ours_confirmed_fire_s"], "unit": "s",
         "baseline": figures["base_fire_s"], "baseline_is": "raw tmux new-window calls",
         "ratio": figures["ratio_launch_confirmed"], "goal": "-", "met": None},
    ]  # fmt: skip
    out.write_text(json.dumps(figures, indent=2) + "\n")
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
