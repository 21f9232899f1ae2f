"""The examples in examples/ run (issue 6)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tmux_support import require_tmux

import pi_tmux_matrix
from pi_tmux_matrix.dispatch.manager import Dispatcher
from pi_tmux_matrix.dispatch.plugins import plugin_manager
from pi_tmux_matrix.dispatch.profile import parse_profile
from pi_tmux_matrix.dispatch.request import FireRequest
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.settings import load_settings

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_orchestrator_example_fires_a_team_and_reads_its_results_and_handoffs() -> None:
    require_tmux()
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "orchestrator.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count('"kind": "done"') == 2
    assert done.stdout.count("handoff worker-") == 2


def test_the_plugin_package_adds_its_variable_to_every_launch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES / "plugin_package"))
    plugin: Any = importlib.import_module("pi_matrix_team_colour")
    pm = plugin_manager(entry_points=False)
    pm.register(plugin, name="team_colour")
    monkeypatch.setenv("PI_MATRIX_TEAM_COLOUR", "amber")
    store = MatrixStore(tmp_path / "state")
    dispatcher = Dispatcher(store, load_settings(tmp_path), plugins=pm)
    request = FireRequest(
        task="anything",
        profile="stand-in",
        path=str(tmp_path),
        parent_pid=1,
        parent_session="boss",
        dry_run=True,
    )
    (planned,) = dispatcher.fire(request).planned
    assert planned.env["TEAM_COLOUR"] == "amber"
    entry_points = (EXAMPLES / "plugin_package" / "pyproject.toml").read_text()
    assert "[project.entry-points.pi_tmux_matrix]" in entry_points


def test_the_foreign_cli_profile_example_loads_and_passes_the_task_as_one_word() -> None:
    from pi_tmux_matrix.dispatch.providers import agent_command

    path = EXAMPLES / "launch_profiles" / "aider.toml"
    profile = parse_profile(path.read_text(), str(path))
    command = agent_command(profile, task="fix it; rm -rf ~", session_file=None)
    assert command.argv[-2:] == ("--message", "fix it; rm -rf ~")


def _imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, name) of every import in ``path``; name is None for ``import module``."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, None) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            found += [(node.lineno, module, alias.name) for alias in node.names]
    return found


def test_the_examples_import_only_the_public_face_and_the_standard_library() -> None:
    # Examples are what users copy: a deep import there becomes a deep import in their code,
    # which breaks when the submodules move. pi_tmux_matrix.__all__ is the promise.
    sources = sorted(EXAMPLES.rglob("*.py"))
    assert sources
    public = set(pi_tmux_matrix.__all__)
    wrong = []
    for path in sources:
        for line, module, name in _imports(path):
            where = f"{path.relative_to(EXAMPLES)}:{line}"
            if module == "pi_tmux_matrix":
                if name is not None and name not in public:
                    wrong.append(f"{where}: {name} is not in pi_tmux_matrix.__all__")
            elif module.split(".")[0] not in sys.stdlib_module_names:
                wrong.append(f"{where}: imports {module} (use a name from pi_tmux_matrix)")
    assert wrong == []
