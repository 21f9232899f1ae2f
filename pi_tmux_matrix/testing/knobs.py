"""The stand-in's knobs for the agents a dispatcher launches: for tests and benchmarks only.

The production ``PASS_ENV`` holds no test double's names, so a dispatcher run in a test's own
process with an env of its own (``Dispatcher(env=...)``) would not hand the stand-in's
``STANDIN_*`` knobs to a tmux pane: the pane gets the tmux server's environment (the test
process's, when it started the server) and what the launch passes. :class:`StandInKnobs` is a
dispatcher plugin that passes them through the ``launch_env`` hook, as any plugin would add its own
variables; :func:`plugins_with_knobs` is the dispatcher's usual plugin manager with it registered.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..dispatch.hookspecs import hookimpl
from ..dispatch.plugins import plugin_manager
from .standin import KNOBS

if TYPE_CHECKING:
    import pluggy

    from ..dispatch.model import AgentLaunch

__all__ = ["PLUGIN_NAME", "StandInKnobs", "plugins_with_knobs"]

PLUGIN_NAME = "stand-in-knobs"


class StandInKnobs:
    """Adds the stand-in's knobs set (non-empty) in ``env`` to every launch."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.knobs = {name: env[name] for name in KNOBS if env.get(name)}

    @hookimpl
    def launch_env(self, launch: AgentLaunch) -> dict[str, str]:
        return dict(self.knobs)


def plugins_with_knobs(env: Mapping[str, str], *, matrix: bool = True) -> pluggy.PluginManager:
    """The dispatcher's plugin manager (``matrix``: the settings' ``enabled``) plus
    :class:`StandInKnobs` of ``env``."""
    plugins = plugin_manager(matrix=matrix)
    plugins.register(StandInKnobs(env), name=PLUGIN_NAME)
    return plugins
