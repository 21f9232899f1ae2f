"""Workspaces (issue 22): ``pi-matrix workspace TEMPLATE --name SESSION`` and the pi tool's
``workspace_plan`` / ``launch_workspace``. A template's agents run interactively as the tiled panes
of one window of a fresh tmux session; each pane's command is the agent's host (the matrix sees
and stops them), one job records them, and nothing watches them: no watcher, no deadline, no
marker. An existing session, an unknown template or a bad name is refused with nothing launched
and nothing written. Each test was seen to fail before the change."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from labs import Lab
from model_script import last_tool_result, tool
from pilabs import MLab, run_print_master
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.testing.fake_model import Reply

STOP = "yes-tmux-stop"


def _cli(at: Lab, *words: str, task: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    tail = ("--", *task) if task else ()
    return at.cli(*words, *tail)


def _workspace(at: Lab, *words: str, task: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    assert at.master is not None
    parent = ("--parent-pid", str(at.master.pid), "--parent-session", at.master.identity.session_id)
    return _cli(at, "workspace", *words, "--socket", at.socket, *parent, task=task)


def _tmux(at: Lab, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["tmux", "-L", at.socket, *words], capture_output=True, text=True, timeout=10, check=False
    )


def _panes(at: Lab, session: str) -> list[dict[str, str]]:
    fmt = "#{window_id}\t#{pane_id}\t#{pane_pid}\t#{pane_pipe}\t#{@pi_matrix_key}\t#{@pi_matrix_agent}"
    done = _tmux(at, "list-panes", "-s", "-t", f"={session}", "-F", fmt)
    if done.returncode != 0:
        return []
    keys = ("window", "pane", "pid", "pipe", "key", "agent")
    return [dict(zip(keys, line.split("\t"), strict=True)) for line in done.stdout.splitlines()]


def _prompts(session_file: str) -> list[str]:
    with open(session_file, encoding="utf-8") as lines:
        rows = [json.loads(line) for line in lines if line.strip()]
    return [str(r.get("content")) for r in rows if r.get("type") == "message" and r.get("role") == "user"]


def _track(at: Lab) -> None:
    for job in JobStore(at.store).list_jobs()[0]:
        at.started.extend(a.host for a in job.agents if a.host is not None)


def test_a_dry_run_shows_each_pane_its_argv_and_cwd_and_writes_and_starts_nothing(lab: Lab) -> None:
    lab.start_master()
    done = _workspace(lab, "stand-in-pair", "--name", "ws-plan", "--dry-run", "--json")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["dryRun"] is True and plan["workspace"] == "ws-plan" and plan["watched"] is False
    assert plan["attach"] == f"tmux -L {lab.socket} attach -t ws-plan"
    assert [a["pane"] for a in plan["agents"]] == ["open", "split"]
    for agent in plan["agents"]:
        assert agent["cwd"] == str(lab.work)
        argv = agent["argv"]
        assert "host" in argv and "--mode=interactive" in argv
        # No task: the agent starts idle (no prompt word after its flags), and is never asked for
        # a marker, in its argv or its env.
        assert not any("You are stand-in" in word for word in argv)
        assert not any("DONE" in word for word in argv)
        assert "PI_MATRIX_DONE_MARKER" not in agent["env"]
    assert JobStore(lab.store).list_jobs() == ([], [])
    assert _tmux(lab, "has-session", "-t", "=ws-plan").returncode != 0
    text = _workspace(lab, "stand-in-pair", "--name", "ws-plan", "--dry-run", task=("look around",))
    assert text.returncode == 0, text.stderr
    assert "would open 2 pane(s)" in text.stdout and "argv" in text.stdout and "cwd" in text.stdout
    assert JobStore(lab.store).list_jobs() == ([], [])


def test_a_workspace_is_one_window_of_tiled_panes_whose_hosts_run_the_templates_agents_idle_and_unwatched(
    lab: Lab,
) -> None:
    lab.start_master()
    done = _workspace(lab, "stand-in-pair", "--name", "ws-1", "--json")
    _track(lab)
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    (job,) = JobStore(lab.store).list_jobs()[0]
    assert job.id == shown["jobId"] and job.watched is False and job.team == "stand-in-pair"
    panes = _panes(lab, "ws-1")
    assert len(panes) == 2 and len({p["window"] for p in panes}) == 1
    # Each pane's process is its agent's host, tagged, and nothing pipes its output to a watcher.
    assert {int(p["pid"]) for p in panes} == {a.host_pid for a in job.agents}
    assert {p["key"] for p in panes} == {a.key for a in job.agents}
    assert all(p["pipe"] == "0" for p in panes)
    # Each pane's border names its agent.
    assert {p["agent"] for p in panes} == {a.agent_id for a in job.agents}
    border = _tmux(lab, "show-options", "-w", "-t", "=ws-1:", "pane-border-status").stdout
    assert border.strip() == "pane-border-status top"
    # The first pane's -e items never stay in the session's environment for the panes after it.
    session_env = _tmux(lab, "show-environment", "-t", "=ws-1").stdout
    assert "PI_ORCHESTRATION_AGENT_ID" not in session_env and "PI_MATRIX_PROFILE" not in session_env
    for agent in job.agents:
        entry = lab.worker(agent.key)  # registered and running: ls/tree/top see it
        assert entry.status is Status.RUNNING and entry.identity.mode is not None
        assert entry.identity.mode.value == "interactive" and agent.deadline_at == 0
    time.sleep(1.0)
    for agent in job.agents:
        assert _prompts(agent.session_file or "") == []  # idle: no first prompt
    assert not any(JobStore(lab.store).results_of(job).values())
    listed = _cli(lab, "ls", "--json")
    assert listed.returncode == 0 and all(a.key in listed.stdout for a in job.agents)
    # A follow-up reaches them as written: no marker round, no watcher.
    follow = _cli(lab, "followup", job.id, task=("HANG now this",))
    assert follow.returncode == 0, follow.stderr
    first = job.agents[0]
    wait_for("the follow-up", lambda: _prompts(first.session_file or ""))
    (prompt,) = _prompts(first.session_file or "")
    assert prompt == "HANG now this"
    assert all(p["pipe"] == "0" for p in _panes(lab, "ws-1"))
    assert JobStore(lab.store).get(job.id).agents[0].round == 1
    # stop-session stops them through their hosts; the session goes with its panes.
    stop = _cli(lab, "stop-session", "ws-1", "--socket", lab.socket, "--confirm", STOP)
    assert stop.returncode == 0, stop.stderr
    assert all(procs.wait_for_exit(a.host, 20) for a in job.agents if a.host is not None)


def test_a_workspace_task_is_each_agents_first_prompt_without_a_marker_and_no_result_is_written(
    lab: Lab,
) -> None:
    lab.start_master()
    done = _workspace(lab, "stand-in-pair", "--name", "ws-task", "--json", task=("review", "the", "README"))
    _track(lab)
    assert done.returncode == 0, done.stderr
    (job,) = JobStore(lab.store).list_jobs()[0]
    for agent, who in zip(job.agents, ("a", "b"), strict=True):
        prompts = wait_for("the first prompt", lambda a=agent: _prompts(a.session_file or ""))
        assert prompts[0].startswith(f"You are stand-in {who}.\n\nreview the README")
        assert "DONE" not in prompts[0] and "marker" not in prompts[0]
    time.sleep(1.5)  # the stand-ins' turns are over: nobody watched, so no result exists
    assert not any(JobStore(lab.store).results_of(job).values())
    assert all(procs.is_alive(a.host) for a in job.agents)  # interactive: they stay
    view = _cli(lab, "job", job.id, "--json")
    assert view.returncode == 0 and json.loads(view.stdout)["watched"] is False


def test_an_existing_session_an_unknown_template_and_a_bad_name_are_refused_with_nothing_written(
    lab: Lab,
) -> None:
    lab.start_master()
    assert _tmux(lab, "new-session", "-d", "-s", "busy", "sleep", "600").returncode == 0
    taken = _workspace(lab, "stand-in-pair", "--name", "busy")
    assert taken.returncode == 2, taken.stdout + taken.stderr
    assert "--name: tmux session 'busy' already exists" in taken.stderr
    assert "pick another name" in taken.stderr and "stop-session busy" in taken.stderr
    assert len(_panes(lab, "busy")) == 1  # nothing launched into it
    unknown = _workspace(lab, "no-such-team", "--name", "ws-x")
    assert unknown.returncode == 3 and "no team named 'no-such-team'" in unknown.stderr
    for words, named in (
        (("--name", "no.dots"), "--name: 'no.dots' is not a tmux session name"),
        ((), "--name: missing"),
        (("--name", "ws-y", "--force"), "--force: given without --launch-key"),
    ):
        bad = _workspace(lab, "stand-in-pair", *words)
        assert bad.returncode == 2 and named in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    bad_template = _workspace(lab, "bad/name", "--name", "ws-z")
    assert bad_template.returncode == 2 and "TEMPLATE" in bad_template.stderr
    assert JobStore(lab.store).list_jobs() == ([], [])
    assert not lab.store.list().entries or all(e.role.value == "master" for e in lab.store.list().entries)
    sessions = _tmux(lab, "list-sessions", "-F", "#{session_name}").stdout.split()
    assert sessions == ["busy"]


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_pi_tool_plans_and_launches_a_workspace_and_refuses_a_taken_session_by_name(
    mlab: MLab,
) -> None:
    at, llm, script = mlab
    script.steps = [
        tool(action="workspace_plan", teamTemplate="stand-in-pair", workspaceName="tool-ws"),
        tool(action="launch_workspace", teamTemplate="stand-in-pair", workspaceName="tool-ws",
             task="HANG look around", launchKey="ws-key-1"),
        tool(action="launch_workspace", team="stand-in-pair", sessionName="tool-ws"),
        tool(action="launch_workspace", workspaceName="tool-ws-2"),
        tool(action="workspace_plan", teamTemplate="no-such-team", workspaceName="tool-ws-3"),
        tool(action="launch_workspace", teamTemplate="stand-in-pair", workspaceName="no.dots"),
        lambda _r: Reply(text="done"),
    ]  # fmt: skip
    done = run_print_master(at, "Open a workspace.")
    _track(at)
    assert done.returncode == 0, done.stdout + done.stderr
    planned, launched, taken, missing, unknown, bad = (last_tool_result(r) for r in llm.requests[1:7])
    plan = json.loads(planned)
    assert plan["dryRun"] is True and [a["pane"] for a in plan["agents"]] == ["open", "split"]
    assert json.loads(launched)["jobId"] == "ws-key-1"
    assert "workspaceName: tmux session 'tool-ws' already exists" in taken and "--name" not in taken
    assert 'stop_session with sessionName "tool-ws" and confirm "yes-tmux-stop"' in taken
    assert "teamTemplate" in missing
    assert "no team named 'no-such-team'" in unknown
    assert "workspaceName" in bad and "not a tmux session name" in bad and "A-Z a-z 0-9 _ -" in bad
    (job,) = JobStore(at.store).list_jobs()[0]
    assert job.id == "ws-key-1" and job.watched is False
    panes = _panes(at, "tool-ws")
    assert {int(p["pid"]) for p in panes} == {a.host_pid for a in job.agents}
    for agent in job.agents:
        prompts = wait_for("the first prompt", lambda a=agent: _prompts(a.session_file or ""))
        assert "HANG look around" in prompts[0] and "DONE" not in prompts[0]
    assert _tmux(at, "has-session", "-t", "=tool-ws-2").returncode != 0
    assert _tmux(at, "has-session", "-t", "=tool-ws-3").returncode != 0


def _user_text(request: dict[str, object]) -> str:
    messages = request.get("messages") or []
    assert isinstance(messages, list)
    parts = []
    for message in messages:
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                parts += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
            else:
                parts.append(str(content))
    return "\n".join(parts)


@pytest.mark.real_pi
@pytest.mark.any_pi  # prompts into an idle interactive pi: test_handoffs
def test_real_pi_agents_start_idle_without_a_task_and_take_the_task_as_their_first_prompt_with_one(
    mlab: MLab,
) -> None:
    at, llm, _script = mlab
    at.start_master()
    idle = _workspace(at, "impl-review", "--name", "pi-idle", "--json")
    _track(at)
    assert idle.returncode == 0, idle.stderr
    (job,) = JobStore(at.store).list_jobs()[0]
    for agent in job.agents:
        entry = at.worker(agent.key)  # pi itself started under its host, interactive
        assert entry.child_pid is not None and entry.identity.mode is not None
        assert entry.identity.mode.value == "interactive"
    time.sleep(3.0)
    assert llm.requests == []  # no first prompt: pi waits in its pane
    assert all(procs.is_alive(a.host) for a in job.agents)
    stop = _cli(at, "stop-session", "pi-idle", "--socket", at.socket, "--confirm", STOP)
    assert stop.returncode == 0, stop.stderr
    tasked = _workspace(at, "impl-review", "--name", "pi-task", "--json", task=("say", "hi"))
    _track(at)
    assert tasked.returncode == 0, tasked.stderr
    job = JobStore(at.store).get(json.loads(tasked.stdout)["jobId"])
    wait_for("both first prompts", lambda: len(llm.requests) >= 2, timeout=60)
    firsts = sorted(_user_text(r) for r in llm.requests[:2])
    assert firsts[0].startswith("Implement the task below.\n\nsay hi")
    assert firsts[1].startswith("Review the implementation of the task below")
    assert all("DONE" not in text and "marker" not in text for text in firsts)
    time.sleep(1.0)
    assert all(procs.is_alive(a.host) for a in job.agents)  # interactive: their turn ended, they stay
    assert not any(JobStore(at.store).results_of(job).values())
