"""The bridge typed and tested (issue 32.10), from the README's one test command:

* ``tsc --noEmit -p pi_tmux_matrix/bridge/tsconfig.json``: the bridge type-checks (strict) against
  its own small declaration of pi's API (bridge/pi-api.d.ts) and node's types (tsc and
  @types/node, pinned, from ``bash scripts/install-ts`` in .ts-cli/);
* ``node --test tests/bridge/*.test.ts``: the unit tests of the envelope's path logic, the tool
  words, delivery, the one truncation, the one usage sum and the debug line, on node 22.18+ (its
  own type stripping runs the .ts files; ``bash scripts/install-pi`` brings node 22 into .pi-cli/
  when the system's is older).

Either tool missing is a loud skip locally (saying how to get it) and a failure under ``CI=true``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TSCONFIG = ROOT / "pi_tmux_matrix" / "bridge" / "tsconfig.json"
TSC = ROOT / ".ts-cli" / "node_modules" / "typescript" / "bin" / "tsc"
UNIT_TESTS = sorted((ROOT / "tests" / "bridge").glob("*.test.ts"))
# node's type stripping is on by default from 22.18 (no flag, no warning).
STRIPS_TYPES = (22, 18)


def _unavailable(problem: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"unavailable in CI: {problem}")
    pytest.skip(f"unavailable: {problem}")


def _version(node: str) -> tuple[int, int]:
    try:
        done = subprocess.run([node, "--version"], check=False, capture_output=True, text=True, timeout=30)
        out = done.stdout
    except OSError:
        return (0, 0)
    match = re.match(r"v(\d+)\.(\d+)", out.strip())
    return (int(match.group(1)), int(match.group(2))) if match else (0, 0)


def _nodes() -> list[str]:
    """The nodes to try: the system's first, then install-pi's node 22 beside the pi the tests run
    (``$PI_MATRIX_PI_BIN``'s folder, else .pi-cli/)."""
    found = [shutil.which("node") or ""]
    configured = os.environ.get("PI_MATRIX_PI_BIN")
    if configured:
        found.append(str(Path(configured).parent.parent / "node_modules" / ".bin" / "node"))
    found.append(str(ROOT / ".pi-cli" / "node_modules" / ".bin" / "node"))
    return [node for node in found if node and os.access(node, os.X_OK)]


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{what} failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr}"


def test_the_bridge_type_checks() -> None:
    if not TSC.exists():
        _unavailable(f"no tsc at {TSC.relative_to(ROOT)}: run 'bash scripts/install-ts'")
    nodes = _nodes()
    if not nodes:
        _unavailable("no node to run tsc on (install Node.js, or run 'bash scripts/install-pi')")
    _run([nodes[0], str(TSC), "--noEmit", "-p", str(TSCONFIG)], "tsc --noEmit -p bridge/tsconfig.json")


def test_the_bridge_unit_tests_pass_on_node() -> None:
    assert UNIT_TESTS, "no tests/bridge/*.test.ts"
    node = next((n for n in _nodes() if _version(n) >= STRIPS_TYPES), None)
    if node is None:
        _unavailable(
            "no node 22.18+ (its type stripping runs the bridge's .ts unit tests): run "
            "'bash scripts/install-pi', which puts node 22 in .pi-cli/ when the system's is older"
        )
    assert node is not None
    files = [str(p.relative_to(ROOT)) for p in UNIT_TESTS]
    _run([node, "--test", *files], "node --test tests/bridge/*.test.ts")
