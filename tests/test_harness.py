"""One test harness (issue 32.11): no test module imports another, and the support modules the
tests share (labs.py, waiting.py, helpers.py and the rest beside conftest.py) import no test
module either. A shared helper lives in a support module; a shared fixture in conftest.py (or the
shipped plugin, pi_tmux_matrix/pytest_plugin.py), used by name."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _is_test_module(name: str) -> bool:
    top = name.split(".", maxsplit=1)[0]
    return top.startswith("test_") or top == "conftest"


def imports_of_tests(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import of a test module (``test_*`` or ``conftest``) in ``path``,
    wherever it stands (at the top, in a function, under ``TYPE_CHECKING``)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and not node.level and _is_test_module(node.module or ""):
            yield node.lineno, node.module or ""
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if _is_test_module(a.name))


def violations(folder: Path = TESTS) -> list[str]:
    return [
        f"{path.name}:{line}: imports {module}"
        for path in sorted(folder.glob("*.py"))
        for line, module in imports_of_tests(path)
    ]


def test_no_test_module_imports_another() -> None:
    problems = violations()
    assert problems == [], (
        "move what is shared into a support module (not test_*.py), or a fixture into conftest.py:\n"
        + "\n".join(problems)
    )


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The harness can fail: each way of importing a test module is reported, nothing else is."""
    (tmp_path / "test_a.py").write_text(
        "import os\nfrom helpers import make_entry\nfrom test_b import Lab\n"
        "import test_c as c\n\ndef f():\n    from conftest import require_tmux\n"
    )
    (tmp_path / "labs.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    import test_d\n")
    (tmp_path / "test_e.py").write_text("from . import x\nfrom testing import y\nimport tests_f\n")
    assert violations(tmp_path) == [
        "labs.py:3: imports test_d",
        "test_a.py:3: imports test_b",
        "test_a.py:4: imports test_c",
        "test_a.py:7: imports conftest",
    ]
