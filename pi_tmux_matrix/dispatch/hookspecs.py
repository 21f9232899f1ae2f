"""The dispatcher's pluggy hook specifications (project name ``pi_tmux_matrix``).

The matrix itself is the default plugin (:mod:`pi_tmux_matrix.plugin`); third-party plugins
load from the entry-point group ``pi_tmux_matrix``. Hooks receive frozen values: a plugin
contributes to a launch, it never mutates the dispatcher's state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

import pluggy

if TYPE_CHECKING:
    from .model import AgentLaunch, AgentResult, Job, Relaunch

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT: Final = "pi_tmux_matrix"

hookspec: Final = pluggy.HookspecMarker(PROJECT)
hookimpl: Final = pluggy.HookimplMarker(PROJECT)


@hookspec
def launch_env(launch: AgentLaunch) -> dict[str, str] | None:
    """Environment variables to add to one agent's launch.

    Called once per agent, after the profile is compiled and before anything is started. A
    plugin may not override another plugin's variable: two plugins setting the same name with
    different values fail the launch with an error naming both.
    """


@hookspec
def launch_argv(launch: AgentLaunch) -> list[str] | None:
    """Extra arguments appended to the agent CLI's argv (before the task), e.g. ``-e bridge.ts``."""


@hookspec
def on_launched(job: Job, launch: AgentLaunch, pane: dict[str, object]) -> None:
    """An agent's host is running (``pane``: ``paneId``, ``panePid``, ``target`` or ``pid``)."""


@hookspec
def on_terminal(job: Job, result: AgentResult) -> None:
    """One agent's result was written (exactly once per marker round)."""


@hookspec(firstresult=True)
def relaunch(request: Relaunch) -> int | None:
    """Relaunch a dead worker into its exact session; the first plugin that does returns the
    new host pid. The matrix plugin's implementation (``recovery.relaunch``) starts it through
    the backend ``request.backend`` names, or its job's (a detached host when tmux is not there);
    return None to leave it to the next plugin."""
