"""Issue 32.5: names in their home. Every environment variable name of the product (``PI_*``) and
the default tmux socket are spelled once, in ``contract.py``; every other module imports the
constant. A name spelled twice drifts (``cli/dispatch.py`` once defined its own socket variable),
and a name missing from the contract cannot be checked against it.

Two other homes: ``paths.py`` sits below the contract (layer 1) so that a listing needs neither the
contract nor the settings, and ``contract.py`` re-exports its two names; the stand-in's own knobs
(``STANDIN_*``, a test double's) live in ``testing/standin.py``, not in the production contract.

Run it against another tree to see what it catches: ``python tests/test_names_home.py PATH/pi_tmux_matrix``.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = "pi_tmux_matrix"
ROOT = Path(__file__).resolve().parent.parent / PACKAGE
ENV_NAME = re.compile(r"^(PI_[A-Z0-9_]+|STANDIN_[A-Z0-9_]+)$")
# file -> the names (and the default socket) it may spell: their home.
HOMES: dict[str, re.Pattern[str]] = {
    "contract.py": re.compile(r"^PI_|^pi-matrix$"),
    "paths.py": re.compile(r"^PI_"),
    "testing/standin.py": re.compile(r"^STANDIN_"),
}
DEFAULT_SOCKET = "pi-matrix"


def _exported(tree: ast.Module) -> set[int]:
    """The ids of the string nodes inside ``__all__`` (they name Python attributes, not env)."""
    inside: set[int] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            inside |= {id(sub) for sub in ast.walk(node)}
    return inside


def _spelled(path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, name, text) for every env name spelled in ``path``: a string literal, a keyword
    argument (``dict(PI_X=...)``) or a ``"pi-matrix"`` used as a socket (``x or "pi-matrix"``)."""
    tree = ast.parse(path.read_text(), str(path))
    exported = _exported(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in exported:
            if ENV_NAME.match(node.value):
                yield node.lineno, node.value, repr(node.value)
        elif isinstance(node, ast.keyword) and node.arg and ENV_NAME.match(node.arg):
            yield node.lineno, node.arg, f"{node.arg}= (a keyword)"
        elif isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
            last = node.values[-1]
            if isinstance(last, ast.Constant) and last.value == DEFAULT_SOCKET:
                yield last.lineno, DEFAULT_SOCKET, f'... or "{DEFAULT_SOCKET}" (the default socket)'
        elif (
            isinstance(node, ast.AnnAssign | ast.Assign)
            and isinstance(node.value, ast.Constant)
            and node.value.value == DEFAULT_SOCKET
        ):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and "SOCKET" in t.id for t in targets):
                yield node.lineno, DEFAULT_SOCKET, f'a socket = "{DEFAULT_SOCKET}"'


def strays(root: Path = ROOT) -> list[str]:
    """``file:line: name`` for every env name or default socket spelled outside its home."""
    found = []
    for path in sorted(root.rglob("*.py")):
        home = HOMES.get(path.relative_to(root).as_posix())
        for line, name, text in sorted(set(_spelled(path))):
            if home is None or not home.match(name):
                found.append(f"{PACKAGE}/{path.relative_to(root)}:{line}: {text}")
    return found


def test_env_names_and_the_default_socket_are_spelled_only_in_the_contract() -> None:
    found = strays()
    assert found == [], "import these from their home (pi_tmux_matrix.contract):\n" + "\n".join(found)


def test_the_contract_passes_no_test_only_name() -> None:
    """The production pass-through list holds no stand-in knob (the stand-in is a test double)."""
    from pi_tmux_matrix.contract import PASS_ENV

    assert [name for name in PASS_ENV if name.startswith("STANDIN_")] == []


def test_the_scanner_sees_a_stray_name(tmp_path: Path) -> None:
    """The harness can fail: a planted literal, keyword and socket default are each reported, the
    ``__all__`` entries and the homes are not."""
    package = tmp_path / PACKAGE
    (package / "cli").mkdir(parents=True)
    (package / "testing").mkdir()
    (package / "contract.py").write_text('ENV_X = "PI_MATRIX_X"\nDEFAULT_SOCKET = "pi-matrix"\n')
    (package / "testing" / "standin.py").write_text('A = "STANDIN_STEPS"\nB = "PI_MATRIX_KEY"\n')
    (package / "cli" / "x.py").write_text(
        '__all__ = ["PI_ONLY_FIELDS"]\nPI_ONLY_FIELDS = 1\n'
        'a = env.get("PI_MATRIX_KEY")\nb = dict(STANDIN_STEPS="2")\nc = s or "pi-matrix"\n'
        'DEFAULT_SOCKET = "pi-matrix"\n'
    )
    assert strays(package) == [
        f"{PACKAGE}/cli/x.py:3: 'PI_MATRIX_KEY'",
        f"{PACKAGE}/cli/x.py:4: STANDIN_STEPS= (a keyword)",
        f'{PACKAGE}/cli/x.py:5: ... or "pi-matrix" (the default socket)',
        f'{PACKAGE}/cli/x.py:6: a socket = "pi-matrix"',
        f"{PACKAGE}/testing/standin.py:2: 'PI_MATRIX_KEY'",
    ]


if __name__ == "__main__":
    print("\n".join(strays(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)) or "no strays")
