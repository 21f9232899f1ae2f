"""Fork runs in the state dir's sweep (:mod:`~pi_tmux_matrix.matrix.retention`).

A run goes whole (its record ``runs/<id>.json``, its folder ``runs/<id>/`` with the snapshot,
script, pane log and result, and its lock file) once it ended more than the window ago (its
``endedAtMs``). A run still ``running`` on record whose process is gone (a machine that went
down) goes by its last update, never less than a day ago; one whose process lives is never
touched. A folder whose record is gone goes by its newest file. An unreadable record is kept,
and its folder with it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from functools import partial

import attrs

from .. import procs
from ..matrix.retention import DAY_MS, Found, Group, Removal, Survey, combine, remove_path, stat_items
from ..matrix.statedir import SUFFIX
from .model import ForkRun, RunStatus
from .store import RunStore

__all__ = ["run_history"]


def _folder_size(s: Survey, run_id: str) -> tuple[int, int, int]:
    """Bytes, regular files and the newest mtime (ms) of ``runs/<id>/``."""
    size = files = newest = 0
    for _name, info in stat_items(s.store, f"runs/{run_id}"):
        newest = max(newest, info.st_mtime_ns // 1_000_000)
        if stat.S_ISREG(info.st_mode):
            size, files = size + info.st_size, files + 1
    return size, files, newest


def _size(path: str) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0


def run_history(s: Survey) -> Iterator[Group | Found]:
    """Each fork run over and past the window, and each folder of no run past it; unreadable
    records kept, named."""
    runs = RunStore(s.store)
    listed, problems = runs.list()
    for problem in problems:
        why = f"{problem.reason} ({problem.kind}); its folder is kept with it"
        yield Found(os.path.relpath(problem.path, s.store.root), why)
    named = set(runs.records.names())
    for run in listed:
        if run.status is RunStatus.RUNNING:
            if procs.is_alive(run.process):
                continue
            clock, floor = run.updated_at_ms, DAY_MS
        else:
            clock, floor = run.ended_at_ms or run.updated_at_ms, 0
        if not s.old(clock, floor):
            continue
        size, files, _newest = _folder_size(s, run.id)
        why = f"fork run {run.id}: {run.status.value}, past the window"
        items = (
            Found(f"runs/{run.id}{SUFFIX}", why, _size(runs.records.path(run.id))),
            *s.lock_item("runs", run.id),
            *((Found(f"runs/{run.id}/", why, size, files),) if files or size else ()),
        )
        yield Group(f"run {run.id}", items, partial(_remove_run, s, run, items))
    for name, info in stat_items(s.store, "runs"):
        if not stat.S_ISDIR(info.st_mode) or name in named:
            continue  # a record (listed above), or a run's own folder
        size, files, newest = _folder_size(s, name)
        if s.old(max(newest, info.st_mtime_ns // 1_000_000)):
            item = Found(
                f"runs/{name}/", "a fork run's folder without its record, past the window", size, files
            )
            yield Group(item.path, (item,), partial(_remove_folder, s, item.path, s.cutoff_ms))


def _remove_run(s: Survey, run: ForkRun, items: tuple[Found, ...]) -> Removal:
    """Under the run's lock, the run unchanged: its folder, then its record and lock file."""
    parts: list[Removal] = []

    def first() -> None:
        parts.append(_remove_folder(s, f"runs/{run.id}/", None))

    why = RunStore(s.store).records.delete_if(
        run.id, lambda current: None if current == run else "changed since the survey", first
    )
    if why is not None:
        return Removal(kept=tuple(attrs.evolve(i, reason=f"kept: {why}") for i in items))
    own = tuple(i for i in items if not i.path.endswith("/"))
    folder = tuple(i for i in items if i.path.endswith("/"))
    done = combine(parts)
    return combine([Removal(own), Removal(folder if not done.kept else (), done.kept)])


def _remove_folder(s: Survey, rel: str, cutoff_ms: int | None) -> Removal:
    with s.store.open_root(create=False) as root_fd:
        return Removal() if root_fd is None else remove_path(root_fd, rel, cutoff_ms)
