"""The dispatcher's history in the state dir's sweep (:mod:`~pi_tmux_matrix.matrix.retention`).

A job goes whole, once it is over and past the window: its record, its results and usage
claims, its variables, its agents' logs, and their lock files. Over means no agent
of it has an entry (valid or not) or a live host; then the clock is its own end (its stop,
dismissal or orphaning, or its newest result) when every agent's round has a result or the job
was stopped or dismissed, and otherwise (an agent that never reported: a machine that went down)
the last write of its record, never less than a day ago (it may still be launching). A job with
an unreadable result is kept with it, named.

Results, claims and variables of no job (its record archived or moved aside) and archived jobs
and results go by their file's time (each is written once).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import partial
from typing import Final

import attrs

from .. import procs
from ..errors import CorruptEntry
from ..matrix.layout import PIPES
from ..matrix.records import RecordStore
from ..matrix.retention import (
    DAY_MS,
    Found,
    Group,
    Removal,
    Survey,
    combine,
    owner_of,
    remove_path,
    stat_items,
)
from ..matrix.statedir import SUFFIX
from .jobs import JobStore
from .model import Job
from .usage import CLAIM_SUFFIX

__all__ = ["dispatch_history", "job_names"]

# What a job owns beside its record (pipes/: a FIFO a killed host left, ``<job>.<agent>.<pid>.fifo``).
_FOLDERS: Final = ("results", "variables", "logs", PIPES)
_RECORD_FOLDERS: Final = frozenset({"results", "variables"})
_ARCHIVES: Final = ("archived-jobs", "archived-results")
_WHAT: Final = {
    "results": "a result or usage claim of no job",
    "variables": "variables of no job",
    "archived-jobs": "a job archived by fire --force",
    "archived-results": "a result archived by fire --force",
    PIPES: "a pane pipe of no job",
}


def job_names(s: Survey) -> frozenset[str]:
    """Every name in ``jobs/`` named like a record, readable or not: what belongs to a job is
    told by its name (``<job>.…``), and a job whose record cannot be read keeps its files."""
    return frozenset(RecordStore(s.store, "jobs").names())


def _record(folder: str, name: str) -> str | None:
    """The record name of ``folder/name`` when it is a record (not a claim, a temp or a log)."""
    if folder not in _RECORD_FOLDERS or name.startswith(".") or name.endswith(CLAIM_SUFFIX):
        return None
    return name[: -len(SUFFIX)] if name.endswith(SUFFIX) else None


def _size(path: str) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0


def _items(s: Survey, files: _Files) -> list[Found]:
    items: list[Found] = []
    for folder, name, info in files:
        items.append(Found(f"{folder}/{name}", "", info.st_size))
        if (record := _record(folder, name)) is not None:
            items += s.lock_item(folder, record)
    return items


def dispatch_history(s: Survey, jobs_named: frozenset[str]) -> Iterator[Group | Found]:
    """The dispatcher's groups (each job over and past the window; files of no job past it) and
    what it keeps on purpose (unreadable records, with what belongs to them)."""
    store = JobStore(s.store)
    records, problems = store.list_jobs()
    for problem in problems:
        kept = f"{problem.reason} ({problem.kind}); what belongs to it is kept with it"
        yield Found(os.path.relpath(problem.path, s.store.root), kept)
    owned, loose = _sort_files(s, jobs_named)
    for job in records:
        files = owned.get(job.id, [])
        stays, bad = _verdict(s, store, job, files)
        yield from bad
        if stays is None:
            record = Found(f"jobs/{job.id}{SUFFIX}", "", _size(store.jobs.path(job.id)))
            items = (record, *s.lock_item("jobs", job.id), *_items(s, files))
            reason = f"job {job.id}: over, past the window"
            items = tuple(attrs.evolve(i, reason=reason) for i in items)
            yield Group(f"job {job.id}", items, partial(_remove_job, s, job, items, files))
    for folder, name, info in loose:
        yield from _old_file(s, folder, name, info)
    for folder in _ARCHIVES:
        for name, info in stat_items(s.store, folder):
            yield from _old_file(s, folder, name, info)


_Files = list[tuple[str, str, os.stat_result]]


def _sort_files(s: Survey, jobs_named: frozenset[str]) -> tuple[dict[str, _Files], _Files]:
    """The files of ``results/``, ``variables/`` and ``logs/`` by the job they belong to, and
    those of no job (logs of no job excepted: a key's log, or none's, is the matrix's to judge)."""
    owned: dict[str, _Files] = {}
    loose: _Files = []
    for folder in _FOLDERS:
        for name, info in stat_items(s.store, folder):
            named = name[: -len(SUFFIX)] if folder == "variables" and name.endswith(SUFFIX) else None
            job = named if named in jobs_named else owner_of(name, jobs_named)
            if job is not None:
                owned.setdefault(job, []).append((folder, name, info))
            elif folder != "logs":
                loose.append((folder, name, info))
    return owned, loose


def _verdict(s: Survey, store: JobStore, job: Job, files: _Files) -> tuple[str | None, list[Found]]:
    """Why ``job`` stays (None: it goes), and its files that cannot be read (kept, named)."""
    for agent in job.agents:
        if s.has_entry(agent.key):
            return f"its agent {agent.key} has an entry", []
        if procs.is_alive(agent.host):
            return f"its agent's host (pid {agent.host_pid}) is alive", []
    results = {}
    bad: list[Found] = []
    for folder, name, info in files:
        record = _record(folder, name)
        if folder != "results" or record is None:
            continue
        try:
            results[record] = store.results.find(record)
        except CorruptEntry as exc:
            why = f"{exc.reason}: kept, and its job {job.id} with it"
            bad.append(Found(f"results/{name}", why, info.st_size))
    if bad:
        return "a result of it cannot be read", bad
    ended = [r.at for r in results.values() if r is not None]
    ended += [t for t in (job.stopped_at, job.dismissed_at, job.orphaned_at) if t is not None]
    finished = job.stopped_at is not None or job.dismissed_at is not None
    if finished or all(results.get(a.result_name(job.id)) is not None for a in job.agents):
        clock, floor = max([job.created_at, *ended]), 0
    else:
        try:
            written = os.stat(store.jobs.path(job.id), follow_symlinks=False).st_mtime_ns // 1_000_000
        except OSError:
            return "its record is gone", []
        clock, floor = max(written, job.created_at), DAY_MS
    return (None if s.old(clock, floor) else "within the window"), []


def _remove_job(s: Survey, job: Job, items: tuple[Found, ...], files: _Files) -> Removal:
    """Under the job's lock, the job unchanged and still over: its files, then its record and
    lock file. Results and variables go through their records (each with its lock file)."""
    store = JobStore(s.store)
    parts: list[Removal] = []

    def first() -> None:
        with s.store.open_root(create=False) as root_fd:
            for item in items:
                folder, _, name = item.path.partition("/")
                if folder in ("jobs", "locks") or root_fd is None:
                    continue
                record = _record(folder, name)
                if record is None:
                    parts.append(remove_path(root_fd, item.path, None))
                    continue
                why = RecordStore(s.store, folder).delete_if(record, lambda _current: None)
                gone = Removal((item, *s.lock_item(folder, record)))
                parts.append(gone if why is None else Removal(kept=(attrs.evolve(item, reason=why),)))

    def keep(current: Job) -> str | None:
        if current != job:
            return "changed since the survey"
        return _verdict(s, store, current, files)[0]  # its results read again, under its lock

    why = store.jobs.delete_if(job.id, keep, first)
    if why is not None:
        return Removal(kept=tuple(attrs.evolve(i, reason=f"kept: {why}") for i in items))
    own = tuple(i for i in items if i.path in (f"jobs/{job.id}{SUFFIX}", f"locks/jobs.{job.id}.lock"))
    return combine([*parts, Removal(own)])


def _old_file(s: Survey, folder: str, name: str, info: os.stat_result) -> Iterator[Group | Found]:
    """A file judged by its own time: a record (read first: an unreadable one is kept, named),
    a usage claim, a temp file no writer came back for."""
    rel = f"{folder}/{name}"
    record = name[: -len(SUFFIX)] if name.endswith(SUFFIX) and not name.startswith(".") else None
    if record is not None and not name.endswith(CLAIM_SUFFIX):
        try:
            RecordStore(s.store, folder).get(record)
        except CorruptEntry as exc:
            yield Found(rel, f"{exc.reason} (corrupt)", info.st_size)
            return
    if not s.old(info.st_mtime_ns // 1_000_000):
        return
    item = Found(rel, f"{_WHAT[folder]}, past the window", info.st_size)
    if record is None or name.endswith(CLAIM_SUFFIX):
        yield Group(rel, (item,), partial(_remove_old, s, rel))
        return
    items = (item, *s.lock_item(folder, record))
    yield Group(rel, items, partial(_remove_old_record, s, folder, record, items))


def _remove_old(s: Survey, rel: str) -> Removal:
    with s.store.open_root(create=False) as root_fd:
        return Removal() if root_fd is None else remove_path(root_fd, rel, s.cutoff_ms)


def _remove_old_record(s: Survey, folder: str, record: str, items: tuple[Found, ...]) -> Removal:
    path = s.store.root / folder / f"{record}{SUFFIX}"

    def keep(current: object) -> str | None:
        try:
            written = os.stat(path, follow_symlinks=False).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return None
        return None if s.old(written) else "written since the survey"

    why = RecordStore(s.store, folder).delete_if(record, keep)
    if why is not None:
        return Removal(kept=tuple(attrs.evolve(i, reason=why) for i in items))
    return Removal(items)
