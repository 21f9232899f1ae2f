"""The project's own fixtures. The shipped plugin (pi_tmux_matrix/pytest_plugin.py, loaded as the
``pi_tmux_matrix`` entry point) gives ``tmux_server``, ``matrix_state_dir``, ``matrix_settings`` and
``stand_in_agent``; these build on them. The labs themselves, and every other helper the test
modules share, are in the support modules beside this file (no test module imports another)."""

from __future__ import annotations

import compileall
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import pi_support
from forklab import Caller
from helpers import Reaper
from labs import STANDIN_PRINT, Lab
from masterlab import MasterLab
from model_script import Scripted
from pilabs import MLab, PiPair, on_the_fake_model, pi_lab
from tmux_support import kill_tmux_server, require_tmux

from pi_tmux_matrix.contract import ENV_STATE_DIR, NEVER_INHERITED
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.testing.fake_model import FakeModel

if TYPE_CHECKING:
    from pi_tmux_matrix.dispatch.tmux import TmuxServer

# pytest keeps each test module's rewritten bytecode in __pycache__ unless bytecode writing is off
# (CI's machine sets PYTHONDONTWRITEBYTECODE): then each worker of each run rewrote and compiled
# every test module again, 6.2 CPU-s of collection instead of 1.7. The test modules are imported
# after this file (the support modules above get theirs from pytest_configure); the processes the
# tests start still write nothing.
sys.dont_write_bytecode = False


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the package and these support modules once, before any worker starts.

    Python writes no bytecode where ``PYTHONDONTWRITEBYTECODE`` is set (CI's machine sets it), and
    an editable install ships none: every one of the ~2,000 short-lived processes a run starts
    (hosts, masters, CLI calls, the stand-in) then compiled each module it imports again, about
    0.14 CPU-s apiece (docs/testing.md). compileall writes the ``__pycache__`` files whatever that
    setting says; reading them is never turned off, and a source file edited later is compiled
    again (its timestamp no longer matches)."""
    if hasattr(config, "workerinput"):  # an xdist worker: its controller did it
        return
    here = Path(__file__).resolve().parent
    for folder in (here.parent / "pi_tmux_matrix", here):
        compileall.compile_dir(folder, quiet=1)


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
    not: .ci/run's oldest-pi pass selects by the mark). ``any_pi`` only narrows that pass, so it
    means nothing on a test without ``real_pi``: such a test fails."""
    pi_support.RUNNING_MARKED = request.node.get_closest_marker("real_pi") is not None
    if request.node.get_closest_marker("any_pi") is not None and not pi_support.RUNNING_MARKED:
        pytest.fail("marked any_pi but not real_pi (any_pi only leaves real_pi tests out of a pass)")
    try:
        yield
    finally:
        pi_support.RUNNING_MARKED = None


@pytest.fixture(autouse=True, scope="session")
def _pi_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """One compile cache for the pi runs of this worker (``pi_support.pi_temp``)."""
    pi_support.JITI_CACHE = tmp_path_factory.mktemp("jiti-cache")


@pytest.fixture(autouse=True, scope="session")
def _session_tmux_socket() -> Iterator[None]:
    yield
    kill_tmux_server(_SESSION_SOCKET)


@pytest.fixture
def tmux_socket(request: pytest.FixtureRequest) -> str:
    """The socket of the shipped plugin's ``tmux_server`` (private, its server killed when the test
    ends); without tmux a skip, and under CI a failure."""
    require_tmux()
    server: TmuxServer = request.getfixturevalue("tmux_server")
    return server.socket


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A state dir of the test's own, named nowhere in the environment (``matrix_state_dir``, the
    shipped plugin's, is in it)."""
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


# === the labs (labs.py and the labs that subclass it) =============================================
@pytest.fixture
def lab(tmp_path: Path, tmux_socket: str) -> Iterator[Lab]:
    """The Lab: fast settings, a private tmux socket, the dispatcher (``lab.start_master()``)."""
    the_lab = Lab(tmp_path, tmux_socket)
    try:
        yield the_lab
    finally:
        the_lab.cleanup()


@pytest.fixture
def sublab(tmp_path: Path) -> Iterator[Lab]:
    """The Lab without tmux (fire with ``backend="subprocess"``)."""
    the_lab = Lab(tmp_path, "pm-test-unused")
    try:
        yield the_lab
    finally:
        the_lab.cleanup()


@pytest.fixture
def master_lab(
    tmp_path: Path, matrix_state_dir: Path, stand_in_agent: list[str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[MasterLab]:
    """The owner verbs' lab: the shipped plugin's state dir (in the environment, as a user's shell
    would have it) and the stand-in as the default pi."""
    monkeypatch.setenv("PI_MATRIX_PI_COMMAND", json.dumps(stand_in_agent))
    the_lab = MasterLab(tmp_path, matrix_state_dir)
    try:
        yield the_lab
    finally:
        the_lab.cleanup()


@pytest.fixture
def pilab(tmp_path: Path, tmux_socket: str) -> Iterator[PiPair]:
    """A master, the dispatcher, real pi on the fake model; all cleaned up."""
    with pi_lab(tmp_path, tmux_socket) as the_lab:
        yield the_lab, the_lab.llm


@pytest.fixture
def mlab(tmp_path: Path, tmux_socket: str) -> Iterator[MLab]:
    """For a master's own pi: ``pilab`` whose model follows a script (its steps see the previous
    tool result), the lab's socket as the default, and a print-mode stand-in profile."""
    script = Scripted()
    with pi_lab(tmp_path, tmux_socket, script, PI_MATRIX_TMUX_SOCKET=tmux_socket) as the_lab:
        the_lab.profile("standin-print", STANDIN_PRINT)
        yield the_lab, the_lab.llm, script


@pytest.fixture
def caller(tmp_path: Path, tmux_socket: str) -> Iterator[Caller]:
    """A fork's world: the stand-in as pi, a tmux pane that plays the caller."""
    world = Caller(tmp_path, tmux_socket)
    try:
        yield world
    finally:
        world.cleanup()


@pytest.fixture
def picaller(tmp_path: Path, tmux_socket: str) -> Iterator[tuple[Caller, FakeModel]]:
    """``caller`` with the real pi against the fake model."""
    binary = pi_support.pi_bin()
    with FakeModel() as llm:
        world = Caller(tmp_path, tmux_socket)
        try:
            on_the_fake_model(world, llm, binary)
            yield world, llm
        finally:
            world.cleanup()
