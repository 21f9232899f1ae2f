"""Example dispatcher plugin: every launched agent gets ``TEAM_COLOUR`` (from the launcher's own
``PI_MATRIX_TEAM_COLOUR``, default ``teal``) and its lane as ``TEAM_LANE``."""

from __future__ import annotations

import os

from pi_tmux_matrix import AgentLaunch, AgentResult, Job, hookimpl


@hookimpl
def launch_env(launch: AgentLaunch) -> dict[str, str]:
    env = {"TEAM_COLOUR": os.environ.get("PI_MATRIX_TEAM_COLOUR", "teal")}
    if launch.lane:
        env["TEAM_LANE"] = launch.lane
    return env


@hookimpl
def on_terminal(job: Job, result: AgentResult) -> None:
    # Notification hooks must never raise into the dispatcher; a real plugin would post to chat.
    return None
