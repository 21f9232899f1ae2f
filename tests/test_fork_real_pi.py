"""Fork runs with the real pi CLI (pinned, from npm) against the fake LLM on 127.0.0.1."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from forklab import Caller
from pi_support import pi_bin
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.fork import PARENT_ABORTED, RunStatus, RunStore
from pi_tmux_matrix.testing.fake_model import FakeModel, Reply

pytestmark = pytest.mark.real_pi  # real pi: .ci/run's oldest-pi pass runs this file too


def _system_prompt(request: dict[str, object]) -> str:
    messages = request.get("messages")
    assert isinstance(messages, list)
    first = messages[0]
    assert isinstance(first, dict) and first.get("role") == "system"
    return str(first.get("content"))


def _is_fork(request: dict[str, Any]) -> bool:
    return "You are a fork" in _system_prompt(request)


def test_a_real_pi_fork_answers_once_writes_its_result_and_exits(picaller: tuple[Caller, FakeModel]) -> None:
    caller, llm = picaller
    llm.script(Reply(text="The fork checked it: all good."))
    before = caller.session.read_bytes()
    done = caller.fork("--wait", "--model", "fake/fake-model", "--json", "--", "Check the parser.")
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads(done.stdout)
    assert run["status"] == "completed" and run["exitCode"] == 0
    assert run["text"] == "The fork checked it: all good."
    assert run["stopReason"] == "stop" and run["model"] == "fake-model"
    assert run["usage"]["input"] == 10 and run["usage"]["output"] == 5
    assert run["argv"][run["argv"].index("--model") + 1] == "fake/fake-model"
    (request,) = llm.requests  # one run, then the child exited by itself
    assert "Check the parser." in llm.user_texts()
    assert "You are a fork" in _system_prompt(request)  # the bridge's fork-child prompt
    folder = caller.state / "runs" / run["id"]
    result = json.loads((folder / "result.json").read_text())  # written by the bridge on agent_end
    assert result["runId"] == run["id"] and result["sessionFile"] == str(folder / "session.jsonl")
    snapshot = (folder / "session.jsonl").read_text().splitlines()
    assert json.loads(snapshot[0])["id"] == "parent-1"  # pi appended to the snapshot, same header
    assert any("all good" in line for line in snapshot[1:])
    assert caller.session.read_bytes() == before
    wait_for("the fork pane to close", lambda: run["paneId"] not in caller.panes())


@pytest.mark.any_pi  # the master's shutdown: the bash-started fork's test
def test_a_running_real_pi_fork_is_stopped_and_failed_when_its_parent_shuts_down(
    picaller: tuple[Caller, FakeModel],
) -> None:
    caller, llm = picaller
    llm.script(Reply(text="too late", delay_s=60))
    done = caller.fork("--background", "--json", "--", "Take your time.")
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["id"]
    wait_for("the fork's turn to reach the LLM", lambda: llm.requests, timeout=60)
    run = RunStore(caller.store).get(run_id)
    assert run.status is RunStatus.RUNNING and run.process is not None

    aborted = caller.runs_cli("--abort", "--parent-session", str(caller.session))
    assert aborted.returncode == 0 and "stopped 1 fork(s)" in aborted.stdout
    ended = RunStore(caller.store).get(run_id)
    assert ended.status is RunStatus.FAILED and ended.error == PARENT_ABORTED
    assert procs.wait_for_exit(run.process, 10)
    assert run.pane_id not in caller.panes()


def test_a_real_pi_forks_usage_counts_every_assistant_message_of_its_run(
    picaller: tuple[Caller, FakeModel],
) -> None:
    """A tool-call round and the final answer are two paid requests: the run's usage is both."""
    caller, llm = picaller
    llm.script(Reply(tool="bash", arguments={"command": "echo checked"}), Reply(text="Checked twice."))
    done = caller.fork("--wait", "--model", "fake/fake-model", "--json", "--", "Check it with a command.")
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads(done.stdout)
    assert run["text"] == "Checked twice." and len(llm.requests) == 2
    assert run["usage"]["input"] == 20 and run["usage"]["output"] == 10 and run["usage"]["totalTokens"] == 30
    assert run["activity"] == ["bash: echo checked"]  # the run's tool calls, one line each (issue 23)


def test_a_real_pi_masters_end_stops_the_fork_its_bash_tool_started(
    picaller: tuple[Caller, FakeModel],
) -> None:
    """The whole path with real pi on both sides: a print-mode pi master under its host runs
    ``pi-matrix fork --background`` through its bash tool and ends its turn; its host stops the
    still-running real-pi fork and fails it with the seed message."""
    caller, llm = picaller
    fork = shlex.join(
        [sys.executable, "-m", "pi_tmux_matrix", "fork", "--background", "--json",
         "--session", str(caller.session), "--", "Take your time."]
    )  # fmt: skip

    def respond(request: dict[str, Any]) -> Reply:
        if _is_fork(request):
            return Reply(text="too late", delay_s=60)  # the fork is still working when the master ends
        roles = [m.get("role") for m in request.get("messages", []) if isinstance(m, dict)]
        if "tool" in roles:
            # The master ends its turn once the fork is working (its own request is in).
            wait_for("the fork's request", lambda: any(_is_fork(r) for r in list(llm.requests)), timeout=30)
            return Reply(text="Forked a helper; my part is done.")
        return Reply(tool="bash", arguments={"command": fork})

    llm.responder = respond
    argv = [
        sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss", "--headless", "--mode",
        "print", "--", pi_bin(), "-p", "Fork a helper to look around.",
    ]  # fmt: skip
    with caller.process(argv) as master:
        assert master.wait(timeout=90) == 0
        (run,) = caller.runs()
        assert run.parent_key == "master-boss"
        assert run.status is RunStatus.FAILED and run.error == PARENT_ABORTED
        assert run.process is not None and procs.wait_for_exit(run.process, 10)
        wait_for("the fork pane to close", lambda: run.pane_id not in caller.panes())


@pytest.mark.any_pi  # a fork child: the answering fork's test; the agent dir: test_envelope
def test_a_real_pi_fork_child_cannot_write_into_the_agent_dir(picaller: tuple[Caller, FakeModel]) -> None:
    """Issue 16 (the fork launch path): a fork child runs with full scope (a confined worker may
    not fork at all), but pi's agent dir and .pi folders stay never-writable, as for every worker."""
    caller, llm = picaller
    agent_dir = Path(caller.env["PI_CODING_AGENT_DIR"])
    planted = agent_dir / "extensions" / "x.ts"
    llm.script(
        Reply(tool="write", arguments={"path": str(planted), "content": "export default 0;"}),
        Reply(text="The fork tried."),
    )
    done = caller.fork("--wait", "--model", "fake/fake-model", "--json", "--", "Plant it.")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not planted.exists(), "a fork child wrote into pi's agent dir"
    messages = [m for r in llm.requests for m in r.get("messages", []) if isinstance(m, dict)]
    results = [m for m in messages if m.get("role") == "tool"]
    assert any("pi's agent dir" in json.dumps(m) for m in results), results
