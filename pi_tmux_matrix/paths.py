"""Where the agent dir and the state dir are: importable without loading the settings.

A listing of an empty state dir (a person's first ``pi-matrix ls``) needs only this, not the
settings' attrs classes; :mod:`.settings` re-exports both functions.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from .errors import StateDirError

__all__ = ["ENV_AGENT_DIR", "ENV_STATE_DIR", "agent_dir", "resolve_state_dir"]

ENV_AGENT_DIR: Final = "PI_CODING_AGENT_DIR"
ENV_STATE_DIR: Final = "PI_MATRIX_STATE_DIR"


def agent_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$PI_CODING_AGENT_DIR``, else ``~/.pi/agent`` (pi's own convention)."""
    source = os.environ if env is None else env
    value = source.get(ENV_AGENT_DIR)
    if value:
        return Path(value).expanduser()
    home = source.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".pi" / "agent"


def resolve_state_dir(cli_value: str | None = None, env: Mapping[str, str] | None = None) -> Path:
    """``--state-dir``, else ``$PI_MATRIX_STATE_DIR``, else ``<agent dir>/state/process-matrix``."""
    source = os.environ if env is None else env
    # Made absolute once, here: hosts and watchers start in other folders (--path, lanes), and a
    # relative state dir would silently be a second matrix there.
    if cli_value is not None:
        if not cli_value.strip():
            raise StateDirError("--state-dir is empty; name a folder, or leave the flag out for the default")
        return Path(os.path.abspath(os.path.expanduser(cli_value)))
    if source.get(ENV_STATE_DIR):
        return Path(os.path.abspath(os.path.expanduser(source[ENV_STATE_DIR])))
    return agent_dir(source) / "state" / "process-matrix"
