"""tmux_agent_manager does what the origin's tool does (issue 22): fire_task's launchKey, force,
workspaceName, deadlineSeconds and the origin's camelCase names, through the CLI and the real pi
tool alike. Each test was seen to fail before the change."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from labs import Lab
from model_script import last_tool_result, tool
from pilabs import MLab, run_print_master

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.testing.fake_model import Reply


def _fire(at: Lab, *words: str, task: str = "HANG keyed work") -> subprocess.CompletedProcess[str]:
    assert at.master is not None
    parent = ("--parent-pid", str(at.master.pid), "--parent-session", at.master.identity.session_id)
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(at.state), "fire",
         "--profile", "stand-in", *parent, *words, "--", task],
        capture_output=True, text=True, env=at.env, timeout=60, check=False, cwd=at.work,
    )  # fmt: skip


def test_a_launch_key_is_the_job_id_a_second_fire_is_refused_and_force_archives_the_old_record(
    sublab: Lab,
) -> None:
    sublab.start_master()
    first = _fire(sublab, "--backend", "subprocess", "--launch-key", "build-7", "--json")
    assert first.returncode == 0, first.stderr
    assert json.loads(first.stdout)["jobId"] == "build-7"
    again = _fire(sublab, "--backend", "subprocess", "--launch-key", "build-7")
    assert again.returncode == 2 and "--launch-key" in again.stderr and "--force" in again.stderr
    jobs = JobStore(sublab.store)
    old = jobs.get("build-7")
    forced = _fire(sublab, "--backend", "subprocess", "--launch-key", "build-7", "--force", "--json")
    assert forced.returncode == 0, forced.stderr
    new = jobs.get("build-7")
    assert new.created_at != old.created_at
    archived = list((sublab.state / "archived-jobs").iterdir())
    assert len(archived) == 1 and json.loads(archived[0].read_text())["id"] == "build-7"
    for agent in (*old.agents, *new.agents):
        if agent.host is not None:
            sublab.started.append(agent.host)
    # A key with ':' (the origin allows it) is one stable, file-safe job id.
    colon = _fire(sublab, "--backend", "subprocess", "--launch-key", "team:alpha", "--json")
    assert colon.returncode == 0, colon.stderr
    assert json.loads(colon.stdout)["jobId"].startswith("team.alpha-")


@pytest.mark.parametrize(
    ("words", "named"),
    [
        (("--launch-key", "ab"), "--launch-key: 'ab' is not a launch key"),
        (("--launch-key", "bad/key"), "--launch-key: 'bad/key' is not a launch key"),
        (("--force",), "--force: given without --launch-key"),
        (("--workspace", "no.dots"), "--workspace: 'no.dots' is not a tmux session name"),
    ],
)
def test_bad_fire_parameters_name_themselves_and_write_nothing(
    sublab: Lab,
    words: tuple[str, ...],
    named: str,
) -> None:
    sublab.start_master()
    done = _fire(sublab, "--backend", "subprocess", *words)
    assert done.returncode == 2, done.stdout + done.stderr
    assert named in done.stderr and "Traceback" not in done.stderr
    assert JobStore(sublab.store).list_jobs() == ([], [])


def test_a_workspace_is_a_fresh_tmux_session_and_an_existing_one_is_refused(lab: Lab) -> None:
    lab.start_master()
    done = _fire(lab, "--socket", lab.socket, "--workspace", "feature-x", "--json")
    assert done.returncode == 0, done.stderr
    (agent,) = json.loads(done.stdout)["agents"]
    assert agent["target"].startswith("feature-x:")
    again = _fire(lab, "--socket", lab.socket, "--workspace", "feature-x", "--launch-key", "other-1")
    assert again.returncode == 2 and "--workspace" in again.stderr and "feature-x" in again.stderr
    assert [j.id for j in JobStore(lab.store).list_jobs()[0]] == [json.loads(done.stdout)["jobId"]]


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_pi_tool_takes_the_origins_names_and_refuses_a_bad_one_by_name(
    mlab: MLab,
) -> None:
    at, llm, script = mlab
    script.steps = [
        tool(action="fire_task", profile="stand-in", body="HANG keyed", launchKey="nightly-1",
             deadlineSeconds=300, dryRun=False),
        tool(action="fire_task", profile="stand-in", task="HANG again", launchKey="nightly-1"),
        tool(action="fire_task", profile="stand-in", task="x", deadlineSeconds=2),
        tool(action="job_status", jobId="nightly-1"),
        lambda _r: Reply(text="done"),
    ]  # fmt: skip
    done = run_print_master(at, "Launch keyed work.")
    assert done.returncode == 0, done.stdout + done.stderr
    fired, duplicate, short, status = (last_tool_result(r) for r in llm.requests[1:5])
    assert '"jobId":"nightly-1"' in fired
    assert "launchKey: job nightly-1 already exists" in duplicate and "force: true" in duplicate
    assert "--launch-key" not in duplicate and "--force" not in duplicate  # the tool's names, not the CLI's
    assert "deadlineSeconds" in short and "5" in short
    assert "nightly-1" in status
    job = JobStore(at.store).get("nightly-1")
    assert job.task == "HANG keyed" and job.agents[0].deadline_s == 300
    for agent in job.agents:
        if agent.host is not None:
            at.started.append(agent.host)


def test_job_variables_are_set_read_and_listed_durably_and_every_worker_is_told_where(
    sublab: Lab,
) -> None:
    sublab.start_master()
    fired = _fire(sublab, "--backend", "subprocess", "--launch-key", "vars-1", "--json")
    assert fired.returncode == 0, fired.stderr
    job = JobStore(sublab.store).get("vars-1")
    for agent in job.agents:
        if agent.host is not None:
            sublab.started.append(agent.host)
    assert sublab.cli("var", "vars-1", "target", "staging").returncode == 0
    assert sublab.cli("var", "vars-1", "retries", "3").returncode == 0
    listed = sublab.cli("var", "vars-1", "--json")
    assert listed.returncode == 0, listed.stderr
    shown = json.loads(listed.stdout)
    assert shown["values"] == {"target": "staging", "retries": "3"}
    path = sublab.state / "variables" / "vars-1.json"
    assert shown["file"] == str(path) and oct(path.stat().st_mode & 0o777) == "0o600"
    one = sublab.cli("var", "vars-1", "target")
    assert one.returncode == 0 and one.stdout == "target=staging\n"
    missing = sublab.cli("var", "vars-1", "nope")
    assert missing.returncode == 3 and "no variable 'nope'" in missing.stderr
    bad = sublab.cli("var", "vars-1", "bad name!", "x")
    assert bad.returncode == 2 and "NAME" in bad.stderr and "1-80" in bad.stderr
    assert json.loads(path.read_text())["values"] == {"target": "staging", "retries": "3"}  # unchanged
    # The worker's prompt names the file and when to read it.
    (agent,) = job.agents
    entry = sublab.worker(agent.key)
    with open(entry.identity.session_file or "") as lines:
        prompt = " ".join(str(json.loads(line).get("content") or "") for line in lines if line.strip())
    assert str(path) in prompt and "decision point" in prompt


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_pi_tool_sets_and_lists_job_variables_and_refuses_a_bad_name(
    mlab: MLab,
) -> None:
    at, llm, script = mlab
    script.steps = [
        tool(action="fire_task", profile="stand-in", task="HANG vars", launchKey="vars-2"),
        tool(action="set_variable", jobId="vars-2", name="mode", value="fast"),
        tool(action="set_variable", jobId="vars-2", name="no spaces", value="x"),
        tool(action="list_variables", job_id="vars-2"),
        lambda _r: Reply(text="done"),
    ]  # fmt: skip
    done = run_print_master(at, "Set a variable.")
    assert done.returncode == 0, done.stdout + done.stderr
    _fired, set_one, bad, listed = (last_tool_result(r) for r in llm.requests[1:5])
    assert '"mode":"fast"' in set_one
    assert "name: 'no spaces' is not a variable name" in bad and "NAME" not in bad
    assert json.loads(listed)["values"] == {"mode": "fast"}
    for agent in JobStore(at.store).get("vars-2").agents:
        if agent.host is not None:
            at.started.append(agent.host)


def test_the_origins_team_templates_ship_and_templates_lists_and_shows_them(tmp_path: object) -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "templates", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    names = {t["name"] for t in json.loads(listed.stdout)}
    assert {"builder-validator", "full-provider-review", "provider-prompt-smoke", "impl-review"} <= names
    one = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "templates", "builder-validator", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    shown = json.loads(one.stdout)
    assert [m["suffix"] for m in shown["members"]] == ["builder", "validator"]
    assert all(m["instructions"] for m in shown["members"])
    missing = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "templates", "nope"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert missing.returncode == 3 and "no team named 'nope'" in missing.stderr


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_pi_tool_lists_and_shows_templates(mlab: MLab) -> None:
    at, llm, script = mlab
    script.steps = [
        tool(action="list_templates"),
        tool(action="show_template", templateName="full-provider-review"),
        lambda _r: Reply(text="done"),
    ]
    done = run_print_master(at, "Which templates are there?")
    assert done.returncode == 0, done.stdout + done.stderr
    listed, shown = (last_tool_result(r) for r in llm.requests[1:3])
    assert "builder-validator" in listed and "provider-prompt-smoke" in listed
    profiles = [m["profile"] for m in json.loads(shown)["members"]]
    assert profiles == ["pi-reviewer", "claude", "codex", "opencode"]


def test_stop_session_previews_without_the_word_then_stops_every_job_of_that_tmux_session(lab: Lab) -> None:
    lab.start_master()
    jobs = []
    for key in ("ws-a", "ws-b"):
        done = _fire(
            lab, "--socket", lab.socket, "--workspace", f"review-{key}", "--launch-key", key, "--json"
        )
        assert done.returncode == 0, done.stderr
        jobs.append(json.loads(done.stdout))
    other = _fire(lab, "--socket", lab.socket, "--launch-key", "elsewhere", "--json")
    assert other.returncode == 0, other.stderr
    store = JobStore(lab.store)
    hosts = {j.id: [a.host for a in j.agents] for j in store.list_jobs()[0]}
    for ids in hosts.values():
        lab.started.extend(h for h in ids if h is not None)
    preview = lab.cli("stop-session", "review-ws-a", "--socket", lab.socket)
    assert preview.returncode == 2 and "ws-a" in preview.stdout and "nothing was stopped" in preview.stderr
    assert all(procs.is_alive(h) for h in hosts["ws-a"])
    done = lab.cli("stop-session", "review-ws-a", "--socket", lab.socket, "--confirm", "yes-tmux-stop")
    assert done.returncode == 0, done.stderr
    assert all(procs.wait_for_exit(h, 20) for h in hosts["ws-a"] if h is not None)
    assert all(procs.is_alive(h) for h in hosts["ws-b"] + hosts["elsewhere"])  # only that session
    assert store.get("ws-a").stopped_at is not None and store.get("ws-b").stopped_at is None
    # A job named by its launch key is stopped by that key too.
    by_key = lab.cli("stop", "ws-b", "--confirm", "yes-tmux-stop")
    assert by_key.returncode == 0, by_key.stderr
    missing = lab.cli("stop-session", "no-such-session", "--socket", lab.socket)
    assert missing.returncode == 3 and "no job has agents" in missing.stderr


def test_notify_and_the_status_option_reach_the_named_tmux_session_and_tmux_formats_never_run(
    lab: Lab,
) -> None:
    subprocess.run(
        ["tmux", "-L", lab.socket, "new-session", "-d", "-s", "ops", "sleep", "600"], check=True, timeout=10
    )
    planted = lab.tmp / "pwned"
    note = lab.cli("notify", "ops", "--socket", lab.socket, "--", f"build done #(touch {planted})")
    assert note.returncode == 0, note.stderr
    assert not planted.exists()
    assert lab.cli("set-status", "ops", "build", "green", "--socket", lab.socket).returncode == 0
    shown = subprocess.run(
        ["tmux", "-L", lab.socket, "show-options", "-t", "=ops:", "@pi_build"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert shown.stdout.strip() == "@pi_build green"
    assert lab.cli("set-status", "ops", "build", "--socket", lab.socket).returncode == 0
    gone = subprocess.run(
        ["tmux", "-L", lab.socket, "show-options", "-t", "=ops:", "@pi_build"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert gone.returncode != 0
    bad = lab.cli("set-status", "ops", "no spaces", "x", "--socket", lab.socket)
    assert bad.returncode == 2 and "KEY" in bad.stderr
    control = lab.cli("notify", "ops", "--socket", lab.socket, "--", "a\x1b[2Jb")
    assert control.returncode == 2 and "TEXT" in control.stderr


@pytest.mark.real_pi
def test_the_pi_tool_notifies_and_sets_and_clears_a_status(mlab: MLab) -> None:
    at, llm, script = mlab
    subprocess.run(
        ["tmux", "-L", at.socket, "new-session", "-d", "-s", "ops", "sleep", "600"], check=True, timeout=10
    )
    script.steps = [
        tool(action="notify", sessionName="ops", message="hello"),
        tool(action="set_status", sessionName="ops", key="phase", value="review"),
        tool(action="clear_status", sessionName="ops", key="phase"),
        lambda _r: Reply(text="done"),
    ]
    done = run_print_master(at, "Tell the ops session.")
    assert done.returncode == 0, done.stdout + done.stderr
    notified, set_one, cleared = (last_tool_result(r) for r in llm.requests[1:4])
    assert "notified session ops" in notified
    assert "set @pi_phase" in set_one and "cleared @pi_phase" in cleared
