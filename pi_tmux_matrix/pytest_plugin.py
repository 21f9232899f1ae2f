"""pytest fixtures for people who test their own orchestrators against pi-matrix.

Installed with the package (entry point ``pytest11``), so they are there in any test suite that
has pi_tmux_matrix installed:

* ``matrix_state_dir`` — a private state dir (and agent dir) for the test, set in the
  environment (``PI_MATRIX_STATE_DIR``, ``PI_CODING_AGENT_DIR``); the launch contract variables of
  the surrounding shell are removed, so nothing leaks in.
* ``matrix_settings`` — writes ``processMatrix`` settings into that agent dir; starts at the
  fastest legal timings (heartbeat and watcher poll 1 s, adoption grace 5 s).
* ``tmux_server`` — a tmux server on a private socket (``tmux -L <unique>``), killed at the end.
* ``stand_in_agent`` — the argv prefix of the bundled stand-in agent (no LLM needed).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from .contract import ENV_AGENT_DIR, ENV_STATE_DIR, NEVER_INHERITED

if TYPE_CHECKING:
    from .dispatch.tmux import TmuxServer

__all__ = ["MatrixSettingsFile", "matrix_settings", "matrix_state_dir", "stand_in_agent", "tmux_server"]

FAST: dict[str, Any] = {"heartbeatMs": 1000, "watcherPollMs": 1000, "adoptionGraceMs": 5000}


@pytest.fixture
def matrix_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``<tmp>/pi-matrix/state``: the test's own matrix (created by the first write)."""
    root = tmp_path / "pi-matrix"
    agent = root / "agent"
    agent.mkdir(parents=True)
    state = root / "state"
    monkeypatch.setenv(ENV_STATE_DIR, str(state))
    monkeypatch.setenv(ENV_AGENT_DIR, str(agent))
    for name in sorted(NEVER_INHERITED):
        monkeypatch.delenv(name, raising=False)
    return state


class MatrixSettingsFile:
    """``processMatrix`` in the test's agent dir ``settings.json``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.values: dict[str, Any] = {}

    def set(self, **values: object) -> MatrixSettingsFile:
        """Merge ``values`` (camelCase, as in the file) and write the file."""
        self.values.update(values)
        document: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}
        document["processMatrix"] = dict(self.values)
        self.path.write_text(json.dumps(document, indent=2))
        return self


@pytest.fixture
def matrix_settings(matrix_state_dir: Path) -> MatrixSettingsFile:
    """The agent dir's settings, at the fastest legal timings to start with."""
    return MatrixSettingsFile(Path(os.environ[ENV_AGENT_DIR]) / "settings.json").set(**FAST)


@pytest.fixture
def tmux_server() -> Iterator[TmuxServer]:
    """A :class:`~pi_tmux_matrix.dispatch.tmux.TmuxServer` on a private socket, killed after."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    from pi_tmux_matrix.dispatch.tmux import TmuxServer

    server = TmuxServer(f"pm-pytest-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        yield server
    finally:
        server.kill_server()


@pytest.fixture
def stand_in_agent() -> list[str]:
    """``[python, -m, pi_tmux_matrix.testing.standin]``: add ``-p`` and a task (``HANG``/``FAIL``/``BLOCKED``
    in the task change how it ends)."""
    return [sys.executable, "-m", "pi_tmux_matrix.testing.standin"]
