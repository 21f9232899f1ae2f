"""The dispatcher's plugin manager: the matrix plugin plus third-party entry points."""

from __future__ import annotations

import logging
from typing import Final

import pluggy

from . import hookspecs

__all__ = ["ENTRY_POINT_GROUP", "plugin_manager"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP: Final = hookspecs.PROJECT


def plugin_manager(*, matrix: bool = True, entry_points: bool = True) -> pluggy.PluginManager:
    """A plugin manager with the hook specs, the matrix plugin (unless ``matrix`` is False, the
    ``enabled: false`` switch) and every plugin installed under the ``pi_tmux_matrix`` entry-point
    group. A third-party plugin that fails to load is reported and skipped, never fatal: the
    dispatcher must keep launching agents."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if matrix:
        from .. import plugin

        pm.register(plugin.MatrixPlugin(), name="matrix")
    if entry_points:
        from importlib.metadata import entry_points as installed

        # One at a time: a plugin that fails to import is reported and skipped, and never takes
        # the plugins after it down with it (pluggy's own loader stops at the first failure).
        for point in installed(group=ENTRY_POINT_GROUP):
            if pm.get_plugin(point.name) is not None or pm.is_blocked(point.name):
                continue
            try:
                pm.register(point.load(), name=point.name)
            except Exception as exc:  # noqa: BLE001 - any import or registration error
                log.warning(
                    "pi_tmux_matrix plugin %r (%s) failed to load and was skipped: %s",
                    point.name,
                    point.value,
                    exc,
                )
    return pm
