"""The dispatcher with real tmux (private sockets), real hosts, the stand-in agent (issue 4)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from labs import Lab, lose_and_plan_resume, lose_worker
from tmux_support import kill_tmux_server
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.contract import (
    ENV_AGENT_ID,
    ENV_ALLOWED_PATHS,
    ENV_PARENT_PID,
    ENV_PARENT_SESSION,
    ENV_TASK_REF,
)
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.manager import Dispatcher
from pi_tmux_matrix.dispatch.model import ResultKind
from pi_tmux_matrix.dispatch.request import FireRequest
from pi_tmux_matrix.errors import TmuxUnavailable
from pi_tmux_matrix.identity import Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.settings import load_settings


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)


# === firing ======================================================================================
def test_a_fired_agent_carries_the_contract_is_a_worker_of_its_master_and_its_done_marker_gives_one_result(
    lab: Lab,
) -> None:
    master = lab.start_master()
    fired = lab.fire("say hello and finish")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)

    assert entry.role is Role.WORKER
    assert (entry.parent_pid, entry.parent_session_id) == (master.pid, "boss")
    assert entry.pid == agent.host_pid  # the pane's process is the host
    assert entry.identity.agent_id == agent.agent_id and entry.identity.profile == "stand-in"

    env = environ(entry.child_pid or 0)
    assert env[ENV_PARENT_PID] == str(master.pid)
    assert env[ENV_PARENT_SESSION] == "boss"
    assert env[ENV_AGENT_ID] == agent.agent_id
    assert env[ENV_TASK_REF] == "goal-1"  # the firing master's task
    assert json.loads(env[ENV_ALLOWED_PATHS]) == []  # the stand-in profile: full scope

    result = wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id))
    assert result.kind is ResultKind.DONE
    time.sleep(1.0)
    results = sorted(p.name for p in (lab.state / "results").iterdir() if not p.name.startswith("."))
    assert results == [f"{fired.job.id}.{agent.agent_id}.1.json"]  # exactly one

    tree = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(lab.state), "tree", "--json"],
        capture_output=True, text=True, env=lab.env, timeout=30, check=True,
    )  # fmt: skip
    (node,) = json.loads(tree.stdout)["masters"]
    assert [w["key"] for w in node["workers"]] == [agent.key]


def test_a_deadline_writes_timeout_first_then_the_pane_is_gone(lab: Lab) -> None:
    from pi_tmux_matrix.dispatch.tmux import TmuxServer

    lab.start_master()
    fired = lab.fire("HANG forever", deadline_s=2)
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    result = wait_for("the timeout result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=15)
    assert result.kind is ResultKind.TIMEOUT
    wait_for("the host to end", lambda: not procs.is_alive(entry.process), timeout=20)

    def pane_gone() -> bool:
        try:
            return TmuxServer(lab.socket).pane(agent.pane_id or "") is None
        except TmuxUnavailable:
            return True  # its last pane closed, so the private server exited with it

    wait_for("the pane to be gone", pane_gone, timeout=10)
    assert not procs.is_alive(entry.child_process)
    final = lab.store.get(agent.key)
    assert final.exit is not None and final.exit.kind.value == "timed_out"  # the owner's limit, not a kill
    assert result.at <= final.exit.at  # the timeout result first, then the stop


def test_hostile_task_text_arrives_verbatim(lab: Lab) -> None:
    lab.start_master()
    task = "; rm -rf ~ $(id) `id` 'single' \"double\" \\back\nsecond line\ttab"
    fired = lab.fire(task)
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    session_file = entry.identity.session_file
    assert session_file is not None

    def first_prompt() -> str | None:
        try:
            for line in Path(session_file).read_text().splitlines():
                record = json.loads(line)
                if record.get("type") == "message" and record.get("role") == "user":
                    return str(record.get("content"))
        except FileNotFoundError:
            return None
        return None

    prompt = wait_for("the agent's first prompt in its session file", first_prompt)
    assert task in prompt


def test_without_a_master_fire_refuses_and_says_to_run_under_pi_matrix_master(lab: Lab) -> None:
    fire = ["fire", "--profile", "stand-in", "--socket", lab.socket, "--", "x"]
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", *fire],
        capture_output=True, text=True, env=lab.env, cwd=lab.work, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "pi-matrix master" in done.stderr
    assert not (lab.state / "jobs").exists()


def test_the_cap_counts_live_agents_per_cwd(lab: Lab) -> None:
    lab.start_master()
    for i in range(3):
        lab.fire(f"HANG job {i}")
    with pytest.raises(Exception, match="maxConcurrentAgents"):
        lab.fire("HANG one too many")


def test_tmux_unreachable_is_not_death_and_killing_one_host_marks_only_that_agent(lab: Lab) -> None:
    lab.start_master()
    first = lab.fire("HANG one").job.agents[0]
    second = lab.fire("HANG two").job.agents[0]
    e1, e2 = lab.worker(first.key), lab.worker(second.key)

    # The server keeps running (and its panes with it) but nobody can reach it: a flaky socket.
    socket_path = Path(f"/tmp/tmux-{os.getuid()}/{lab.socket}")
    if not socket_path.exists():
        socket_path = Path(os.environ.get("TMUX_TMPDIR", "/tmp")) / f"tmux-{os.getuid()}" / lab.socket
    hidden = socket_path.with_name(socket_path.name + ".hidden")
    socket_path.rename(hidden)
    try:
        views = {v["jobId"]: v for v in lab.dispatcher().reconcile()}
        for view in views.values():
            (agent,) = view["agents"]
            assert agent["tmux"] == "unreachable"
            assert agent["hostAlive"] is True
            assert view["state"] == "running"
        for entry in (e1, e2):
            assert lab.store.get(entry.key).status is Status.RUNNING

        procs.send_signal(e1.process, signal.SIGKILL)  # type: ignore[arg-type]
        wait_for("host 1 gone", lambda: not procs.is_alive(e1.process))
        views = {v["jobId"]: v for v in lab.dispatcher().reconcile()}
        alive = {v["agents"][0]["key"]: v["agents"][0]["hostAlive"] for v in views.values()}
        assert alive == {first.key: False, second.key: True}
        assert lab.store.get(second.key).status is Status.RUNNING
    finally:
        hidden.rename(socket_path)


def test_killing_the_tmux_server_never_marks_a_live_host_dead(lab: Lab) -> None:
    lab.start_master()
    fired = lab.fire("HANG one")
    (agent,) = fired.job.agents
    lab.worker(agent.key)
    kill_tmux_server(lab.socket)
    (view,) = lab.dispatcher().reconcile()
    assert view["agents"][0]["tmux"] in ("unreachable", "gone")
    # The hang-up of the server's ptys really ends the agents; only their hosts record that (with
    # an exit record), once the agent process is gone. Nothing is ever marked from tmux's word.
    for entry in lab.store.list().entries:
        if entry.role is not Role.WORKER:
            continue
        if entry.status in (Status.TERMINAL, Status.CLOSED):
            assert entry.exit is not None
            assert not procs.is_alive(entry.child_process)
        else:
            assert procs.is_alive(entry.process)


# === resume ======================================================================================
def test_resume_of_a_dead_worker_runs_in_the_same_session_file_same_key_new_generation(lab: Lab) -> None:
    master = lab.start_master()
    fired = lab.fire("HANG resumable work")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    session_file = entry.identity.session_file
    assert session_file is not None
    wait_for("the session file", lambda: Path(session_file).exists())

    # The master dies: the worker winds down to resumable; then the worker itself is lost.
    resumable, new_master, dry = lose_and_plan_resume(lab, master, agent.key)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    assert set(plan) >= {"argv", "env", "cwd"}
    agent_argv = plan["argv"][plan["argv"].index("--") + 1 :]
    assert agent_argv[agent_argv.index("--session") + 1] == session_file
    assert plan["env"][ENV_PARENT_PID] == str(new_master.pid)
    assert plan["env"][ENV_AGENT_ID] == agent.agent_id

    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "resume", agent.key, "--json",
         "--parent-pid", str(new_master.pid), "--parent-session", "boss2", "--socket", lab.socket],
        capture_output=True, text=True, env=lab.env, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    pid = json.loads(done.stdout)["hostPid"]
    back = wait_for(
        "the resumed host to register",
        lambda: (
            e if (e := lab.store.find(agent.key)) and e.pid == pid and e.status is Status.RUNNING else None
        ),
    )
    ident = procs.identify(pid)
    if ident is not None:
        lab.started.append(ident)
    assert back.key == agent.key
    assert back.identity.session_file == session_file
    assert back.registration != resumable.registration
    assert back.parent_pid == new_master.pid


def test_a_resume_is_built_by_the_same_door_as_its_fire_bridge_and_envelope_included(lab: Lab) -> None:
    """``resume`` (and every relaunch) composes argv and env through the dispatcher's one launch
    door from the recorded profile: the bridge (``launch_argv``) and the envelope, profile and
    contract (``launch_env``) come back exactly as the fire had them."""
    from pi_tmux_matrix.bridge import bridge_path

    master = lab.start_master()
    fired = lab.fire("HANG resumable work")
    (agent,) = fired.job.agents
    (planned,) = fired.planned
    entry = lab.worker(agent.key)
    _resumable, new_master, dry = lose_and_plan_resume(lab, master, agent.key)
    assert dry.returncode == 0, dry.stderr
    plan = json.loads(dry.stdout)
    fired_agent = list(planned.argv[planned.argv.index("--") + 1 :])
    resumed_agent = plan["argv"][plan["argv"].index("--") + 1 :]
    bridge = ["-e", str(bridge_path())]
    assert any(fired_agent[i : i + 2] == bridge for i in range(len(fired_agent)))
    assert any(resumed_agent[i : i + 2] == bridge for i in range(len(resumed_agent)))
    assert resumed_agent[: resumed_agent.index("--session")] == fired_agent[: fired_agent.index("--session")]
    for name in (ENV_ALLOWED_PATHS, ENV_AGENT_ID, "PI_MATRIX_PROFILE", ENV_TASK_REF):
        assert plan["env"].get(name) == planned.env.get(name), name
    assert plan["env"][ENV_PARENT_PID] == str(new_master.pid)
    assert entry.identity.session_file == resumed_agent[resumed_agent.index("--session") + 1]


# === without tmux ================================================================================
def test_the_subprocess_backend_fires_watches_and_times_out_without_tmux(sublab: Lab) -> None:
    sublab.start_master()
    done = sublab.fire("say hello", backend="subprocess")
    (agent,) = done.job.agents
    assert agent.pane_id is None and agent.log is not None
    result = wait_for("the DONE result", lambda: sublab.result(done.job.id, agent.agent_id))
    assert result.kind is ResultKind.DONE

    hung = sublab.fire("HANG forever", backend="subprocess", deadline_s=2)
    (slow,) = hung.job.agents
    entry = sublab.worker(slow.key)
    result = wait_for("the timeout result", lambda: sublab.result(hung.job.id, slow.agent_id), timeout=15)
    assert result.kind is ResultKind.TIMEOUT
    wait_for("the host to end", lambda: not procs.is_alive(entry.process), timeout=20)

    views = {v["jobId"]: v for v in sublab.dispatcher().reconcile()}
    assert views[done.job.id]["agents"][0]["tmux"] == "n/a"
    assert views[hung.job.id]["agents"][0]["result"]["kind"] == "timeout"


# === jobs: follow-up, stop, dismiss ==============================================================
@pytest.mark.parametrize("backend", ["tmux", "subprocess"])
def test_a_followup_rearms_a_fresh_marker_round_with_one_result_each(lab: Lab, backend: str) -> None:
    lab.start_master()
    fired = lab.fire("first part", backend=backend)
    (agent,) = fired.job.agents
    first = wait_for("round 1", lambda: lab.result(fired.job.id, agent.agent_id, 1))
    assert first.kind is ResultKind.DONE

    job = lab.dispatcher().followup(fired.job.id, "second part")
    (rearmed,) = job.agents
    assert rearmed.round == 2 and rearmed.nonce != agent.nonce
    assert rearmed.profile == agent.profile  # the same authority; only the instructions changed
    second = wait_for("round 2", lambda: lab.result(fired.job.id, agent.agent_id, 2))
    assert second.kind is ResultKind.DONE
    assert lab.result(fired.job.id, agent.agent_id, 1) == first  # never rewritten


def test_stop_previews_without_the_word_and_stops_with_it(lab: Lab) -> None:
    lab.start_master()
    fired = lab.fire("HANG until stopped")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    base = [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(lab.state), "stop", fired.job.id]
    preview = subprocess.run(base, capture_output=True, text=True, env=lab.env, timeout=30, check=False)
    assert preview.returncode == 2
    assert "yes-tmux-stop" in preview.stderr and agent.agent_id in preview.stdout
    assert procs.is_alive(entry.process)
    assert lab.result(fired.job.id, agent.agent_id) is None

    done = subprocess.run(
        [*base, "--confirm", "yes-tmux-stop"],
        capture_output=True,
        text=True,
        env=lab.env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert lab.result(fired.job.id, agent.agent_id).kind is ResultKind.STOPPED
    assert not procs.is_alive(entry.process) and not procs.is_alive(entry.child_process)
    final = lab.store.get(agent.key)
    assert final.exit is not None and final.exit.kind.value == "killed"


def test_dismiss_refuses_a_working_job_and_stops_a_finished_ones_idle_agents(lab: Lab) -> None:
    lab.start_master()
    busy = lab.fire("HANG busy")
    with pytest.raises(Exception, match="still has working agents"):
        lab.dispatcher().dismiss(busy.job.id)
    fired = lab.fire("quick one")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    wait_for("the result", lambda: lab.result(fired.job.id, agent.agent_id))
    assert procs.is_alive(entry.process)  # an interactive agent waits for more work
    lab.dispatcher().dismiss(fired.job.id)
    wait_for("the idle agent stopped", lambda: not procs.is_alive(entry.process))
    views = {v["jobId"]: v["state"] for v in lab.dispatcher().reconcile()}
    assert views[fired.job.id] == "dismissed"


# === lanes =======================================================================================
def test_a_lane_runs_in_its_worktree_and_a_live_lane_is_not_fired_twice(lab: Lab) -> None:
    git = ["git", "-C", str(lab.work), "-c", "user.name=t", "-c", "user.email=t@localhost"]
    subprocess.run([*git, "init", "-q"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "init"], check=True, timeout=30)
    lab.start_master()
    fired = lab.fire("HANG on a lane", lane="lane-1")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    worktree = os.path.realpath(lab.work / ".worktrees" / "lane-1")
    assert entry.identity.worktree == worktree and entry.identity.lane == "lane-1"
    assert os.path.realpath(f"/proc/{entry.child_pid}/cwd") == worktree
    assert environ(entry.child_pid or 0)["PI_WORKTREE_LANE"] == "lane-1"
    with pytest.raises(Exception, match="bound to live agent"):
        lab.fire("HANG again", lane="lane-1")


# === plugins and the off switch ==================================================================
def test_a_plugin_adds_env_and_two_plugins_disagreeing_fail_the_launch(sublab: Lab) -> None:
    from pi_tmux_matrix.dispatch.hookspecs import hookimpl
    from pi_tmux_matrix.dispatch.plugins import plugin_manager

    class Adds:
        @hookimpl
        def launch_env(self, launch: Any) -> dict[str, str]:
            return {"TEAM_COLOUR": "teal", "AGENT_OF": launch.agent_id}

    class Disagrees:
        @hookimpl
        def launch_env(self, launch: Any) -> dict[str, str]:
            return {"TEAM_COLOUR": "red"}

    sublab.start_master()
    pm = plugin_manager(entry_points=False)
    pm.register(Adds(), name="adds")
    dispatcher = Dispatcher(sublab.store, load_settings(sublab.work, sublab.env), env=sublab.env, plugins=pm)
    assert sublab.master is not None
    request = FireRequest(
        task="HANG plugin", profile="stand-in", path=str(sublab.work), backend="subprocess",
        parent_pid=sublab.master.pid, parent_session="boss", dry_run=True,
    )  # fmt: skip
    (planned,) = dispatcher.fire(request).planned
    assert planned.env["TEAM_COLOUR"] == "teal" and planned.env["AGENT_OF"] == planned.launch.agent_id
    assert planned.env[ENV_PARENT_PID] == str(sublab.master.pid)  # the matrix plugin still there
    pm.register(Disagrees(), name="disagrees")
    with pytest.raises(Exception, match=r"'adds' and 'disagrees'|'disagrees' and 'adds'"):
        dispatcher.fire(request)


def test_hooks_go_through_pluggy_so_a_wrapper_plugin_wraps_launch_env_and_on_launched(
    sublab: Lab, caplog: pytest.LogCaptureFixture
) -> None:
    """A ``wrapper=True`` hookimpl (pluggy allows it) wraps the call instead of being called as a
    plain function; a failing notification names its plugin and never undoes the launch."""
    from pi_tmux_matrix.dispatch.hookspecs import hookimpl
    from pi_tmux_matrix.dispatch.plugins import plugin_manager

    seen: list[str] = []

    class Wraps:
        @hookimpl(wrapper=True)
        def launch_env(self, launch: Any) -> Any:
            results = yield
            seen.append(f"launch_env:{len(results)}")
            return [*results, {"WRAPPED_BY": "wraps"}]

        @hookimpl(wrapper=True)
        def on_launched(self, job: Any, launch: Any, pane: Any) -> Any:
            seen.append("wrapper:before")
            try:
                return (yield)
            finally:
                seen.append("wrapper:after")

    class Breaks:
        @hookimpl
        def on_launched(self, job: Any, launch: Any, pane: Any) -> None:
            raise RuntimeError("boom")

    class Hears:
        @hookimpl
        def on_launched(self, job: Any, launch: Any, pane: Any) -> None:
            seen.append("hears")

    sublab.start_master()
    pm = plugin_manager(entry_points=False)
    pm.register(Wraps(), name="wraps")
    pm.register(Hears(), name="hears")
    pm.register(Breaks(), name="breaks")
    dispatcher = Dispatcher(sublab.store, load_settings(sublab.work, sublab.env), env=sublab.env, plugins=pm)
    assert sublab.master is not None
    request = FireRequest(
        task="HANG wrapped", profile="stand-in", path=str(sublab.work), backend="subprocess",
        parent_pid=sublab.master.pid, parent_session="boss",
    )  # fmt: skip
    fired = dispatcher.fire(request)
    (agent,) = fired.job.agents
    assert agent.host is not None
    sublab.started.append(agent.host)
    (planned,) = fired.planned
    assert planned.env["WRAPPED_BY"] == "wraps"
    assert planned.env[ENV_PARENT_PID] == str(sublab.master.pid)  # the matrix plugin, wrapped
    # Each notified plugin alone, wrapped; the one that raised kept no one else from hearing.
    assert seen == [
        "launch_env:1", "wrapper:before", "wrapper:after", "wrapper:before", "hears", "wrapper:after"
    ]
    assert procs.is_alive(agent.host)  # the failing notification undid nothing
    assert "plugin 'breaks' failed in on_launched: boom" in caplog.text


def test_with_the_matrix_off_the_dispatcher_launches_without_the_contract_and_writes_no_entry(
    sublab: Lab,
) -> None:
    settings = {"processMatrix": {"enabled": False}}
    (sublab.agent_dir / "settings.json").write_text(json.dumps(settings))
    dispatcher = sublab.dispatcher()
    fired = dispatcher.fire(
        FireRequest(task="say hi", profile="stand-in", path=str(sublab.work), backend="subprocess")
    )
    (agent,) = fired.job.agents
    assert agent.host is not None
    sublab.started.append(agent.host)
    (planned,) = fired.planned
    assert ENV_PARENT_PID not in planned.env and ENV_ALLOWED_PATHS not in planned.env
    result = wait_for("the DONE result", lambda: sublab.result(fired.job.id, agent.agent_id))
    assert result.kind is ResultKind.DONE
    assert sublab.store.list().entries == ()


def test_a_lost_record_is_rebuilt_from_the_pane_tags_and_unknown_panes_are_listed(lab: Lab) -> None:
    lab.start_master()
    fired = lab.fire("HANG tagged")
    (agent,) = fired.job.agents
    lab.worker(agent.key)
    jobs = JobStore(lab.store)
    # A dispatcher that died right after starting the pane: the record never got the pane.
    jobs.update(
        fired.job.id,
        lambda j: attrs.evolve(
            j, agents=tuple(attrs.evolve(a, pane_id=None, host_pid=None, host_start=None) for a in j.agents)
        ),
    )
    views = {v["jobId"]: v for v in lab.dispatcher().reconcile(sockets={lab.socket})}
    (rebuilt,) = views[fired.job.id]["agents"]
    assert rebuilt["paneId"] == agent.pane_id and rebuilt["hostPid"] == agent.host_pid
    assert rebuilt["tmux"] == "ours" and rebuilt["hostAlive"] is True

    # The record gone altogether: the pane is still found, by its tags, and killed by no one.
    (lab.state / "jobs" / f"{fired.job.id}.json").unlink()
    views = {v["jobId"]: v for v in lab.dispatcher().reconcile(sockets={lab.socket})}
    assert views[fired.job.id]["state"] == "untracked"
    assert views[fired.job.id]["agents"][0]["key"] == agent.key
    assert procs.is_alive(lab.store.get(agent.key).process)


def test_every_tmux_call_of_a_fire_is_a_list_argv_and_a_launch_is_the_host_after_double_dash(
    sublab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake ``tmux`` first on PATH records every call of a real ``fire`` (a team of two)."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    log = tmp_path / "tmux-calls.jsonl"
    fake = bin_dir / "tmux"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if 'new-window' in sys.argv or 'new-session' in sys.argv:\n"
        "    print('%7\\t999999\\t@3\\t0\\tpi-matrix\\t\\tagent')\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    sublab.start_master()
    task = "; rm -rf ~ $(id) 'q' \"qq\"\nline two"
    sublab.fire(task, profile=None, team="stand-in-pair")
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    launches = [c for c in calls if "new-window" in c or "new-session" in c]
    assert len(launches) == 2
    for call in launches:
        argv = call[call.index("--") + 1 :]
        assert len(argv) >= 2
        assert argv[1:4] == ["-m", "pi_tmux_matrix", "--state-dir"]  # the pane command is the host
        agent_argv = argv[argv.index("--") + 1 :]
        assert any(task in word for word in agent_argv)  # the task is one word, untouched
    assert not any("send-keys" in c for c in calls)


def test_fire_json_prints_the_job_and_each_agents_key_target_and_pane_pid(lab: Lab) -> None:
    master = lab.start_master()
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "fire", "--team", "stand-in-pair", "--socket", lab.socket,
         "--parent-pid", str(master.pid), "--parent-session", "boss", "--path", str(lab.work), "--json",
         "--", "HANG json"],
        capture_output=True, text=True, env=lab.env, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["jobId"].startswith("job-") and len(out["agents"]) == 2
    for agent in out["agents"]:
        assert agent["key"].startswith("worker-") and agent["paneId"].startswith("%")
        ident = procs.identify(agent["panePid"])
        assert ident is not None
        lab.started.append(ident)
        assert agent["target"].startswith("pi-matrix:")
        lab.worker(agent["key"])


# A session file that is gone is no refusal any more (issue 18.11): the same logical agent is
# relaunched into a fresh file (tests/test_recovery_relaunch.py).
@pytest.mark.parametrize("broken", ["header_cwd_gone", "profile_gone"])
def test_resume_refuses_what_it_cannot_resume_exactly(lab: Lab, broken: str) -> None:
    master = lab.start_master()
    fired = lab.fire("HANG to resume", lane=None)
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    procs.send_signal(master.process, signal.SIGKILL)  # type: ignore[arg-type]
    resumable = wait_for(
        "resumable", lambda: e if (e := lab.store.find(agent.key)) and e.status is Status.RESUMABLE else None
    )
    for ident in (resumable.process, resumable.child_process):
        procs.send_signal(ident, signal.SIGKILL)  # type: ignore[arg-type]
        procs.wait_for_exit(ident, 5)  # type: ignore[arg-type]
    session_file = Path(entry.identity.session_file or "")
    if broken == "header_cwd_gone":
        lines = session_file.read_text().splitlines()
        header = json.loads(lines[0])
        header["cwd"] = str(lab.tmp / "vanished")
        session_file.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    else:
        user_profiles = lab.agent_dir / "launch_profiles"
        user_profiles.mkdir(exist_ok=True)
        # The entry and its payload together: a payload always describes the entry it sits in.
        lab.store.update(agent.key, lambda e: lifecycle.with_identity(e, profile="retired-reviewer"))
    new_master = lab.start_master(session="boss2")
    before = lab.store.get(agent.key)
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "resume", agent.key, "--dry-run", "--json",
         "--parent-pid", str(new_master.pid), "--parent-session", "boss2", "--socket", lab.socket],
        capture_output=True, text=True, env=lab.env, timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout
    expected = {
        "header_cwd_gone": "header",
        "profile_gone": "retired-reviewer",
    }
    assert expected[broken] in done.stderr
    assert lab.store.get(agent.key) == before  # nothing written


def test_two_relaunchers_racing_for_one_dead_worker_start_exactly_one_agent(sublab: Lab) -> None:
    """A master's recovery and a `pi-matrix resume` (or two masters) read the same resumable
    record: only the one whose claim lands starts a host; the other is refused."""
    import threading

    from pi_tmux_matrix.dispatch.model import Relaunch
    from pi_tmux_matrix.errors import ResumeRefused
    from pi_tmux_matrix.recovery import relaunch

    master = sublab.start_master()
    fired = sublab.fire("HANG resumable", backend="subprocess")
    (agent,) = fired.job.agents
    sublab.worker(agent.key)
    lose_worker(sublab, master, agent.key)
    snapshot = sublab.store.get(agent.key)
    new_master = sublab.start_master(session="boss2")
    assert new_master.process is not None
    request = Relaunch(
        entry=snapshot, parent=new_master.process, parent_session="boss2", state_dir=str(sublab.state),
        backend="subprocess",
    )  # fmt: skip
    outcomes: list[object] = []
    gate = threading.Barrier(2)

    def attempt() -> None:
        gate.wait()
        try:
            outcomes.append(relaunch(request, env=sublab.env))
        except ResumeRefused as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=attempt) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    pids = [o for o in outcomes if isinstance(o, int)]
    for pid in pids:
        if (ident := procs.identify(pid)) is not None:
            sublab.started.append(ident)
    assert len(pids) == 1, outcomes
    assert sum(isinstance(o, ResumeRefused) for o in outcomes) == 1
