"""tmux dying is not the task's end (issue 18.5): agents killed by their tmux server's end are
recorded ``resumable`` (reason ``tmux_lost``), ``jobs`` says ``gone`` (no server) rather than
``unreachable`` (a server that does not answer). Each test was seen to fail before the change."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import kill_tmux_server
from fake_llm import FakeLLM
from test_dispatch import Lab, lab, wait_for  # noqa: F401 - fixtures
from test_real_pi import pilab  # noqa: F401 - a fixture

from pi_tmux_matrix import procs
from pi_tmux_matrix.identity import Role
from pi_tmux_matrix.matrix.model import Status


def test_killing_the_tmux_server_leaves_its_workers_resumable_and_jobs_says_gone(lab: Lab) -> None:  # noqa: F811
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


def test_tmux_kill_server_then_master_relaunch_tmux_brings_both_pi_workers_back_into_their_files(
    pilab: tuple[Lab, FakeLLM],  # noqa: F811
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
