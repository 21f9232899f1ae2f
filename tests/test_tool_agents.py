"""fire_task's ad-hoc ``agents[]`` (issue 22): agents without a profile file, each checked exactly
as a profile is, through the CLI (``fire --agent JSON`` / ``--agents-file``) and the real pi tool.
A refusal names the parameter and the fix, and nothing is launched or written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from labs import Lab
from model_script import last_tool_result, tool
from pilabs import MLab, run_print_master
from repos import git
from waiting import wait_for

from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.dispatch.model import ResultKind
from pi_tmux_matrix.dispatch.request import FireRequest
from pi_tmux_matrix.errors import ContractError
from pi_tmux_matrix.testing.fake_model import Reply

STANDIN = f"{sys.executable} -m pi_tmux_matrix.testing.standin"


def _fire(at: Lab, *words: str, task: str = "say hello") -> subprocess.CompletedProcess[str]:
    assert at.master is not None
    parent = ("--parent-pid", str(at.master.pid), "--parent-session", at.master.identity.session_id)
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", str(at.state), "fire", *parent, *words,
         "--", task],
        capture_output=True, text=True, env=at.env, timeout=60, check=False, cwd=at.work,
    )  # fmt: skip


def _track(at: Lab, job_id: str) -> None:
    for agent in JobStore(at.store).get(job_id).agents:
        if agent.host is not None:
            at.started.append(agent.host)


def test_ad_hoc_agents_run_without_a_profile_file_in_their_own_folder(sublab: Lab) -> None:
    sublab.start_master()
    folder = sublab.work / "sub"
    folder.mkdir()
    lead = {"provider": "pi", "name": "lead", "command": STANDIN, "path": str(folder)}
    echo = {
        "provider": "custom",
        "name": "echo",
        "command": f"{sys.executable} -c 'import sys; print(sys.argv)'",
    }
    done = _fire(
        sublab, "--backend", "subprocess", "--launch-key", "adhoc-1", "--json",
        "--agent", json.dumps(lead), "--agent", json.dumps(echo),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    _track(sublab, "adhoc-1")
    job = JobStore(sublab.store).get("adhoc-1")
    assert job.profile is None and job.team is None
    by_name = {a.agent_id.rsplit("-", 1)[-1]: a for a in job.agents}
    assert by_name["lead"].profile == "adhoc.lead" and by_name["lead"].provider == "pi"
    assert by_name["lead"].cwd == str(folder.resolve()) and by_name["echo"].cwd == str(sublab.work.resolve())
    assert by_name["echo"].deadline_s == 1200  # the origin's default
    result = wait_for("the lead's DONE", lambda: sublab.result("adhoc-1", by_name["lead"].agent_id))
    assert result.kind is ResultKind.DONE
    ended = wait_for("the echo agent's end", lambda: sublab.result("adhoc-1", by_name["echo"].agent_id))
    assert ended.kind is ResultKind.EXITED
    # The same list from a file; a pi agent's path keeps its file tools in that folder.
    spec = sublab.tmp / "agents.json"
    spec.write_text(json.dumps([dict(lead, name="again")]))
    plan = _fire(sublab, "--backend", "subprocess", "--agents-file", str(spec), "--dry-run")
    assert plan.returncode == 0, plan.stderr
    assert "adhoc.again" in plan.stdout and "pi_tmux_matrix.testing.standin" in plan.stdout
    from pi_tmux_matrix.dispatch.adhoc import parse_agents

    request = FireRequest(
        task="x", agents=parse_agents([dict(lead, name="again")]), dry_run=True, path=str(sublab.work),
        parent_pid=sublab.master.pid if sublab.master else None, parent_session="boss",
    )  # fmt: skip
    _job, (planned,) = sublab.dispatcher().plan(request)
    assert json.loads(planned.env["PI_WORKER_ALLOWED_PATHS"]) == [str(folder.resolve())]
    # The origin's legacy cwd: the agent runs there, nothing is narrowed.
    legacy = attrs.evolve(request, agents=parse_agents([{"provider": "pi", "cwd": str(folder)}]))
    _job, (planned,) = sublab.dispatcher().plan(legacy)
    assert planned.cwd == str(folder.resolve())
    assert json.loads(planned.env.get("PI_WORKER_ALLOWED_PATHS", "[]")) == []  # full scope


BAD_AGENTS = [
    (
        {"provider": "claude", "tools": ["read"]},
        "agents[0].tools: pi-only field on provider 'claude'; remove it",
    ),
    ({"provider": "claude", "thinkingLevel": "high"}, "agents[0].thinkingLevel: pi-only field on provider"),
    (
        {"provider": "codex", "resourceProfile": "small"},
        "agents[0].resourceProfile: pi-only field on provider",
    ),
    (
        {"provider": "agy", "worktreeLane": "lane-1"},
        "agents[0].worktreeLane: the agy CLI has no --worktree-lane",
    ),
    (
        {"provider": "custom", "command": "tail -f log | grep x"},
        "agents[0].command: 'tail -f log | grep x' needs",
    ),
    ({"provider": "custom", "command": "echo $HOME"}, "agents[0].command: 'echo $HOME' needs a shell"),
    ({"provider": "custom", "command": "ls *.py"}, "needs a shell ('*' would be a glob)"),
    ({"provider": "custom"}, "agents[0].command: missing for provider custom"),
    ({"provider": "pi", "tools": ["tmux_agent_manager"]}, "agents[0].tools: 'tmux_agent_manager' launches"),
    ({"provider": "pi", "tools": ["read", "delegate"]}, "agents[0].tools: 'delegate' is neither one of pi's"),
    ({"provider": "pi", "thinkingLevel": "loud"}, "agents[0].thinkingLevel: 'loud' is not a thinking level"),
    ({"provider": "pi", "toolz": []}, "agents[0].toolz: unknown parameter; the parameters are: provider"),
    ({"provider": "gemini"}, "agents[0].provider: 'gemini' is not a provider"),
    ({"provider": "pi", "name": "../x"}, "agents[0].name: '../x' is not a valid id"),
    ({"provider": "pi", "path": "/no/such/dir"}, "agents[0].path: /no/such/dir is not a directory"),
]


@pytest.mark.parametrize(("agent", "named"), BAD_AGENTS)
def test_a_bad_ad_hoc_agent_names_its_parameter_and_nothing_is_made(
    sublab: Lab,
    agent: dict[str, object],
    named: str,
) -> None:
    sublab.start_master()
    git(sublab.work, "init", "-q", "-b", "main")  # the good agent's lane could be made, were anything
    git(
        sublab.work,
        "-c",
        "user.name=t",
        "-c",
        "user.email=t@x.invalid",
        "commit",
        "-q",
        "--allow-empty",
        "-m",
        "i",
    )
    good = {"provider": "pi", "name": "fine", "command": STANDIN, "worktreeLane": "lane-9"}
    done = _fire(sublab, "--backend", "subprocess", "--agent", json.dumps(good), "--agent", json.dumps(agent))
    assert done.returncode == 2, done.stdout + done.stderr
    assert named.replace("agents[0]", "agents[1]") in done.stderr and "Traceback" not in done.stderr
    assert JobStore(sublab.store).list_jobs() == ([], [])
    assert not (sublab.work / ".worktrees").exists()  # the good agent's lane was never made


@pytest.mark.parametrize(
    ("words", "named"),
    [
        (("--agent", "{nope"), "--agent #1: is not JSON"),
        (
            (
                "--agent",
                json.dumps({"name": "a", "provider": "pi"}),
                "--agent",
                json.dumps({"name": "a", "provider": "claude"}),
            ),
            "agents[1].name: 'a' is used twice",
        ),
        (("--agent", "[]"), "agents[0]: must be an object, not list"),
        (("--profile", "stand-in", "--deadline", "0"), "--deadline: 0s is outside 1..86400"),
        (("--profile", "stand-in", "--deadline", "90000"), "--deadline: 90000s is outside"),
        (("--agents-file", "/no/such/file.json"), "--agents-file: cannot be read"),
    ],
)
def test_bad_fire_input_names_itself_and_writes_nothing(
    sublab: Lab,
    words: tuple[str, ...],
    named: str,
) -> None:
    sublab.start_master()
    done = _fire(sublab, "--backend", "subprocess", *words)
    assert done.returncode == 2, done.stdout + done.stderr
    assert named in done.stderr and "Traceback" not in done.stderr
    assert JobStore(sublab.store).list_jobs() == ([], [])


def test_a_command_is_split_into_words_as_written_and_never_by_a_shell() -> None:
    from pi_tmux_matrix.dispatch.adhoc import split_command

    assert split_command("claude --model 'opus 4' \"a b\" x\\ y", "c") == (
        "claude", "--model", "opus 4", "a b", "x y",
    )  # fmt: skip
    assert split_command("agy --prompt-interactive", "c") == ("agy", "--prompt-interactive")
    quoted = split_command("tool '$HOME' '*.py' 'a|b' '{a,b}'", "c")  # quoted, they are plain words
    assert quoted == ("tool", "$HOME", "*.py", "a|b", "{a,b}")
    assert split_command("{python} -m x {task} a{b}c", "c") == ("{python}", "-m", "x", "{task}", "a{b}c")
    needing = ("a; b", "a && b", "a > f", "$(id)", "`id`", '"$HOME"', "~/bin/x", "a # c", "x 'open")
    for needs in (*needing, "cp f{,.bak}", "seq {1..3}", "x\\"):
        with pytest.raises(ContractError, match=r"^c: .* needs a shell"):
            split_command(needs, "c")
    with pytest.raises(ContractError, match=r"^c: is empty"):
        split_command("   ", "c")


@pytest.mark.real_pi
@pytest.mark.any_pi
def test_the_pi_tool_fires_ad_hoc_agents_and_refuses_bad_ones_by_name(
    mlab: MLab,
) -> None:
    at, llm, script = mlab
    helper = {"provider": "pi", "name": "helper", "command": STANDIN}
    sub = at.work / "sub"
    sub.mkdir()
    script.steps = [
        tool(action="fire_task", agents=[helper], task="HANG ad hoc", launchKey="adhoc-tool", cwd=str(sub)),
        tool(action="fire_task", agents=[{"provider": "claude", "name": "rev", "tools": ["read"]}], task="x"),
        tool(action="fire_task", agents=[{"provider": "custom", "command": "make | tee log"}], task="x"),
        tool(action="fire_task", agents=[helper], profile="stand-in", task="x"),
        tool(action="fire_task", profile="stand-in", task="x", deadlineSeconds=90000),
        tool(action="fire_task", teamTemplate="stand-in-pair", goalId="goal-9", dryRun=True, body="preview"),
        lambda _r: Reply(text="done"),
    ]  # fmt: skip
    done = run_print_master(at, "Launch an ad-hoc helper.")
    assert done.returncode == 0, done.stdout + done.stderr
    fired, pi_only, shell, both, deadline, dry = (last_tool_result(r) for r in llm.requests[1:7])
    assert '"jobId":"adhoc-tool"' in fired
    assert "agents[0].tools: pi-only field on provider 'claude'" in pi_only and "remove it" in pi_only
    assert "agents[0].command" in shell and "needs a shell" in shell
    assert "give agents, teamTemplate or profile" in both
    assert "deadlineSeconds" in deadline and "86400" in deadline
    assert '"dryRun":true' in dry and '"taskRef":"goal-9"' in dry and "stand-in-pair-" in dry
    jobs, _ = JobStore(at.store).list_jobs()
    assert [j.id for j in jobs] == ["adhoc-tool"]  # the refusals and the dry run wrote nothing
    _track(at, "adhoc-tool")
    (agent,) = jobs[0].agents
    assert agent.profile == "adhoc.helper" and agent.agent_id.endswith("-helper")
    assert Path(agent.cwd) == sub.resolve()  # the origin's cwd is our path
