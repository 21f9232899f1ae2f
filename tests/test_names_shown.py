"""Names a person can tell apart (issue 31.3): ``tree``, ``ls`` and ``top`` show each worker's
name (its agent id) and what it was asked (its task text), not ``worker-<uuid>`` with the same
goal ref on every row; ``show`` says the task and where the agent is (a command to paste).

A real headless master and two stand-in workers of one goal in a private tmux server."""

from __future__ import annotations

import subprocess
import sys

from labs import Lab

PI_MATRIX = [sys.executable, "-m", "pi_tmux_matrix"]


def _run(lab: Lab, *words: str) -> str:
    done = subprocess.run(
        [*PI_MATRIX, *words], cwd=lab.work, env=dict(lab.env, COLUMNS="200"), capture_output=True,
        text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_views_name_each_worker_and_its_task(lab: Lab) -> None:
    lab.start_master()
    fired = {}
    for task in ("HANG review the parser", "HANG write the docs"):
        (agent,) = lab.fire(task, goal_id="goal-7").job.agents
        lab.worker(agent.key)
        fired[agent.key] = (agent.agent_id, task)
    for verb in (["ls"], ["tree"], ["top", "--once"]):
        out = _run(lab, *verb)
        header = next(line for line in out.splitlines() if line.startswith("KEY"))
        assert "NAME" in header, (verb, header)
        for key, (name, task) in fired.items():
            (row,) = [line for line in out.splitlines() if key in line]
            assert name in row and task in row, (verb, row)
    key, (name, task) = next(iter(fired.items()))
    shown = _run(lab, "show", key)
    assert f"task         goal-7: {task}" in shown, shown
    assert f"place        tmux -L {lab.socket} attach -t pi-matrix:" in shown, shown
