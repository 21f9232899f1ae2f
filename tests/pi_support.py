"""Finding the real pi for the tests: ``$PI_MATRIX_PI_BIN``, else the project's ``.pi-cli/``.

Missing pi or node is a loud skip locally (with how to fix it) and a hard failure under CI.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# scripts/install-pi's wrapper: pi on the node it needs (node 22 from .pi-cli/ when the system's is older).
DEFAULT_PI = ROOT / ".pi-cli" / "bin" / "pi"


def pi_bin() -> str:
    """The path of the pinned pi binary, or skip (fail under ``CI=true``) saying why."""
    configured = os.environ.get("PI_MATRIX_PI_BIN")
    path = Path(configured) if configured else DEFAULT_PI
    problem = None
    if shutil.which("node") is None:
        problem = "node is not installed (pi needs Node.js; run 'bash scripts/install-pi')"
    elif not os.access(path, os.X_OK):
        problem = f"no pi at {path}; run 'bash scripts/install-pi' or set PI_MATRIX_PI_BIN"
    if problem is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"real pi unavailable in CI: {problem}")
        pytest.skip(f"real pi unavailable: {problem}")
    return str(path)
