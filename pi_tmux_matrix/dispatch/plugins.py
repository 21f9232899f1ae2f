"""The dispatcher's plugin manager: the hook specs, the matrix plugin and third-party plugins.

Every plugin, the matrix's own included, comes in through the entry-point group
``pi_tmux_matrix`` (the matrix registers itself there as ``matrix`` in pyproject.toml), so the
dispatcher never imports the layer above it. Programs build the manager where they start and pass
it to what they run; ``processMatrix.enabled: false`` blocks the matrix plugin by name.
"""

from __future__ import annotations

import logging
from typing import Final

import pluggy

from ..errors import DispatchError
from . import hookspecs

__all__ = ["ENTRY_POINT_GROUP", "MATRIX_PLUGIN", "plugin_manager"]

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP: Final = hookspecs.PROJECT
MATRIX_PLUGIN: Final = "matrix"


def plugin_manager(*, matrix: bool = True, entry_points: bool = True) -> pluggy.PluginManager:
    """A plugin manager with the hook specs, the matrix plugin (unless ``matrix`` is False, the
    ``enabled: false`` switch) and, with ``entry_points``, every other plugin installed under the
    ``pi_tmux_matrix`` entry-point group. A third-party plugin that fails to load is reported and
    skipped, never fatal: the dispatcher must keep launching agents. The matrix plugin failing to
    load is fatal: launching without the contract would launch workers without their envelope."""
    from importlib.metadata import entry_points as installed

    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if not matrix:
        pm.set_blocked(MATRIX_PLUGIN)
    found = False
    # One at a time: a plugin that fails to import is reported and skipped, and never takes the
    # plugins after it down with it (pluggy's own loader stops at the first failure).
    for point in installed(group=ENTRY_POINT_GROUP):
        ours = point.name == MATRIX_PLUGIN
        found = found or ours
        if not (ours or entry_points) or pm.get_plugin(point.name) is not None or pm.is_blocked(point.name):
            continue
        try:
            pm.register(point.load(), name=point.name)
        except Exception as exc:
            if ours:
                raise DispatchError(
                    f"the matrix plugin ({point.value}) failed to load: {exc}; reinstall pi_tmux_matrix"
                ) from exc
            log.warning(
                "pi_tmux_matrix plugin %r (%s) failed to load and was skipped: %s",
                point.name,
                point.value,
                exc,
            )
    if matrix and not found:
        raise DispatchError(
            "the matrix plugin is not installed (no 'matrix' entry point in the pi_tmux_matrix group); "
            "install the package (pip install -e .) rather than running it from a bare checkout"
        )
    return pm
