"""The stand-in agent's old path, kept because launch profiles name it:
``python -m pi_tmux_matrix.standin`` runs :mod:`pi_tmux_matrix.testing.standin`, and importing
this path hands out that very module."""

from __future__ import annotations

import sys

from .testing import standin as _moved
from .testing.standin import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
sys.modules[__name__] = _moved
