"""The pi bridge extension (``bridge.ts``), shipped as package data and loaded with ``pi -e``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["bridge_path"]


def bridge_path() -> Path:
    """The installed ``bridge.ts`` (a real file: pi loads it by path).

    Beside this module, not through ``importlib.resources``: every host asks for it, and that
    import costs each of them ~2 MiB (docs/decisions.md#a-host-loads-only-what-it-uses), for a
    path a zipped install could not give pi anyway."""
    return Path(__file__).with_name("bridge.ts")
