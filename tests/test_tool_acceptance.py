"""Issue 22's acceptance through the real pi tool (the fake LLM calls tmux_agent_manager; the
request log, the job records, the hosts and the tmux panes are the evidence): stop_session with and
without confirm, fire_task's force and workspaceName, dismiss and list_profiles, and tool errors that
name the tool's parameters (never the CLI's flags). The error-naming tests were seen to fail before
master.ts mapped the CLI's words to the tool's (toolwords.ts), and the bad stop_job/stop_session
names before a stop's preview was told from its other exit-2 errors (an empty "PREVIEW ONLY")."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from labs import Lab
from model_script import last_tool_result, tool
from pilabs import MLab, run_print_master
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.matrix.layout import pipe_name
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.testing.fake_model import Reply

STOP = "yes-tmux-stop"
Step = Callable[[str], Reply]


def _then(seen: dict[str, Any], name: str, observe: Callable[[], Any], step: Step) -> Step:
    """``step``, after recording what ``observe`` sees at that moment (between two tool calls) as
    ``seen[name]``; a failure is recorded, not raised in the fake LLM's thread."""

    def run(previous: str) -> Reply:
        try:
            seen[name] = observe()
        except Exception as exc:  # noqa: BLE001 - reported by the test's own asserts
            seen[name] = f"observe failed: {exc!r}"
        return step(previous)

    return run


def _track(at: Lab) -> None:
    for job in JobStore(at.store).list_jobs()[0]:
        at.started.extend(a.host for a in job.agents if a.host is not None)


def _workers(at: Lab) -> set[str]:
    return {e.key for e in at.store.list().entries if e.key.startswith("worker-")}


def _tmux(at: Lab, *words: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["tmux", "-L", at.socket, *words], capture_output=True, text=True, timeout=10, check=False
    )


def _pane_pids(at: Lab, session: str) -> set[int]:
    done = _tmux(at, "list-panes", "-s", "-t", f"={session}", "-F", "#{pane_pid} #{pane_dead}")
    return {int(pid) for pid, dead in (line.split() for line in done.stdout.splitlines()) if dead == "0"}


def _archived(at: Lab) -> list[dict[str, Any]]:
    folder = at.state / "archived-jobs"
    return [json.loads(p.read_text()) for p in sorted(folder.iterdir())] if folder.is_dir() else []


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_pi_tool_previews_stop_session_without_confirm_and_stops_that_sessions_jobs_with_it(
    mlab: MLab,
) -> None:
    at, llm, script = mlab
    seen: dict[str, Any] = {}
    jobs = JobStore(at.store)

    def state() -> dict[str, Any]:
        _track(at)
        return {
            j.id: (j.stopped_at, [procs.is_alive(a.host) for a in j.agents if a.host is not None])
            for j in jobs.list_jobs()[0]
        }

    def stopped() -> dict[str, Any]:
        hosts = [a.host for a in jobs.get("ss-a").agents if a.host is not None]
        return {"exited": all(procs.wait_for_exit(h, 20) for h in hosts), **state()}

    fire = {"action": "fire_task", "profile": "stand-in"}
    script.steps = [
        tool(**fire, task="HANG review a", launchKey="ss-a", workspaceName="rev-a"),
        tool(**fire, task="HANG review b", launchKey="ss-b", workspaceName="rev-b"),
        _then(seen, "fired", lambda: (state(), _tmux(at, "has-session", "-t", "=rev-a").returncode),
              tool(action="stop_session", sessionName="rev-a")),
        _then(seen, "previewed", state, tool(action="stop_session", sessionName="rev-a", confirm=STOP)),
        _then(seen, "stopped", stopped, lambda _r: Reply(text="done")),
    ]  # fmt: skip
    done = run_print_master(at, "Stop the review session.")
    _track(at)
    assert done.returncode == 0, done.stdout + done.stderr
    fired, _b, preview, confirmed = (last_tool_result(r) for r in llm.requests[1:5])
    # fire_task's workspaceName: the agent's pane is in that fresh tmux session.
    assert json.loads(fired)["agents"][0]["target"].startswith("rev-a:")
    fired_state, has_session = seen["fired"]
    assert has_session == 0 and fired_state["ss-a"] == (None, [True])
    # Without confirm: a preview naming the job and how to confirm; nothing stopped.
    assert "PREVIEW ONLY, nothing was stopped" in preview and "ss-a" in preview and "ss-b" not in preview
    assert f'confirm: "{STOP}"' in preview
    assert seen["previewed"] == {"ss-a": (None, [True]), "ss-b": (None, [True])}
    # With it: every job of that session stopped through its host, and only those.
    stopped_them = {"session": "rev-a", "socket": at.socket, "stopped": ["ss-a"], "failed": []}
    assert json.loads(confirmed) == stopped_them
    after = seen["stopped"]
    assert after["exited"] is True, after
    assert after["ss-a"][0] is not None and after["ss-b"] == (None, [True])


def _fire(at: Lab, *words: str, task: str = "HANG keyed work") -> subprocess.CompletedProcess[str]:
    assert at.master is not None
    parent = ("--parent-pid", str(at.master.pid), "--parent-session", at.master.identity.session_id)
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(at.state), "fire",
         "--profile", "stand-in", "--socket", at.socket, *parent, *words, "--", task],
        capture_output=True, text=True, env=at.env, timeout=60, check=False, cwd=at.work,
    )  # fmt: skip


def test_fire_force_with_a_live_session_of_that_name_is_refused_and_force_never_touches_a_live_pane(
    lab: Lab,
) -> None:
    lab.start_master()
    first = _fire(lab, "--launch-key", "cli-k", "--workspace", "cli-ws", "--json")
    assert first.returncode == 0, first.stderr
    jobs = JobStore(lab.store)
    old = jobs.get("cli-k")
    (host,) = [a.host for a in old.agents if a.host is not None]
    lab.started.append(host)
    panes = _pane_pids(lab, "cli-ws")
    workers = _workers(lab)
    refused = _fire(lab, "--launch-key", "cli-k", "--force", "--workspace", "cli-ws")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "--workspace: tmux session 'cli-ws' already exists" in refused.stderr
    assert "Traceback" not in refused.stderr
    # Nothing archived, nothing launched: the old job is the key's job still.
    assert jobs.get("cli-k") == old and _archived(lab) == [] and _workers(lab) == workers
    # A forced relaunch elsewhere archives the old record and leaves its host and pane running.
    forced = _fire(lab, "--launch-key", "cli-k", "--force", "--json", task="HANG second")
    assert forced.returncode == 0, forced.stderr
    new = jobs.get("cli-k")
    lab.started.extend(a.host for a in new.agents if a.host is not None)
    assert new.created_at != old.created_at and [j["createdAt"] for j in _archived(lab)] == [old.created_at]
    assert {a.key for a in new.agents}.isdisjoint(a.key for a in old.agents)
    assert procs.is_alive(host) and _pane_pids(lab, "cli-ws") == panes == {host.pid}
    (agent,) = old.agents
    assert lab.store.get(agent.key).status is Status.RUNNING
    # The two hosts share the job id and the agent id; each reads its own pane from its own FIFO,
    # and the old one's end leaves the new one's in place (a shared name let each remove the
    # other's, and a pane pipe opening it then waited for good).
    (new_host,) = [a.host for a in new.agents if a.host is not None]
    fifos = {h.pid: lab.state / "pipes" / pipe_name(old.id, agent.agent_id, h.pid) for h in (host, new_host)}
    wait_for("a FIFO for each host", lambda: all(map(_is_fifo, fifos.values())), timeout=10)
    procs.send_signal(host, signal.SIGTERM)
    assert procs.wait_for_exit(host, 30)
    left = sorted(os.listdir(lab.state / "pipes"))
    assert not os.path.lexists(fifos[host.pid]) and _is_fifo(fifos[new_host.pid]), left


def _is_fifo(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_pi_tool_refuses_force_on_a_live_session_and_a_key_without_force_and_force_spares_the_old_pane(
    mlab: MLab,
) -> None:
    at, llm, script = mlab
    seen: dict[str, Any] = {}
    jobs = JobStore(at.store)

    def snapshot() -> dict[str, Any]:
        _track(at)
        job = jobs.get("fk-1")
        panes = _pane_pids(at, "force-ws")
        return {"job": job, "workers": _workers(at), "panes": panes, "archived": _archived(at)}

    def relaunched() -> dict[str, Any]:
        found = snapshot()
        found["hosts"] = [procs.is_alive(a.host) for a in seen["fired"]["job"].agents if a.host is not None]
        return found

    fire = {"action": "fire_task", "profile": "stand-in", "launchKey": "fk-1"}
    script.steps = [
        tool(**fire, task="HANG first", workspaceName="force-ws"),
        _then(seen, "fired", snapshot,
              tool(**fire, task="HANG second", force=True, workspaceName="force-ws")),
        _then(seen, "refused", snapshot, tool(**fire, task="HANG second")),
        _then(seen, "duplicate", snapshot, tool(**fire, task="HANG second", force=True)),
        _then(seen, "forced", relaunched, lambda _r: Reply(text="done")),
    ]  # fmt: skip
    done = run_print_master(at, "Relaunch keyed work.")
    _track(at)
    assert done.returncode == 0, done.stdout + done.stderr
    _fired, live, duplicate, forced = (last_tool_result(r) for r in llm.requests[1:5])
    before = seen["fired"]
    (old_host,) = [a.host for a in before["job"].agents if a.host is not None]
    at.started.append(old_host)
    assert before["panes"] == {old_host.pid}
    # force with a live tmux session of that name: refused by the tool's names; nothing archived,
    # nothing launched.
    assert "workspaceName: tmux session 'force-ws' already exists" in live
    assert f'stop_session with sessionName "force-ws" and confirm "{STOP}"' in live
    assert "--workspace" not in live and "pi-matrix stop-session" not in live
    for name in ("refused", "duplicate"):
        assert seen[name] == before, name
    # The same key without force: refused naming launchKey and force.
    assert "launchKey: job fk-1 already exists" in duplicate and "force: true" in duplicate
    assert "--launch-key" not in duplicate and "--force" not in duplicate
    # force: the old record archived, the old host and its pane left running.
    assert json.loads(forced)["jobId"] == "fk-1"
    after = seen["forced"]
    assert after["job"].created_at != before["job"].created_at
    assert [j["createdAt"] for j in after["archived"]] == [before["job"].created_at]
    assert after["hosts"] == [True] and after["panes"] == before["panes"]
    assert before["workers"] < after["workers"]


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_pi_tool_lists_profiles_and_dismisses_a_finished_job_but_not_a_working_one(
    mlab: MLab,
) -> None:
    at, llm, script = mlab
    seen: dict[str, Any] = {}
    jobs = JobStore(at.store)

    def finished() -> bool:
        _track(at)
        (agent,) = jobs.get("dm-1").agents
        return bool(wait_for("dm-1's result", lambda: jobs.result("dm-1", agent.agent_id, 1)))

    def dismissed() -> dict[str, Any]:
        hosts = [a.host for a in jobs.get("dm-1").agents if a.host is not None]
        return {
            "dm-1": jobs.get("dm-1").dismissed_at, "busy": jobs.get("dm-busy").dismissed_at,
            "exited": all(procs.wait_for_exit(h, 20) for h in hosts),
            "busy alive": [procs.is_alive(a.host) for a in jobs.get("dm-busy").agents if a.host is not None],
        }  # fmt: skip

    script.steps = [
        tool(action="list_profiles"),
        tool(action="fire_task", profile="stand-in", task="quick one", launchKey="dm-1"),
        tool(action="fire_task", profile="stand-in", task="HANG busy", launchKey="dm-busy"),
        _then(seen, "finished", finished, tool(action="dismiss", jobId="dm-busy")),
        tool(action="dismiss", job_id="dm-1"),
        _then(seen, "dismissed", dismissed, lambda _r: Reply(text="done")),
    ]  # fmt: skip
    done = run_print_master(at, "Which profiles, then clean up.")
    _track(at)
    assert done.returncode == 0, done.stdout + done.stderr
    listed, _one, _busy, refused, gone = (last_tool_result(r) for r in llm.requests[1:6])
    profiles = {p["name"]: p["source"] for p in json.loads(listed)["profiles"]}
    assert profiles["standin-print"] == str(at.agent_dir / "launch_profiles" / "standin-print.toml")
    assert {"stand-in", "pi-worker", "claude", "agy"} <= profiles.keys()
    assert seen["finished"] is True
    assert "dm-busy still has working agents" in refused
    assert f'stop_job with jobId "dm-busy" and confirm "{STOP}"' in refused
    assert json.loads(gone)["state"] == "dismissed"
    after = seen["dismissed"]
    assert after["dm-1"] is not None and after["exited"] is True, after
    assert after["busy"] is None and after["busy alive"] == [True]


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_pi_tools_errors_name_its_parameters_and_nothing_is_launched_or_written(
    mlab: MLab,
) -> None:
    at, llm, script = mlab
    fire = {"action": "fire_task", "profile": "stand-in", "task": "HANG named"}
    script.steps = [
        tool(**fire, launchKey="ab"),
        tool(**fire, force=True),
        tool(**fire, workspaceName="no.dots"),
        tool(**fire, launchKey="named-1"),
        tool(action="set_variable", jobId="named-1", name="bad name!", value="x"),
        tool(action="set_variable", jobId="named-1", variableName="ok", variableValue="x" * 20000),
        tool(action="stop_session", sessionName="bad.name"),
        tool(action="show_template", templateName="no/such"),
        tool(action="stop_job", jobId="bad/id"),
        lambda _r: Reply(text="done"),
    ]  # fmt: skip
    done = run_print_master(at, "Try bad parameters.")
    _track(at)
    assert done.returncode == 0, done.stdout + done.stderr
    short, unkeyed, dotted, _fired, bad_name, big, session, template, job = (
        last_tool_result(r) for r in llm.requests[1:10]
    )
    assert "launchKey: 'ab' is not a launch key" in short
    assert "force: given without launchKey" in unkeyed
    assert "workspaceName: 'no.dots' is not a tmux session name" in dotted
    assert "name: 'bad name!' is not a variable name" in bad_name
    assert "value: over 16 KiB" in big
    assert "sessionName: 'bad.name' is not a tmux session name" in session
    assert "templateName: 'no/such'" in template
    assert "jobId: 'bad/id' is not a job id" in job and "list_jobs" in job  # not an empty preview
    for shown in (short, unkeyed, dotted, bad_name, big, session, template, job):
        assert "pi-matrix: error:" in shown and " --" not in shown and "NAME" not in shown, shown
    assert [j.id for j in JobStore(at.store).list_jobs()[0]] == ["named-1"]
    assert len(_workers(at)) == 1
    assert not (at.state / "variables" / "named-1.json").exists()
