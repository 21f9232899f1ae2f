"""The landed actions also take the origin's parameter names (issue 22): send_followup's ``task`` and
``agentId``, set_variable's ``variableName``/``variableValue``, show_template's ``teamTemplate``,
notify's ``title``/``body`` and set_status/clear_status's ``statusKey``/``status`` (default key
``pi-agents``), so a prompt written for the origin works unchanged. Real pi, real tool."""

from __future__ import annotations

import json
import subprocess

import pytest
from labs import Lab
from model_script import last_tool_result, tool
from pilabs import MLab, run_print_master
from waiting import wait_for

from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.testing.fake_model import Reply

pytestmark = [pytest.mark.real_pi, pytest.mark.any_pi]  # real pi; not in the oldest-pi pass


def _option(at: Lab, name: str) -> str:
    shown = subprocess.run(
        ["tmux", "-L", at.socket, "show-options", "-t", "=ops:", name],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    return shown.stdout.strip()


def test_the_pi_tool_takes_the_origins_names_for_every_landed_action(
    mlab: MLab,
) -> None:
    at, llm, script = mlab
    subprocess.run(
        ["tmux", "-L", at.socket, "new-session", "-d", "-s", "ops", "sleep", "600"], check=True, timeout=10
    )
    script.steps = [
        tool(action="fire_task", profile="stand-in", task="HANG named", launchKey="origin-1"),
        tool(action="set_variable", jobId="origin-1", variableName="mode", variableValue="fast"),
        tool(action="send_followup", jobId="origin-1", task="HANG more", agentId="nobody"),
        tool(action="send_followup", jobId="origin-1", body="HANG more"),
        tool(action="show_template", teamTemplate="builder-validator"),
        tool(action="notify", workspaceName="ops", title="Build", body="done"),
        tool(action="set_status", workspaceName="ops", status="review"),
        tool(action="set_status", workspaceName="ops", statusKey="phase", status="qa"),
        tool(action="clear_status", workspaceName="ops", statusKey="phase"),
        lambda _r: Reply(text="done"),
    ]  # fmt: skip
    done = run_print_master(at, "Drive the job with the origin's names.")
    assert done.returncode == 0, done.stdout + done.stderr
    results = [last_tool_result(r) for r in llm.requests[1:10]]
    _fired, variable, wrong_agent, followup, template, notified, default_key, phase, cleared = results
    for agent in JobStore(at.store).get("origin-1").agents:
        if agent.host is not None:
            at.started.append(agent.host)
    assert '"mode":"fast"' in variable
    assert "has no agent 'nobody'" in wrong_agent  # agentId reached --agent
    (agent,) = JobStore(at.store).get("origin-1").agents
    assert agent.round == 2 and '"origin-1"' in followup
    assert [m["suffix"] for m in json.loads(template)["members"]] == ["builder", "validator"]
    assert "notified session ops" in notified
    assert "set @pi_pi-agents" in default_key and _option(at, "@pi_pi-agents") == "@pi_pi-agents review"
    assert "set @pi_phase" in phase and "cleared @pi_phase" in cleared
    wait_for("the option to go", lambda: _option(at, "@pi_phase") == "" or None)
