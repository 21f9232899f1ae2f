"""The tmux dispatcher: launch profiles, lanes, tmux, jobs and completion watching.

The backend names live here, in the package itself, so the CLI can offer them as choices
without importing the dispatcher (every ``pi-matrix`` start builds the whole parser).
"""

from __future__ import annotations

from typing import Final

__all__ = ["BACKEND_NAMES", "SUBPROCESS", "TMUX"]

TMUX: Final = "tmux"
SUBPROCESS: Final = "subprocess"
BACKEND_NAMES: Final = (TMUX, SUBPROCESS)
