"""Issue 30.6: a job round whose host was killed -9 after its agent started tells the truth.

While the agent runs on without a host the job says ``working (unsupervised: host gone)``, never
``finished``, and no result is written; once that agent ends, the next reader (``pi-matrix
reconcile`` here) writes exactly one ``exited`` result. An exact master that rehosts the agent
first gives the round a new host, which ends it by the agent's own marker. Real processes: the
stand-in agent under real hosts, killed by identity.
"""

from __future__ import annotations

import json
from typing import Any

from helpers import kill_now
from labs import Lab, hostless_agent, rehosted
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.model import ResultKind


def _job_json(at: Lab, job_id: str) -> dict[str, Any]:
    shown = at.cli("jobs", "--json", "--socket", at.socket)
    assert shown.returncode == 0, shown.stderr
    (view,) = [v for v in json.loads(shown.stdout) if v["jobId"] == job_id]
    return dict(view)


def _results(at: Lab) -> list[str]:
    return sorted(p.name for p in (at.state / "results").glob("*.json") if not p.name.startswith("."))


def test_a_killed_hosts_round_runs_unsupervised_until_its_agent_ends_then_gets_one_exited_result(
    lab: Lab,
) -> None:
    lab.start_master()
    # The subprocess backend: in tmux the pane closes with its host and hangs its agent up.
    fired, agent, entry = hostless_agent(lab)
    assert entry.child_process is not None
    assert procs.is_alive(entry.child_process), "the agent died with its host"

    # The job view, twice over (a reconcile first never ends the round of a live agent).
    for _ in range(2):
        view = _job_json(lab, fired.job.id)
        (shown,) = view["agents"]
        assert view["state"] == "running", view
        assert shown["hostAlive"] is False and shown["result"] is None, shown
        assert shown["unsupervised"] == "unsupervised: host gone", shown
    table = lab.cli("job", fired.job.id)
    assert table.returncode == 0, table.stderr
    assert "round 1: working (unsupervised: host gone)" in table.stdout, table.stdout
    assert lab.result(fired.job.id, agent.agent_id) is None
    assert _results(lab) == []

    kill_now(entry.child_process)
    done = lab.cli("reconcile")
    assert done.returncode == 0, done.stderr
    assert f"job {fired.job.id} round 1: agent ended while unsupervised" in done.stdout, done.stdout

    result = lab.result(fired.job.id, agent.agent_id)
    assert result is not None and result.kind is ResultKind.EXITED
    assert "agent ended while unsupervised" in result.detail
    again = lab.cli("reconcile")  # a second reader writes nothing more
    assert again.returncode == 0 and "round_exited" not in again.stdout and "round 1" not in again.stdout
    assert _results(lab) == [f"{fired.job.id}.{agent.agent_id}.1.json"]  # exactly one
    view = _job_json(lab, fired.job.id)
    assert view["state"] == "finished", view
    assert view["agents"][0]["unsupervised"] is None


def test_a_rehosted_agents_round_is_watched_again_and_ends_by_its_marker(sublab: Lab) -> None:
    master = sublab.start_master()
    # The worker's host dies (its agent runs on), then the master and the master's own agent.
    fired, agent, entry = hostless_agent(sublab)
    running = sublab.store.get(master.key)
    kill_now(master.process, running.child_process)
    view = _job_json(sublab, fired.job.id)
    assert view["state"] == "running" and view["agents"][0]["unsupervised"], view

    second = sublab.start_master()  # the same session and task: exact, so it rehosts
    back = rehosted(sublab, entry, second)
    assert back.process is not None
    sublab.started.append(back.process)
    assert back.child_process == entry.child_process  # the same agent
    wait_for(
        "the job to follow the new host", lambda: _job_json(sublab, fired.job.id)["agents"][0]["hostAlive"]
    )
    assert sublab.result(fired.job.id, agent.agent_id) is None

    # The agent's turn ends: it prints the round's DONE marker, which the new host sees.
    told = sublab.cli("send", agent.key, "--abort")
    assert told.returncode == 0, told.stderr
    result = wait_for("the round's DONE result", lambda: sublab.result(fired.job.id, agent.agent_id))
    assert result.kind is ResultKind.DONE, result
    assert procs.is_alive(entry.child_process)  # the marker ended the round, not the agent
    view = _job_json(sublab, fired.job.id)
    assert view["state"] == "finished" and view["agents"][0]["result"]["kind"] == "done", view


def test_in_tmux_the_agent_hung_up_with_its_killed_hosts_pane_ends_its_round_once(lab: Lab) -> None:
    lab.start_master()
    fired = lab.fire("HANG long work")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    assert entry.child_process is not None
    lab.started.append(entry.child_process)

    kill_now(entry.process)
    assert procs.wait_for_exit(entry.child_process, 10), "the pane's agent outlived its pane"
    view = _job_json(lab, fired.job.id)  # ``jobs`` reconciles first: it notices the end
    (shown,) = view["agents"]
    assert view["state"] == "finished", view
    assert shown["result"]["kind"] == "exited" and shown["unsupervised"] is None, shown
    _job_json(lab, fired.job.id)
    assert _results(lab) == [f"{fired.job.id}.{agent.agent_id}.1.json"]  # exactly one


def test_a_masters_activation_writes_the_result_of_a_round_whose_host_and_agent_ended(
    sublab: Lab,
) -> None:
    master = sublab.start_master()
    fired = sublab.fire("HANG long work", backend="subprocess")
    (agent,) = fired.job.agents
    entry = sublab.worker(agent.key)
    kill_now(entry.process, entry.child_process)
    running = sublab.store.get(master.key)
    kill_now(master.process, running.child_process)
    assert sublab.result(fired.job.id, agent.agent_id) is None  # nobody has looked yet

    sublab.start_master()  # its activation looks

    result = wait_for("the round's result", lambda: sublab.result(fired.job.id, agent.agent_id))
    assert result.kind is ResultKind.EXITED and "agent ended while unsupervised" in result.detail
