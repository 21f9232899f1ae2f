"""tmux dying is not the task's end (issue 18.5): agents killed by their tmux server's end are
recorded ``resumable`` (reason ``tmux_lost``), ``jobs`` says ``gone`` (no server) rather than
``unreachable`` (a server that does not answer). Each test was seen to fail before the change."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from labs import Lab
from pilabs import PiPair
from tmux_support import kill_tmux_server
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import Role
from pi_tmux_matrix.matrix.model import Status


def test_killing_the_tmux_server_leaves_its_workers_resumable_and_jobs_says_gone(lab: Lab) -> None:
    lab.start_master()
    agents = [lab.fire(f"HANG work {n}").job.agents[0] for n in (1, 2)]
    entries = [lab.worker(agent.key) for agent in agents]
    kill_tmux_server(lab.socket)
    for entry in entries:
        assert procs.wait_for_exit(entry.process, 20), "the host outlived its pane"  # type: ignore[arg-type]
    for entry in entries:
        after = lab.store.get(entry.key)
        assert after.status is Status.RESUMABLE, (after.status, after.reason)
        assert after.reason == "tmux_lost" and after.resumable is not None
        assert after.exit is not None and not procs.is_alive(after.child_process)
    views = lab.dispatcher().reconcile()
    assert [v["agents"][0]["tmux"] for v in views] == ["gone", "gone"]
    workers = [e for e in lab.store.list().entries if e.role is Role.WORKER]
    assert {e.status for e in workers} == {Status.RESUMABLE}


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_tmux_kill_server_then_master_relaunch_tmux_brings_both_pi_workers_back_into_their_files(
    pilab: PiPair,
) -> None:
    """The acceptance scenario: two real pi workers, their tmux server killed, their master gone
    too; the next master of the session with ``--relaunch tmux`` brings both back into their exact
    session files (header id kept, the files grow with the wake turn)."""
    at, llm = pilab
    master = at.start_master()
    fired = [at.fire(f"Say hello {n}.", profile="pi-worker").job for n in (1, 2)]
    agents = [job.agents[0] for job in fired]
    files: dict[str, tuple[Path, int, str]] = {}
    for job, agent in zip(fired, agents, strict=True):
        at.worker(agent.key)
        wait_for("the DONE result", lambda j=job, a=agent: at.result(j.id, a.agent_id), timeout=60)  # type: ignore[misc]
        path = Path(agent.session_file or "")
        lines = path.read_text().splitlines()
        files[agent.key] = (path, len(lines), json.loads(lines[0])["id"])
    kill_tmux_server(at.socket)
    for agent in agents:
        lost = wait_for(
            "resumable after tmux died",
            lambda a=agent: e if (e := at.store.find(a.key)) and e.status is Status.RESUMABLE else None,  # type: ignore[misc]
            timeout=20,
        )
        assert lost.reason == "tmux_lost"
    running = at.store.get(master.key)
    for ident in (running.child_process, master.process):
        if ident is not None:
            procs.send_signal(ident, 9)
            procs.wait_for_exit(ident, 5)
    asked = len(llm.requests)

    second = at.start_master("boss", "goal-1", "--relaunch", "tmux", "--socket", at.socket)
    for agent in agents:
        back = wait_for(
            "the relaunched pi",
            lambda a=agent: (  # type: ignore[misc]
                e
                if (e := at.store.find(a.key))
                and e.status is Status.RUNNING
                and e.parent_pid == second.pid
                and e.child_pid
                else None
            ),
            timeout=40,
        )
        if back.process is not None:
            at.started.append(back.process)
        path, length, header_id = files[agent.key]
        assert back.identity.session_file == str(path)
        wait_for("the file to grow", lambda p=path, n=length: len(p.read_text().splitlines()) > n, timeout=40)  # type: ignore[misc]
        assert json.loads(path.read_text().splitlines()[0])["id"] == header_id
    wait_for("both wake turns at the fake LLM", lambda: len(llm.requests) >= asked + 2, timeout=40)
    assert sum("resumed in your own session" in text for text in llm.user_texts()) >= 2


def _cli(at: Lab, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", *words], capture_output=True, text=True, env=at.env,
        timeout=60, check=False,
    )  # fmt: skip


def _lose_and_resume(lab: Lab, master: Any, key: str) -> Any:
    """The master lost, its worker left resumable, then ``resume KEY`` under a new master into
    the lab's tmux: the resumed host's entry once its agent runs."""
    from labs import lose_and_plan_resume

    _resumable, new_master, _dry = lose_and_plan_resume(lab, master, key)
    parent = ("--parent-pid", str(new_master.pid), "--parent-session", "boss2")
    done = _cli(lab, "resume", key, "--json", *parent, "--socket", lab.socket)
    assert done.returncode == 0, done.stderr
    pid = json.loads(done.stdout)["hostPid"]
    back = wait_for(
        "the resumed host", lambda: e if (e := lab.store.find(key)) and e.pid == pid and e.child_pid else None
    )
    assert back.process is not None
    lab.started.append(back.process)
    return back


def test_a_resumed_agent_stays_the_agent_of_its_job_for_jobs_followup_and_stop(lab: Lab) -> None:
    """Issue 18.13: after ``resume`` the job record follows the agent's new host and pane, so
    ``jobs`` shows it alive in its pane, ``followup JOB`` reaches it and ``stop JOB`` stops it (it
    used to say ``host gone tmux foreign`` and refuse the follow-up: no agent alive to take it)."""
    master = lab.start_master()
    fired = lab.fire("HANG resumable work")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    wait_for("the session file", lambda: Path(entry.identity.session_file or "").exists())
    back = _lose_and_resume(lab, master, agent.key)
    (view,) = [v for v in lab.dispatcher().reconcile() if v["jobId"] == fired.job.id]
    (shown,) = view["agents"]
    assert shown["hostAlive"] is True and shown["tmux"] == "ours", shown
    follow = _cli(lab, "followup", fired.job.id, "--", "one more thing")
    assert follow.returncode == 0, follow.stderr
    stop = _cli(lab, "stop", fired.job.id, "--confirm", "yes-tmux-stop")
    assert stop.returncode == 0, stop.stderr
    assert procs.wait_for_exit(back.process, 20)


def test_a_resumed_agents_follow_up_round_is_watched_by_its_new_host(lab: Lab) -> None:
    """Issue 30.1 (review finding): no watcher process starts for a follow-up any more; the host
    of a resumed agent (launched unwatched: it answers its wake prompt, not a marker) watches the
    rounds a follow-up opens on its job, so the follow-up's marker gives the round its result."""
    master = lab.start_master()
    fired = lab.fire("Say hello.")  # its round ends; the agent stays up, idle
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    wait_for("round 1's result", lambda: lab.result(fired.job.id, agent.agent_id, 1), timeout=30)
    wait_for("the session file", lambda: Path(entry.identity.session_file or "").exists())
    _lose_and_resume(lab, master, agent.key)
    follow = _cli(lab, "followup", fired.job.id, "--", "one more thing")
    assert follow.returncode == 0, follow.stderr
    result = wait_for("round 2's result", lambda: lab.result(fired.job.id, agent.agent_id, 2), timeout=30)
    assert result.kind.value == "done", result


def test_a_pane_closed_by_hand_ends_its_agent_and_is_not_taken_for_a_lost_tmux(lab: Lab) -> None:
    """Only a tmux server's end makes a worker resumable: a pane its owner closes (kill-pane, a
    closed window) while the server runs on ends the agent as asked (review finding)."""
    import subprocess

    lab.start_master()
    (agent,) = lab.fire("HANG work").job.agents
    entry = lab.worker(agent.key)
    assert agent.pane_id is not None
    # Another session keeps the server up (its last pane gone, a server with no session quits).
    subprocess.run(
        ["tmux", "-L", lab.socket, "new-session", "-d", "-s", "keep", "sleep", "600"], check=True, timeout=10
    )
    subprocess.run(["tmux", "-L", lab.socket, "kill-pane", "-t", agent.pane_id], check=True, timeout=10)
    assert procs.wait_for_exit(entry.process, 20)  # type: ignore[arg-type]
    after = wait_for(
        "its end recorded", lambda: e if (e := lab.store.find(agent.key)) and e.exit is not None else None
    )
    assert after.status is not Status.RESUMABLE and after.reason != "tmux_lost", (after.status, after.reason)
