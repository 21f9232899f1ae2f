"""Where state is written (issue 17, cases 10, 16 and 18): settled once, by the process that was
asked. A relative ``--state-dir`` is made absolute for every process it starts (they run
elsewhere), an empty one is refused (never the default), and with ``processMatrix.enabled: false``
every verb that would write refuses, naming the setting, and leaves no state dir behind.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from labs import Lab


def test_10_a_relative_state_dir_is_made_absolute_once_for_every_process(sublab: Lab, tmp_path: Path) -> None:
    master = sublab.start_master()
    other = tmp_path / "other"
    other.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", "relstate", "fire", "--dry-run", "--json",
         "--profile", "stand-in", "--path", str(other), "--parent-pid", str(master.pid),
         "--parent-session", "boss", "--", "HANG"],
        capture_output=True, text=True, env=sublab.env, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (planned,) = json.loads(done.stdout)["agents"]
    argv = planned["argv"]
    assert argv[argv.index("--state-dir") + 1] == str(tmp_path / "relstate")
    assert planned["env"]["PI_MATRIX_STATE_DIR"] == str(tmp_path / "relstate")


def test_16_the_off_switch_forbids_every_write(tmp_path: Path) -> None:
    """With ``processMatrix.enabled: false``, ``runs``, ``fork``, ``adopt`` and ``cleanup`` refuse
    (exit 2, naming the setting) and leave no state dir, lock or entry behind."""
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / "settings.json").write_text(json.dumps({"processMatrix": {"enabled": False}}))
    state = tmp_path / "state"
    env = {**os.environ, "PI_CODING_AGENT_DIR": str(agent), "PI_MATRIX_STATE_DIR": str(state)}
    for words in (
        ("runs",), ("runs", "run-x"), ("adopt", "worker-w1"), ("cleanup", "worker-w1"),
        ("fork", "--session", str(tmp_path / "s.jsonl"), "--", "task"),
    ):  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-m", "pi_tmux_matrix", *words],
            capture_output=True, text=True, timeout=60, check=False, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert done.returncode == 2, (words, done.stdout, done.stderr)
        assert "processMatrix.enabled" in done.stderr and "Traceback" not in done.stderr
        assert not state.exists(), f"{words} wrote the state dir"


def test_18_an_empty_state_dir_is_refused(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "--state-dir", "", "ls"],
        capture_output=True, text=True, timeout=60, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--state-dir is empty" in done.stderr
