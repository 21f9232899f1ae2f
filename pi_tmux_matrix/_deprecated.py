"""Old import paths kept for one release after a module moved.

An alias module calls :func:`alias` with its own name and the module's new home: importing the old
path then hands out the very same module object (so a monkeypatch or an ``isinstance`` through
either path sees one thing) and warns once with the new path.
"""

from __future__ import annotations

import sys
import warnings
from types import ModuleType

__all__ = ["alias"]


def alias(old: str, new: ModuleType, *, until: str = "0.2") -> None:
    """Make ``old`` name ``new`` in ``sys.modules``, with a DeprecationWarning naming the new path."""
    warnings.warn(
        f"{old} moved to {new.__name__}; the old path is removed in {until}",
        DeprecationWarning,
        stacklevel=3,
    )
    sys.modules[old] = new
