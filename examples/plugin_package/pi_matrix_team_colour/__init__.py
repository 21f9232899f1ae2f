"""Example dispatcher plugin: every launched agent gets ``TEAM_COLOUR`` (from the launcher's own
``PI_MATRIX_TEAM_COLOUR``, default ``teal``) and its lane as ``TEAM_LANE``."""

from __future__ import annotations

import os
from typing import Any

from pi_tmux_matrix.dispatch.hookspecs import hookimpl


@hookimpl
def launch_env(launch: Any) -> dict[str, str]:
    env = {"TEAM_COLOUR": os.environ.get("PI_MATRIX_TEAM_COLOUR", "teal")}
    if launch.lane:
        env["TEAM_LANE"] = launch.lane
    return env


@hookimpl
def on_terminal(job: Any, result: Any) -> None:
    # Notification hooks must never raise into the dispatcher; a real plugin would post to chat.
    return None
