"""How many tmux calls a launch costs, against a real tmux behind a recording ``tmux`` on PATH:
the scrub, the new window, its remain-on-exit and its tags go in one call (``;``-separated), and
a window name the commands after ``new-window`` cannot name alone falls back to the pane's ids."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from labs import Lab

from pi_tmux_matrix.dispatch.tmux import Pane, TmuxServer

pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None, reason="tmux is not installed (these tests drive a real tmux)"
)

TAGS = {"@pi_matrix_key": "worker-one", "@pi_matrix_job": "job-1"}


def recording_tmux(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ``tmux`` first on PATH that appends its argv to a log and execs the real tmux."""
    real = shutil.which("tmux")
    bin_dir = tmp_path / "rec-bin"
    bin_dir.mkdir()
    log = tmp_path / "tmux-calls.jsonl"
    script = bin_dir / "tmux"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        f"with open({str(log)!r}, 'a') as f:\n"
        "    f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"os.execv({real!r}, [{real!r}, *sys.argv[1:]])\n"
    )
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def options(socket: str, *args: str) -> str:
    done = subprocess.run(
        ["tmux", "-L", socket, "show-options", *args], capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout


def launch(server: TmuxServer, tmp_path: Path, window_name: str, tags: dict[str, str]) -> Pane:
    return server.launch(
        [sys.executable, "-c", "import time; time.sleep(60)"], session="pm", window_name=window_name,
        cwd=str(tmp_path), env={"PM_TEST_A": "1"}, tags=tags,
    )  # fmt: skip


def test_a_launch_into_a_running_session_is_one_tmux_call_that_configures_and_tags_its_pane(
    tmux_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = TmuxServer(tmux_socket, scrub_env=["PM_TEST_SECRET"])
    launch(server, tmp_path, "first", {"@pi_matrix_key": "worker-zero"})  # starts the server
    # A tmux.conf may keep dead panes: the launch turns it off for its own window.
    subprocess.run(
        ["tmux", "-L", tmux_socket, "set-option", "-g", "remain-on-exit", "on"], check=True, timeout=10
    )
    log = recording_tmux(tmp_path, monkeypatch)
    pane = launch(server, tmp_path, "agent-1", TAGS)
    assert len(calls(log)) == 1, calls(log)
    (call,) = calls(log)
    assert "new-window" in call and "set-environment" in call and "set-option" in call
    shown = options(tmux_socket, "-p", "-t", pane.pane_id)
    assert "@pi_matrix_key worker-one" in shown and "@pi_matrix_job job-1" in shown
    assert "@pi_matrix_tags" in shown
    assert "remain-on-exit off" in options(tmux_socket, "-w", "-t", pane.window_id)
    assert pane.tags == tuple(sorted(TAGS.items()))


@pytest.mark.parametrize("name", ["agent", "agent.v2", "a:b"])
def test_a_window_name_the_call_cannot_name_alone_still_tags_the_new_pane_and_only_it(
    tmux_socket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """The same name twice in a session (or one with '.' or ':', which a target would split):
    the window is made once and tagged by its pane id; the older window keeps its own tags."""
    server = TmuxServer(tmux_socket)
    first = launch(server, tmp_path, name, {"@pi_matrix_key": "worker-zero"})
    log = recording_tmux(tmp_path, monkeypatch)
    second = launch(server, tmp_path, name, TAGS)
    assert sum("new-window" in call for call in calls(log)) == 1
    assert len(calls(log)) <= 2
    assert "@pi_matrix_key worker-one" in options(tmux_socket, "-p", "-t", second.pane_id)
    assert "@pi_matrix_key worker-zero" in options(tmux_socket, "-p", "-t", first.pane_id)
    panes = TmuxServer(tmux_socket).panes()
    assert len(panes) == 2 and {p.window_name for p in panes} == {name}


def test_a_fire_into_a_running_tmux_server_costs_two_tmux_calls_and_its_pane_is_tagged(
    lab: Lab,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The launch (one call, the fire's only one: it waits on no host's start) and the host's own
    pipe-pane (the host watches its rounds): a fire used to cost four (scrub, new-window, tags,
    pipe-pane)."""
    lab.start_master()
    first = lab.fire("HANG one")  # starts the server and its session
    lab.worker(first.job.agents[0].key)  # its host's own calls (its pane's pipe) are made by now
    log = recording_tmux(lab.tmp, monkeypatch)
    fired = lab.fire("HANG two")
    (agent,) = fired.job.agents
    by_fire = [call for call in calls(log) if "pipe-pane" not in call]  # the host's may come first
    assert len(by_fire) == 1 and "new-window" in by_fire[0], by_fire
    assert agent.pane_id is not None and agent.pane_id != first.job.agents[0].pane_id
    shown = options(lab.socket, "-p", "-t", agent.pane_id)
    assert f"@pi_matrix_key {agent.key}" in shown and f"@pi_matrix_job {fired.job.id}" in shown
    lab.worker(agent.key)  # the host pipes its pane before it starts its agent
    made = [call for call in calls(log) if "show-options" not in call]  # not this test's own look
    assert [sum(word in call for call in made) for word in ("new-window", "pipe-pane")] == [1, 1], made
    assert len(made) == 2, made
