"""The public face: ``pi_tmux_matrix`` re-exports what plugins and orchestrators need, cheaply."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pi_tmux_matrix
from pi_tmux_matrix import errors

INIT = Path(pi_tmux_matrix.__file__)


def test_every_public_name_resolves_to_the_object_it_names() -> None:
    for name in pi_tmux_matrix.__all__:
        assert getattr(pi_tmux_matrix, name) is not None, name
    for name, target in pi_tmux_matrix._LAZY.items():
        module_name, _, attribute = target.partition(":")
        module = importlib.import_module(module_name, pi_tmux_matrix.__name__)
        assert getattr(pi_tmux_matrix, name) is getattr(module, attribute or name), name
    assert set(pi_tmux_matrix._LAZY) <= set(pi_tmux_matrix.__all__)
    assert set(pi_tmux_matrix.__all__) <= set(dir(pi_tmux_matrix))


def test_the_lazy_table_names_each_names_home() -> None:
    """Issue 32.7: the table names the module a class or function is defined in, never a module
    that re-exports it (those re-exports are gone)."""
    for name, target in pi_tmux_matrix._LAZY.items():
        module_name = target.partition(":")[0]
        value = getattr(pi_tmux_matrix, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            home = importlib.import_module(module_name, pi_tmux_matrix.__name__).__name__
            assert value.__module__ == home, f"{name}: {target} re-exports it from {value.__module__}"


def test_every_error_class_is_public() -> None:
    classes = {name for name, value in vars(errors).items() if inspect.isclass(value)}
    classes = {name for name in classes if issubclass(getattr(errors, name), BaseException)}
    assert "PiMatrixError" in classes
    assert classes <= set(pi_tmux_matrix.__all__)
    for name in classes:
        assert getattr(pi_tmux_matrix, name) is getattr(errors, name)


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    assert not hasattr(pi_tmux_matrix, "NoSuchThing")


def test_the_type_checking_imports_mirror_the_lazy_mapping() -> None:
    # They are never executed, so only this (and mypy) notices one left behind by a move.
    tree = ast.parse(INIT.read_text())
    (block,) = (
        node
        for node in tree.body
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
    )
    seen: dict[str, str] = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        for alias in node.names:
            module = "." * node.level + (node.module or "")
            public = alias.asname or alias.name
            seen[public] = module if alias.asname is None else f"{module}:{alias.name}"
    assert seen == pi_tmux_matrix._LAZY


def test_importing_the_package_leaves_the_dispatcher_and_pluggy_unloaded() -> None:
    code = "import json, sys, pi_tmux_matrix; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = set(json.loads(done.stdout))
    assert "pi_tmux_matrix" in loaded
    assert "pluggy" not in loaded
    assert "pi_tmux_matrix.dispatch.manager" not in loaded
    assert not {name for name in loaded if name.startswith("pi_tmux_matrix.dispatch")}
