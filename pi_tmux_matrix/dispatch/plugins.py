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
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except Exception as exc:  # noqa: BLE001 - any plugin import error
            log.warning("a pi_tmux_matrix plugin failed to load and was skipped: %s", exc)
    return pm
