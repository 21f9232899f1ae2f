"""The fixtures users get from ``pi_tmux_matrix.pytest_plugin`` (loaded through ``pytest11``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.settings import load_settings


def test_the_state_dir_and_settings_fixtures_isolate_a_matrix(
    matrix_state_dir: Path, matrix_settings: Any, stand_in_agent: list[str], tmp_path: Path
) -> None:
    assert os.environ["PI_MATRIX_STATE_DIR"] == str(matrix_state_dir)
    assert "PI_PARENT_PID" not in os.environ
    settings = load_settings(tmp_path)
    assert (settings.heartbeat_ms, settings.watcher_poll_ms, settings.adoption_grace_ms) == (1000, 1000, 5000)
    matrix_settings.set(maxConcurrentAgents=5)
    assert json.loads(matrix_settings.path.read_text())["processMatrix"]["maxConcurrentAgents"] == 5

    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "host", "--mode", "print", "--session-id", "fx1",
         "--", *stand_in_agent, "-p", "quick task"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (entry,) = MatrixStore(matrix_state_dir).list().entries
    assert entry.key == "master-fx1" and entry.exit is not None and entry.exit.code == 0


def test_the_tmux_server_fixture_is_private_and_runs_argv(tmux_server: Any, tmp_path: Path) -> None:
    out = tmp_path / "ran"
    pane = tmux_server.launch(
        [sys.executable, "-c", f"open({str(out)!r}, 'w').write('yes'); import time; time.sleep(30)"],
        session="fx", window_name="fx", cwd=str(tmp_path), env={}, tags={},
    )  # fmt: skip
    assert tmux_server.socket.startswith("pm-pytest-")
    import time

    deadline = time.monotonic() + 10
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out.read_text() == "yes"
    assert tmux_server.pane(pane.pane_id) is not None
