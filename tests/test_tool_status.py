"""``status``, ``setup_help``, ``guard`` and ``/tmux-agents`` (issue 22): tmux detection (binary,
version, the dispatcher's server, the caller's session) with the matrix summary, through the CLI,
the real pi tool and the real pi's slash command. Each test was seen to fail before the change."""

from __future__ import annotations

import json
import os
import selectors
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from labs import Lab
from model_script import last_tool_result, tool
from pi_support import pi_bin, pi_temp
from pilabs import MLab, run_print_master

from pi_tmux_matrix.bridge import bridge_path
from pi_tmux_matrix.testing.fake_model import FakeModel, Reply, write_pi_agent_dir


def _cli(at: Lab, *words: str, **env: str) -> subprocess.CompletedProcess[str]:
    return at.cli(*words, env=dict(at.env, **env))


def _no_tmux_path(at: Lab) -> str:
    """A PATH with node (pi needs it) and nothing else: no tmux."""
    folder = at.tmp / "bin-without-tmux"
    folder.mkdir(exist_ok=True)
    node = shutil.which("node")
    if node and not (folder / "node").exists():
        (folder / "node").symlink_to(node)
    return str(folder)


def test_status_shows_tmux_the_dispatchers_server_the_callers_session_and_the_matrix(lab: Lab) -> None:
    lab.start_master()
    before = _cli(lab, "status", "--json", "--socket", lab.socket)
    assert before.returncode == 0, before.stderr
    shown = json.loads(before.stdout)
    version = subprocess.run(["tmux", "-V"], capture_output=True, text=True, check=True).stdout.strip()
    assert shown["tmux"]["available"] is True and shown["tmux"]["version"] == version
    assert shown["tmux"]["binary"] == shutil.which("tmux")
    assert shown["tmux"]["serverRunning"] is False and shown["tmux"]["insideTmux"] is False
    assert shown["matrix"]["liveMasters"] == 1 and shown["matrix"]["jobs"] == {}
    subprocess.run(["tmux", "-L", lab.socket, "new-session", "-d", "-s", "ops", "sleep", "600"], check=True)
    pane = subprocess.run(
        ["tmux", "-L", lab.socket, "list-panes", "-t", "=ops:", "-F", "#{pane_id} #{socket_path}"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    fired = lab.fire("HANG for status")
    for agent in fired.job.agents:
        lab.worker(agent.key)
    inside = _cli(lab, "status", "--json", "--socket", lab.socket, TMUX=f"{pane[1]},1,0", TMUX_PANE=pane[0])
    shown = json.loads(inside.stdout)
    assert shown["tmux"]["serverRunning"] is True and "ops" in shown["tmux"]["sessions"]
    assert shown["tmux"]["insideTmux"] is True and shown["tmux"]["currentSession"] == "ops"
    assert shown["matrix"]["liveWorkers"] == 1 and shown["matrix"]["jobs"] == {"running": 1}
    text = _cli(lab, "status", "--socket", lab.socket)
    assert f"tmux: available ({shutil.which('tmux')}, {version})" in text.stdout
    assert (
        "running, " in text.stdout
        and "matrix: 1 live master(s), 1 live worker(s); jobs: 1 running" in text.stdout
    )


def test_setup_help_and_guard_say_what_to_do_with_and_without_tmux(sublab: Lab) -> None:
    helped = _cli(sublab, "setup-help")
    assert helped.returncode == 0 and "tmux is available" in helped.stdout and "fire_task" in helped.stdout
    guard = _cli(sublab, "guard", "--json")
    assert guard.returncode == 0 and json.loads(guard.stdout)["allowed"] is True
    bare = _no_tmux_path(sublab)
    missing = _cli(sublab, "status", "--json", PATH=bare)
    assert missing.returncode == 0 and json.loads(missing.stdout)["tmux"]["available"] is False
    helped = _cli(sublab, "setup-help", PATH=bare)
    assert "tmux is not installed" in helped.stdout and "sudo apt-get install tmux" in helped.stdout
    assert "--backend subprocess" in helped.stdout
    closed = _cli(sublab, "guard", PATH=bare)
    assert closed.returncode == 1 and "The tmux route is unavailable" in closed.stdout
    assert "Traceback" not in closed.stderr
    bad = _cli(sublab, "status", "--socket", "no/such")
    assert bad.returncode == 2 and "--socket: 'no/such' is not a valid id" in bad.stderr


@pytest.mark.real_pi
def test_the_pi_tool_answers_status_setup_help_and_guard(mlab: MLab) -> None:
    at, llm, script = mlab
    script.steps = [
        tool(action="status"),
        tool(action="setup_help"),
        tool(action="guard"),
        lambda _r: Reply(text="done"),
    ]
    done = run_print_master(at, "Is tmux here?")
    assert done.returncode == 0, done.stdout + done.stderr
    status, helped, guard = (last_tool_result(r) for r in llm.requests[1:4])
    shown = json.loads(status)
    assert shown["tmux"]["available"] is True and shown["tmux"]["socket"] == at.socket
    assert shown["matrix"]["liveMasters"] == 1  # this master itself
    assert "tmux is available" in helped and "builder-validator" in helped
    assert guard.startswith("allowed: true") and "diagnostic only" in guard


def _tmux_agents_notice(at: Lab, path: str) -> dict[str, Any]:
    """Run the real pi in rpc mode with the bridge as a master's, type /tmux-agents, and return the
    notice pi shows for it (an extension_ui_request of method notify)."""
    cli = json.dumps([sys.executable, "-m", "pi_tmux_matrix"])
    env = dict(
        at.env, PATH=path, PI_MATRIX_KEY="master-cmd", PI_MATRIX_CLI=cli,
        PI_OFFLINE="1", NO_PROXY="127.0.0.1,localhost", TMPDIR=pi_temp(at.tmp),
    )  # fmt: skip
    pi = subprocess.Popen(
        [pi_bin(), "--mode", "rpc", "--no-session", "--no-extensions", "-e", str(bridge_path())],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=at.work,
    )  # fmt: skip
    assert pi.stdin is not None and pi.stdout is not None
    try:
        pi.stdin.write(json.dumps({"id": "c1", "type": "prompt", "message": "/tmux-agents"}).encode() + b"\n")
        pi.stdin.flush()
        watch = selectors.DefaultSelector()
        watch.register(pi.stdout, selectors.EVENT_READ)
        deadline, buffer = time.monotonic() + 60, b""
        while time.monotonic() < deadline:
            if not watch.select(timeout=1):
                continue
            chunk = os.read(pi.stdout.fileno(), 65536)
            assert chunk, "pi ended before it showed the notice"
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                event = json.loads(line) if line.strip().startswith(b"{") else {}
                if event.get("type") == "extension_ui_request" and event.get("method") == "notify":
                    return event
        raise AssertionError("no notice from /tmux-agents within 60 s")
    finally:
        pi.stdin.close()
        try:
            pi.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pi.kill()
            pi.wait()


@pytest.mark.real_pi
def test_the_tmux_agents_command_in_the_masters_pi_shows_availability_and_guidance(
    sublab: Lab,
) -> None:
    with FakeModel() as llm:
        write_pi_agent_dir(sublab.agent_dir, llm.base_url)
        node = str(Path(shutil.which("node") or "node").parent)
        shown = _tmux_agents_notice(sublab, f"{node}{os.pathsep}{os.environ.get('PATH', '')}")
        assert shown["notifyType"] == "info"
        assert "tmux is available" in shown["message"] and "builder-validator" in shown["message"]
        missing = _tmux_agents_notice(sublab, _no_tmux_path(sublab))
        assert missing["notifyType"] == "warning"
        assert "tmux is not installed" in missing["message"] and "brew install tmux" in missing["message"]
        assert llm.requests == []  # a command, not a turn: the model was never asked
