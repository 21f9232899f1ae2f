"""The ``pi-matrix`` command line. Only this package prints or chooses exit codes."""

from __future__ import annotations

from .app import main, run

__all__ = ["main", "run"]
