"""A dead host's live agent is rehosted, never left unsupervised (issue 18.2): the next exact
master starts a new host that takes the agent over by pid + start time; ``send`` and ``stop`` work
on it again and its end is recorded. Each test was seen to fail before the change."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from test_dispatch import Lab, sublab, wait_for  # noqa: F401 - sublab is a fixture

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.model import JobAgent
from pi_tmux_matrix.matrix.model import Entry, Status


def _cli(at: Lab, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(at.state), *words],
        capture_output=True, text=True, env=at.env, timeout=60, check=False, cwd=at.work,
    )  # fmt: skip


def _kill(*identities: procs.ProcessIdentity | None) -> None:
    for ident in identities:
        if ident is not None:
            procs.send_signal(ident, signal.SIGKILL)
            assert procs.wait_for_exit(ident, 5), f"pid {ident.pid} outlived SIGKILL"


def _hostless_agent(at: Lab, **fields: Any) -> tuple[Any, JobAgent, Entry]:
    """A detached stand-in fired and registered, then its host killed -9 while its agent runs
    on: (the fire's result, its agent, its entry as registered)."""
    fired = at.fire("HANG long work", backend="subprocess", **fields)
    (agent,) = fired.job.agents
    entry = at.worker(agent.key)
    assert entry.child_process is not None
    at.started.append(entry.child_process)
    _kill(entry.process)
    return fired, agent, entry


def _rehosted(at: Lab, entry: Entry, master: Entry) -> Entry:
    """``entry``'s agent running again under a new host whose parent is ``master``."""
    return wait_for(
        "the agent under a new host",
        lambda: (
            e
            if (e := at.store.find(entry.key))
            and e.pid != entry.pid
            and e.status is Status.RUNNING
            and e.parent_pid == master.pid
            else None
        ),
        timeout=20,
    )


def test_a_live_agent_whose_host_died_is_rehosted_by_its_exact_master_then_steered_and_stopped(
    sublab: Lab,  # noqa: F811
) -> None:
    master = sublab.start_master()
    # The worker's host dies (its agent runs on), then the master and the master's own agent.
    fired, agent, entry = _hostless_agent(sublab, goal_id="goal-1")
    assert entry.task_ref == "goal-1"
    running = sublab.store.get(master.key)
    _kill(master.process, running.child_process)
    assert procs.is_alive(entry.child_process)

    second = sublab.start_master()  # the same session and task: exact
    back = _rehosted(sublab, entry, second)
    assert back.process is not None and procs.is_alive(back.process)
    sublab.started.append(back.process)
    assert back.child_process == entry.child_process  # the same agent, not a second one
    assert back.identity == entry.identity

    # The job follows its agent's new host (review: rehosted agents were left out of their job).
    def followed() -> bool:
        (view,) = [v for v in sublab.dispatcher().reconcile() if v["jobId"] == fired.job.id]
        return bool(view["agents"][0]["hostAlive"])

    wait_for("the job to follow its agent's new host", followed, timeout=10)
    follow = _cli(sublab, "followup", fired.job.id, "--", "and one more thing")
    assert follow.returncode == 0, follow.stderr
    steer = _cli(sublab, "send", agent.key, "--steer", "still there?")
    assert steer.returncode == 0, steer.stderr
    stop = _cli(sublab, "stop", agent.key, "--confirm", "yes-tmux-stop")
    assert stop.returncode == 0, stop.stderr
    assert procs.wait_for_exit(entry.child_process, 20), "the rehosted agent was not stopped"
    ended = wait_for(
        "its end recorded",
        lambda: e if (e := sublab.store.find(agent.key)) and e.exit is not None else None,
        timeout=20,
    )
    assert ended.status in (Status.TERMINAL, Status.CLOSED)  # closed once its handoff is delivered
    assert ended.exit is not None and ended.exit.code is None


def test_stop_job_stops_an_agent_whose_host_died_by_its_identity(sublab: Lab) -> None:  # noqa: F811
    """No host is left to forward the stop: ``stop JOB`` signals the recorded agent itself (it used to
    print ``stopped job`` while the agent ran on)."""
    sublab.start_master()
    fired, agent, entry = _hostless_agent(sublab)
    stop = _cli(sublab, "stop", fired.job.id, "--confirm", "yes-tmux-stop")
    assert stop.returncode == 0, stop.stderr
    assert procs.wait_for_exit(entry.child_process, 10), "the unsupervised agent ran on"
    ended = sublab.store.get(agent.key)
    assert ended.status in (Status.TERMINAL, Status.CLOSED)  # closed once its handoff is delivered
    assert ended.exit is not None and ended.exit.code is None


def test_a_launch_ticket_is_taken_by_exactly_one_taker_even_with_a_stray_temp_file(tmp_path: Path) -> None:
    """Tickets are taken without a lock (the host and the launcher race by design): each taker
    writes its own temp file. A shared temp name made the second taker fail with 'File exists'
    instead of learning who holds the ticket (review finding)."""
    from pi_tmux_matrix.matrix.store import MatrixStore
    from pi_tmux_matrix.matrix.tickets import LaunchTickets, Taken, new_ticket

    store = MatrixStore(tmp_path / "state")
    tickets = LaunchTickets(store)
    ticket = new_ticket()
    folder = store.side_dir("launches")
    (folder / f".{ticket}.tmp").write_text("a writer mid-write\n")  # another taker's temp file
    me = procs.current()
    assert tickets.take(ticket, Taken(me)) is None
    held = tickets.take(ticket, Taken(None, "gave up"))
    assert held is not None and held.host == me
