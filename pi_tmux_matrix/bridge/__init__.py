"""The pi bridge extension (``bridge.ts``), shipped as package data and loaded with ``pi -e``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["bridge_path"]


def bridge_path() -> Path:
    """The installed ``bridge.ts`` (a real file: pi loads it by path)."""
    return Path(str(resources.files(__name__) / "bridge.ts"))
