from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import pi_support
from helpers import Reaper

from pi_tmux_matrix.contract import ENV_STATE_DIR, NEVER_INHERITED
from pi_tmux_matrix.matrix.store import MatrixStore


@pytest.fixture(autouse=True)
def isolated_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own HOME and agent dir; a developer's ~/.pi never leaks in."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(home / ".pi" / "agent"))
    for name in (ENV_STATE_DIR, *NEVER_INHERITED):
        monkeypatch.delenv(name, raising=False)
    # Anything that falls back to the default tmux socket lands on this run's private one.
    monkeypatch.setenv("PI_MATRIX_TMUX_SOCKET", _SESSION_SOCKET)
    return home


_SESSION_SOCKET = f"pm-test-{os.getpid()}"


@pytest.fixture(autouse=True)
def _real_pi_mark(request: pytest.FixtureRequest) -> Iterator[None]:
    """Tell ``pi_support.pi_bin`` whether this test is marked ``real_pi`` (it fails one that is
    not: .ci/run's oldest-pi pass selects by the mark)."""
    pi_support.RUNNING_MARKED = request.node.get_closest_marker("real_pi") is not None
    try:
        yield
    finally:
        pi_support.RUNNING_MARKED = None


def kill_tmux_server(socket: str) -> None:
    """Kill the tmux server on ``socket`` (one this test run started; never anyone else's)."""
    if shutil.which("tmux") is None:
        return
    from pi_tmux_matrix.dispatch.tmux import TmuxServer

    TmuxServer(socket).kill_server()  # also removes the socket file tmux leaves behind


@pytest.fixture(autouse=True, scope="session")
def _session_tmux_socket() -> Iterator[None]:
    yield
    kill_tmux_server(_SESSION_SOCKET)


def require_tmux() -> None:
    """Skip locally, fail under CI: the dispatcher's tests need a real tmux."""
    if shutil.which("tmux") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("tmux is not installed; CI must have tmux for the dispatcher tests")
        pytest.skip("tmux is not installed (the dispatcher tests need a real tmux)")


@pytest.fixture
def tmux_socket(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique private tmux socket; its server is killed when the test ends."""
    require_tmux()
    socket = f"pm-test-{os.getpid()}-{abs(hash(request.node.nodeid)) % 10**8}"
    yield socket
    kill_tmux_server(socket)


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path / "state" / "process-matrix"


@pytest.fixture
def store(state_dir: Path) -> MatrixStore:
    return MatrixStore(state_dir)


@pytest.fixture
def reaper() -> Iterator[Reaper]:
    """Every process a test starts, killed by pid (identity-checked) at teardown."""
    tracked = Reaper()
    try:
        yield tracked
    finally:
        tracked.cleanup()


@pytest.fixture
def git_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A committer identity, no system config, and no repository above tmp_path."""
    for key in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{key}_NAME", "Lane Test")
        monkeypatch.setenv(f"GIT_{key}_EMAIL", "lane@example.invalid")
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    for name in ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE"):
        monkeypatch.delenv(name, raising=False)
