from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from pi_tmux_matrix.matrix.store import MatrixStore


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own HOME and agent dir; a developer's ~/.pi never leaks in."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(home / ".pi" / "agent"))
    for name in (
        "PI_MATRIX_STATE_DIR",
        "PI_PARENT_PID",
        "PI_PARENT_SESSION",
        "PI_ORCHESTRATION_AGENT_ID",
        "PI_TASK_REF",
        "PI_WORKER_ALLOWED_PATHS",
        "PI_WORKTREE_LANE",
    ):
        monkeypatch.delenv(name, raising=False)
    return home


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "process-matrix"


@pytest.fixture
def store(state_dir: Path) -> MatrixStore:
    return MatrixStore(state_dir)
