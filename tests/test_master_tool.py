"""The master's own pi drives the dispatcher (issue 8): the bridge's tmux_agent_manager tool, and
terminal handoffs injected into the master's session. Real pi against the fake LLM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from model_script import last_tool_result, tool
from pilabs import MLab, PiLab, capture, job_of, master_window, run_print_master
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.testing.fake_model import Reply

pytestmark = pytest.mark.real_pi  # real pi: .ci/run's oldest-pi pass runs this file too

HOSTILE = """Say hi $(touch /tmp/pwned) ; rm -rf "q" | cat & > `x` 'y' \\ done"""


def test_the_model_fires_a_worker_lists_it_and_the_task_arrives_verbatim(
    mlab: MLab,
) -> None:
    lab, llm, script = mlab
    script.steps = [
        tool(action="fire_task", profile="stand-in", task=HOSTILE),
        tool(action="list_jobs"),
        lambda _r: Reply(text="Launched."),
    ]
    done = run_print_master(lab, "Launch one worker.")
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(llm.requests) == 3
    fired, listed = last_tool_result(llm.requests[1]), last_tool_result(llm.requests[2])
    job_id = job_of(fired)
    assert job_of(listed) == job_id  # list_jobs in the next call lists it
    job = JobStore(lab.store).get(job_id)
    assert job.task == HOSTILE  # through the tool, the CLI argv and the job record, unchanged
    (agent,) = job.agents
    worker = wait_for("the worker", lambda: lab.store.find(agent.key))
    master = lab.store.get("master-boss")
    assert worker.parent_pid == master.pid and worker.parent_session_id == "boss"
    session = wait_for("the worker's session file", lambda: Path(agent.session_file or "").exists())
    assert session
    first = json.loads(Path(agent.session_file or "").read_text().splitlines()[1])
    assert first["content"].startswith(HOSTILE)  # the worker's first prompt, verbatim
    assert not Path("/tmp/pwned").exists()


@pytest.mark.any_pi
def test_stop_job_previews_without_the_word_and_stops_with_it(mlab: MLab) -> None:
    lab, llm, script = mlab
    script.steps = [
        tool(action="fire_task", profile="stand-in", task="HANG until stopped"),
        lambda r: Reply(tool="tmux_agent_manager", arguments={"action": "stop_job", "job_id": job_of(r)}),
        lambda r: Reply(
            tool="tmux_agent_manager",
            arguments={"action": "job_status", "job_id": job_of(last_tool_result(llm.requests[1]))},
        ),
        lambda r: Reply(
            tool="tmux_agent_manager",
            arguments={
                "action": "stop_job",
                "job_id": job_of(last_tool_result(llm.requests[1])),
                "confirm": "yes-tmux-stop",
            },
        ),
        lambda _r: Reply(text="Stopped."),
    ]
    done = run_print_master(lab, "Launch and stop.")
    assert done.returncode == 0, done.stdout + done.stderr
    preview = last_tool_result(llm.requests[2])
    assert "PREVIEW ONLY, nothing was stopped" in preview and "yes-tmux-stop" in preview
    status_after_preview = last_tool_result(llm.requests[3])
    assert '"running"' in status_after_preview or "running" in status_after_preview
    job = JobStore(lab.store).get(job_of(last_tool_result(llm.requests[1])))
    (agent,) = job.agents
    stopped = wait_for(
        "the stopped worker",
        lambda: (
            e if (e := lab.store.find(agent.key)) and e.status in (Status.TERMINAL, Status.CLOSED) else None
        ),
        timeout=30,
    )
    assert stopped.exit is not None and not procs.is_alive(stopped.child_process)


def test_an_unknown_action_is_a_tool_error_with_the_fix(mlab: MLab) -> None:
    lab, llm, script = mlab
    script.steps = [
        tool(action="explode"),
        tool(action="job_status", job_id="job-20260101-000000-000000"),
        lambda _r: Reply(text="ok"),
    ]
    done = run_print_master(lab, "Try things.")
    assert done.returncode == 0, done.stdout + done.stderr
    assert 'unknown action "explode"' in last_tool_result(llm.requests[1])
    assert "pi-matrix: error: no job" in last_tool_result(llm.requests[2])


def _stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped (state ``T`` in ``/proc/<pid>/stat``)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def _events(lab: PiLab, key: str) -> str:
    path = lab.state / "events" / f"{key}.jsonl"
    return path.read_text() if path.exists() else f"(no {path})"


def _handoff_lines(session_file: Path) -> list[str]:
    """The handoffs in the master's session: custom messages of the bridge's handoff type."""
    found = []
    for line in session_file.read_text().splitlines():
        record = json.loads(line)
        content = record.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        if record.get("type") == "custom_message" and record.get("customType") == "pi-matrix-handoff":
            found.append(text)
    return found


def test_a_workers_handoff_wakes_the_master_session_once_and_is_replayed_once_after_a_restart(
    mlab: MLab,
) -> None:
    lab, llm, script = mlab
    script.steps = [
        tool(action="fire_task", profile="standin-print", task="Say hello."),
        lambda _r: Reply(text="Waiting for the worker."),
        lambda _r: Reply(text="Noted the handoff."),
    ]

    master_window(lab, "Begin.")
    entry = wait_for(
        "the master's pi", lambda: (e := lab.store.find("master-boss")) and e.child_pid and e, timeout=30
    )
    session_file = Path(entry.identity.session_file or "")
    wait_for(
        "the worker's handoff in the master's session",
        lambda: len(_handoff_lines(session_file)) == 1,
        timeout=60,
    )
    wait_for("the LLM to see it", lambda: len(llm.requests) >= 3, timeout=30)
    assert "[pi-matrix handoff]" in "\n".join(llm.user_texts())
    (worker,) = [e for e in lab.store.list().entries if e.key.startswith("worker-")]
    wait_for(
        "the handoff acknowledged", lambda: lab.store.get(worker.key).status is Status.CLOSED, timeout=30
    )

    # The master's pi freezes; a second worker ends meanwhile: its host offers the handoff, pi never
    # takes it, so it stays undelivered. (pi, not its host: tmux continues a pane process stopped by
    # SIGSTOP at once, and SIGTTOU is discarded in the pane's orphaned process group.)
    master = lab.store.get("master-boss")
    assert master.process is not None and master.child_process is not None
    procs.send_signal(master.child_process, signal.SIGSTOP)
    wait_for("the master's pi frozen", lambda: _stopped(master.child_process.pid))  # type: ignore[union-attr]
    lab.master = master
    second = lab.fire("Say hello again.", profile="standin-print")
    (agent2,) = second.job.agents
    wait_for(
        "the second handoff recorded",
        lambda: lab.store.get(agent2.key).undelivered,
        timeout=60,
        detail=lambda: f"{lab.store.get(agent2.key)}\n" + _events(lab, agent2.key),
    )
    time.sleep(1.0)  # a host that took pi's silence for an acknowledgement would mark it now
    assert lab.store.get(agent2.key).undelivered, "offered is not delivered: pi never took it"
    assert _stopped(master.child_process.pid), "the master's pi stayed frozen"
    for identity in (master.child_process, master.process):  # the master dies before delivering
        procs.send_signal(identity, signal.SIGKILL)
        procs.send_signal(identity, signal.SIGCONT)
        assert procs.wait_for_exit(identity, 10)
    assert _handoff_lines(session_file) == _handoff_lines(session_file)[:1]

    # A new master of the same session replays it once.
    master_window(lab, "--session", str(session_file))
    back = wait_for(
        "the new master",
        lambda: (e := lab.store.find("master-boss")) and e.pid != master.pid and e,
        timeout=30,
    )
    lab.started.extend(i for i in (back.process,) if i is not None)
    wait_for("the replayed handoff", lambda: lab.store.get(agent2.key).status is Status.CLOSED, timeout=60)
    lines = _handoff_lines(session_file)
    assert len(lines) == 2 and agent2.key in lines[1] and worker.key in lines[0]


def test_an_interactive_pi_master_asks_about_a_foreign_orphan_in_its_own_ui(
    mlab: MLab,
) -> None:
    lab, _llm, _script = mlab
    settings = json.loads((lab.agent_dir / "settings.json").read_text())
    settings["processMatrix"]["adoptionGraceMs"] = 120_000  # the orphan waits while we ask
    (lab.agent_dir / "settings.json").write_text(json.dumps(settings))
    other = lab.start_master("other", "goal-9")
    fired = lab.fire("HANG working", profile="stand-in")
    (agent,) = fired.job.agents
    lab.worker(agent.key)
    running = wait_for(
        "the other master's agent", lambda: (e := lab.store.find(other.key)) and e.child_process and e
    )
    for identity in (running.child_process, running.process):  # the foreign master dies
        procs.send_signal(identity, signal.SIGKILL)
    wait_for("the orphan", lambda: lab.store.get(agent.key).status is Status.RESUMABLE, timeout=30)

    master_window(lab)
    shown = wait_for(
        "the question in pi's UI",
        lambda: "pi-matrix: orphan worker" in (text := capture(lab)) and text,
        timeout=60,
        detail=lambda: capture(lab) + json.dumps(scan_of(lab)),
    )
    assert agent.agent_id in shown and "adopt" in shown and "clean up" in shown
    subprocess.run(["tmux", "-L", lab.socket, "send-keys", "-t", "=m:", "Enter"], check=True)  # "adopt"
    adopted = wait_for(
        "the adoption",
        lambda: (
            (e := lab.store.get(agent.key)).parent_session_id == "boss" and e.status is Status.RUNNING and e
        ),
        timeout=30,
    )
    boss = lab.store.get("master-boss")
    assert adopted.parent_pid == boss.pid
    lab.started.extend(i for i in (boss.process, boss.child_process) if i is not None)


def scan_of(lab: PiLab) -> Any:
    argv = [sys.executable, "-m", "pi_tmux_matrix", "scan", "--json"]
    done = subprocess.run(argv, env=lab.env, capture_output=True, text=True, check=False)
    return done.stdout + done.stderr
