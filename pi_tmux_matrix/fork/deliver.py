"""Background fork results into their parent's session
(docs/decisions.md#background-fork-results-are-delivered-once): the runs whose result the
parent's session has not taken yet, and marking those it took. The posting is the program's:
the run's finisher posts once when the run ends; the parent's host posts again, on its beat,
until the bridge says pi's conversation has it (a pi that was restarting, or not yet started,
reads only notices newer than its session). The bridge never injects one run's result twice.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextlib import suppress
from typing import Final

import attrs

from ..errors import CorruptEntry, InvalidId
from ..errors import RunNotFound as NotFound
from ..identity import validate_id
from ..matrix.store import MatrixStore, now_ms
from .model import ForkRun, RunMode, RunStatus
from .store import RunStore

__all__ = ["due", "mark_delivered", "runs_stamp", "undelivered"]

RETRY_AFTER_MS: Final = 10_000  # after its end: the finisher's own post comes first
MAX_AGE_MS: Final = 24 * 3600 * 1000  # an older result is no longer offered


def mark_delivered(store: MatrixStore, run_ids: Iterable[str]) -> None:
    """Record that the parent's session took these runs' results (once; ids that are not a
    run's, as a bridge may report anything, are skipped)."""
    runs = RunStore(store)
    at = now_ms()

    def mark(run: ForkRun) -> ForkRun | None:
        return None if run.delivered_at_ms is not None else attrs.evolve(run, delivered_at_ms=at)

    for run_id in run_ids:
        with suppress(NotFound, CorruptEntry, InvalidId):
            runs.update(validate_id(run_id, "run id"), mark)


def undelivered(store: MatrixStore, parent_key: str, session_file: str | None) -> list[ForkRun]:
    """The ended background runs of ``parent_key`` (forked from ``session_file``, its session
    now) whose result its session has not taken, ended at most :data:`MAX_AGE_MS` ago."""
    if not store.exists():
        return []
    oldest = now_ms() - MAX_AGE_MS
    wanted = os.path.realpath(session_file) if session_file else None
    listed, _problems = RunStore(store).list()
    return [
        run
        for run in listed
        if run.parent_key == parent_key
        and run.mode is RunMode.BACKGROUND
        and run.status is not RunStatus.RUNNING
        and run.delivered_at_ms is None
        and run.ended_at_ms is not None
        and run.ended_at_ms >= oldest
        and (wanted is None or run.parent_session_file == wanted)
    ]


def due(run: ForkRun, now: int) -> bool:
    """Whether to tell the parent again: :data:`RETRY_AFTER_MS` after the run's end (the
    finisher's own post comes first)."""
    return run.ended_at_ms is not None and now - run.ended_at_ms >= RETRY_AFTER_MS


def runs_stamp(store: MatrixStore) -> int | None:
    """The run records' folder's change stamp: a record created or rewritten changes it (writes
    are a rename into it), so a caller that found nothing pending need not list again until it
    changes."""
    try:
        return os.stat(store.root / "runs").st_mtime_ns
    except OSError:
        return None
