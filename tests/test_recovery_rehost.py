"""A dead host's live agent is rehosted, never left unsupervised (issue 18.2): the next exact
master starts a new host that takes the agent over by pid + start time; ``send`` and ``stop`` work
on it again and its end is recorded. Each test was seen to fail before the change."""

from __future__ import annotations

from pathlib import Path

from helpers import kill_now
from labs import Lab, hostless_agent, rehosted
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix.model import Status


def test_a_live_agent_whose_host_died_is_rehosted_by_its_exact_master_then_steered_and_stopped(
    sublab: Lab,
) -> None:
    master = sublab.start_master()
    # The worker's host dies (its agent runs on), then the master and the master's own agent.
    fired, agent, entry = hostless_agent(sublab, goal_id="goal-1")
    assert entry.task_ref == "goal-1"
    running = sublab.store.get(master.key)
    kill_now(master.process, running.child_process)
    assert procs.is_alive(entry.child_process)

    second = sublab.start_master()  # the same session and task: exact
    back = rehosted(sublab, entry, second)
    assert back.process is not None and procs.is_alive(back.process)
    sublab.started.append(back.process)
    assert back.child_process == entry.child_process  # the same agent, not a second one
    assert back.identity == entry.identity

    # The job follows its agent's new host (review: rehosted agents were left out of their job).
    def followed() -> bool:
        (view,) = [v for v in sublab.dispatcher().reconcile() if v["jobId"] == fired.job.id]
        return bool(view["agents"][0]["hostAlive"])

    wait_for("the job to follow its agent's new host", followed, timeout=10)
    follow = sublab.cli("followup", fired.job.id, "--", "and one more thing")
    assert follow.returncode == 0, follow.stderr
    steer = sublab.cli("send", agent.key, "--steer", "still there?")
    assert steer.returncode == 0, steer.stderr
    stop = sublab.cli("stop", agent.key, "--confirm", "yes-tmux-stop")
    assert stop.returncode == 0, stop.stderr
    assert procs.wait_for_exit(entry.child_process, 20), "the rehosted agent was not stopped"
    ended = wait_for(
        "its end recorded",
        lambda: e if (e := sublab.store.find(agent.key)) and e.exit is not None else None,
        timeout=20,
    )
    assert ended.status in (Status.TERMINAL, Status.CLOSED)  # closed once its handoff is delivered
    assert ended.exit is not None and ended.exit.code is None


def test_stop_job_stops_an_agent_whose_host_died_by_its_identity(sublab: Lab) -> None:
    """No host is left to forward the stop: ``stop JOB`` signals the recorded agent itself (it used to
    print ``stopped job`` while the agent ran on)."""
    sublab.start_master()
    fired, agent, entry = hostless_agent(sublab)
    stop = sublab.cli("stop", fired.job.id, "--confirm", "yes-tmux-stop")
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
