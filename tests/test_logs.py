"""``pi-matrix logs KEY [-f] [-n N]`` (issue 31.2): an agent's recent output, from its pane
(tmux), its log (detached) or its conversation (no output of its own kept), bounded, and every
control character shown as ``cat -v`` does (an agent's bytes never drive the reader's terminal).

A real headless master, stand-in workers on a private tmux server and detached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import attrs
from helpers import make_entry, make_identity
from labs import Lab
from waiting import wait_for

from pi_tmux_matrix.matrix.store import MatrixStore

PI_MATRIX = [sys.executable, "-m", "pi_tmux_matrix"]


def _logs(lab: Lab, *words: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*PI_MATRIX, "logs", *words], cwd=lab.work, env=lab.env, capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def _working(lab: Lab, key: str) -> subprocess.CompletedProcess[str] | None:
    done = _logs(lab, key)
    return done if done.returncode == 0 and "working on" in done.stdout else None


def test_a_tmux_agents_logs_are_its_panes_last_lines(lab: Lab) -> None:
    lab.start_master()
    (agent,) = lab.fire("HANG in a pane").job.agents
    lab.worker(agent.key)
    shown = wait_for("the pane's line", lambda: _working(lab, agent.key))
    assert "stand-in: working on: HANG in a pane" in shown.stdout
    assert len(_logs(lab, agent.key, "-n", "1").stdout.splitlines()) == 1
    bad = _logs(lab, agent.key, "-n", "0")
    assert bad.returncode == 2 and "-n" in bad.stderr


def test_a_detached_agents_log_is_shown_escaped_and_followed_until_it_ends(lab: Lab) -> None:
    lab.start_master()
    hostile = "HANG \x1b]2;pwned\x07 \x1b[2J cleared"
    (agent,) = lab.fire(hostile, backend="subprocess").job.agents
    entry = lab.worker(agent.key)
    shown = wait_for("the log's line", lambda: _working(lab, agent.key))
    assert "^[]2;pwned^G ^[[2J cleared" in shown.stdout, shown.stdout
    assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
    follow = subprocess.Popen(
        [*PI_MATRIX, "logs", agent.key, "-f"], cwd=lab.work, env=lab.env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stop = subprocess.run(
            [*PI_MATRIX, "stop", agent.key, "--confirm", "yes-tmux-stop"], cwd=lab.work, env=lab.env,
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert stop.returncode == 0, stop.stderr
        out, _err = follow.communicate(timeout=60)
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait(10)
    assert follow.returncode == 0
    assert out.rstrip().endswith(f"-- {agent.key} ended"), out
    assert entry.process is not None


def test_an_agent_with_no_pane_and_no_log_shows_its_conversation(tmp_path: Path) -> None:
    store = MatrixStore(tmp_path / "state")
    session = tmp_path / "s.jsonl"
    lines = [
        {"type": "session", "id": "s1", "cwd": str(tmp_path)},
        {"type": "message", "message": {"role": "user", "content": "hello \x1b[31mred"}},
        {
            "type": "message",
            "message": {"role": "assistant", "content": [{"type": "text", "text": "hi\nthere"}]},
        },
    ]
    session.write_text("".join(json.dumps(line) + "\n" for line in lines))
    identity = attrs.evolve(make_identity("s1"), session_file=str(session))
    store.register(make_entry("s1", identity=identity))
    done = subprocess.run(
        [*PI_MATRIX, "--state-dir", str(store.root), "logs", "worker-s1"], capture_output=True, text=True,
        timeout=30, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["user: hello ^[[31mred", "assistant: hi", "assistant: there"]

