"""The state dir's sweep, whole: the matrix's, the dispatcher's and the fork runs' history together.

``pi-matrix gc`` shows :func:`plan` and removes it with :func:`apply`; ``pi-matrix reconcile`` and
a master's activation call :func:`sweep_if_due`, which does both at most once an hour (the time of
the last sweep is kept in ``<state dir>/.gc.json``) and never fails its caller. What is kept and
for how long is :mod:`~pi_tmux_matrix.matrix.retention`'s to say (and docs/on-disk-format.md's).
"""

from __future__ import annotations

import logging
from typing import Final

from .dispatch.retention import dispatch_history, job_names
from .errors import ContractError, LockUnavailable, PiMatrixError
from .fork.retention import run_history
from .matrix.retention import (
    GC_LOCK,
    Found,
    Group,
    Plan,
    Report,
    Survey,
    apply,
    mark_swept,
    matrix_history,
    stat_items,
    sweep_due,
)
from .matrix.store import MatrixStore
from .matrix.tokens import now_ms
from .settings import load_settings

__all__ = ["GC_LOCK_TIMEOUT_S", "Plan", "Report", "apply", "plan", "sweep", "sweep_if_due"]

log = logging.getLogger(__name__)

# How long the sweep waits for a lock: one that is held belongs to a writer at work, so what it
# guards is left for the next sweep rather than waited for.
GC_LOCK_TIMEOUT_S: Final = 2.0
MAX_DAYS: Final = 36500.0


def plan(store: MatrixStore, *, days: float | None = None, now: int | None = None) -> Plan:
    """What a sweep would remove from ``store``'s state dir, and what it keeps on purpose.

    ``days``: the window (default ``processMatrix.historyRetentionDays``). Reads only: nothing
    is created, locked or removed.
    """
    if days is None:
        days = float(load_settings().history_retention_days)
    if not 0 <= days <= MAX_DAYS:  # also NaN
        why = f"{days:g} is not a number of days from 0 to {MAX_DAYS:g}"
        raise ContractError("--older-than", why, "give the days history is kept, e.g. 30")
    at = now_ms() if now is None else now
    sweeper = MatrixStore(store.root, lock_timeout=GC_LOCK_TIMEOUT_S)
    entries = frozenset(sweeper.keys())
    locks = frozenset(name for name, _info in stat_items(sweeper, "locks"))
    survey = Survey(sweeper, at, at - int(days * 24 * 3600 * 1000), entries, locks)
    named = job_names(survey)
    groups: list[Group] = []
    kept: list[Found] = []
    for found in (*matrix_history(survey, named), *dispatch_history(survey, named), *run_history(survey)):
        if isinstance(found, Group):
            groups.append(found)
        else:
            kept.append(found)
    return Plan(at, survey.cutoff_ms, days, tuple(groups), tuple(sorted(kept, key=lambda f: f.path)))


def sweep(store: MatrixStore, planned: Plan) -> Report:
    """Remove what ``planned`` found (each group re-checked under its lock), as the one sweep
    running on this state dir, and record it in ``.gc.json``."""
    sweeper = MatrixStore(store.root, lock_timeout=GC_LOCK_TIMEOUT_S)
    with sweeper.hold(GC_LOCK, "gc: another sweep is running", "the sweep's record") as root_fd:
        report = apply(planned)
        mark_swept(sweeper, root_fd, now_ms(), len(report.removed))
    return report


def sweep_if_due(store: MatrixStore, *, now: int | None = None) -> Report | None:
    """The sweep, if none ran in the last hour (and no other process runs one now): the window
    from the settings, each removal re-checked under its lock. Never raises: a failure is a
    warning, and the sweep is tried again an hour later. None when nothing was due."""
    at = now_ms() if now is None else now
    try:
        if not sweep_due(store, at):
            return None
        sweeper = MatrixStore(store.root, lock_timeout=0.0)
        with sweeper.hold(GC_LOCK, "gc: another sweep is running", "the sweep's record") as root_fd:
            if not sweep_due(store, at):
                return None  # another process swept while we waited
            mark_swept(sweeper, root_fd, at, 0)  # first: a sweep that fails is not retried at once
            report = apply(plan(store, now=at))
            mark_swept(sweeper, root_fd, at, len(report.removed))
            return report
    except LockUnavailable:
        return None
    except (PiMatrixError, OSError) as exc:
        log.warning("gc: the history sweep did not run (%s); it is tried again in an hour", exc)
        return None
