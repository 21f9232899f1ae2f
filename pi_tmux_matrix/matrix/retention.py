"""What the state dir keeps and for how long: the sweep's plan, its removals, the matrix's own kinds.

Two things leave the state dir (docs/decisions.md#the-state-dir-is-bounded), never anything else:

* What belonged to one entry alone (its lock file, its host's mailbox, its agent's notices) goes
  with the entry (``MatrixStore.delete``). A key whose entry is gone while such leftovers remain
  (left by an older pi-matrix, or a message posted after the removal) has them swept here at once:
  they have no history value.
* History (jobs with their results and usage claims, logs, events, bridge artifacts, launch
  tickets, fork runs, archived jobs) is kept for the retention window
  (``processMatrix.historyRetentionDays``), then swept.

The clock: a record's own end time where it has one (a job: its stop, dismissal or orphaning and
its results' times; a fork run: its end), else the file's mtime: the last write of a file written
once (a log, a ticket, a usage claim) or appended to while its agent lived (events).

Never removed: anything of a key that has an entry file (valid or not), anything of a live or
unfinished job or run, a file that is not a regular file, a record that cannot be read, and
``quarantine/``; each is named as kept with the reason.

This room holds the plan (:class:`Found`, :class:`Group`, :class:`Plan`) and its application
(:func:`apply`), the matrix's own kinds (:func:`matrix_history`), and the sweep's throttle file
(``.gc.json``). The dispatcher's jobs and the fork runs bring their groups from their own layers
(``dispatch.retention``, ``fork.retention``); ``pi_tmux_matrix.retention`` puts them together.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from functools import partial
from typing import Final

import attrs

from .. import strictjson
from ..errors import CorruptEntry, LockUnavailable, PiMatrixError
from ..identity import ID_PATTERN
from .fsio import DIR_FLAGS, durable_write, opened_dir, read_bounded, remove_folder, remove_regular
from .layout import LOCKS, MAILBOX, PIPES, QUARANTINE, RESERVED_DIRS, SUFFIX, notices_name
from .records import RecordStore
from .statedir import is_key
from .store import MatrixStore

__all__ = [
    "DAY_MS",
    "GC_LOCK",
    "STATE_FILE",
    "SWEEP_EVERY_MS",
    "Found",
    "Group",
    "Plan",
    "Removal",
    "Report",
    "Survey",
    "apply",
    "combine",
    "mark_swept",
    "matrix_history",
    "owner_of",
    "remove_path",
    "stat_items",
    "sweep_due",
]

DAY_MS: Final = 24 * 3600 * 1000
# At most one sweep an hour from reconcile and a master's activation (``pi-matrix gc`` any time).
SWEEP_EVERY_MS: Final = 3600 * 1000
STATE_FILE: Final = ".gc.json"  # a dot file: every listing skips it, an older repair leaves it
GC_LOCK: Final = "gc.lock"
# Record directories (``matrix.records``): each record's lock is ``locks/<kind>.<name>.lock``.
RECORD_KINDS: Final = frozenset({"jobs", "results", "runs", "variables", "archived-jobs", "archived-results"})
_TICKET: Final = frozenset("0123456789abcdef")
# Locks that guard no record but a count (the dispatcher's cap of live agents, a cwd's fork runs'):
# taken at every fire or fork, and one per working directory at most, so they stay.
_LOCKS_ONLY: Final = ("jobs.fire-cap.lock", "runs.cap-")
_LEFTOVER: Final = "belonged to a removed entry"
_NOT_REGULAR: Final = "not a regular file: never followed or removed"


@attrs.frozen
class Found:
    """One path the sweep looked at (relative to the state dir; a folder ends in ``/``), what it
    holds, and why it goes or stays."""

    path: str
    reason: str
    size: int = 0
    files: int = 1

    @property
    def folder(self) -> str:
        """The state dir's folder it counts under (``.`` for the state dir itself)."""
        head, sep, _ = self.path.partition("/")
        return head if sep else "."


@attrs.frozen
class Removal:
    """What one group's removal took, and what it left (with the reason)."""

    removed: tuple[Found, ...] = ()
    kept: tuple[Found, ...] = ()


@attrs.frozen(eq=False)
class Group:
    """Paths removed together after one re-check under one lock (a job with its results and
    logs, a removed entry's leftovers and old history)."""

    what: str
    items: tuple[Found, ...]
    remove: Callable[[], Removal]


@attrs.frozen
class Plan:
    """A sweep's findings: what would go (in groups) and what is kept on purpose."""

    now_ms: int
    cutoff_ms: int
    days: float
    groups: tuple[Group, ...]
    kept: tuple[Found, ...]

    @property
    def items(self) -> tuple[Found, ...]:
        return tuple(item for group in self.groups for item in group.items)


@attrs.frozen
class Report:
    """What a sweep removed and what it kept (planned keeps, and groups left at removal time)."""

    plan: Plan
    removed: tuple[Found, ...]
    kept: tuple[Found, ...]


@attrs.frozen
class Survey:
    """One sweep's view: the store (a short lock wait), the clock, and the state dir's names."""

    store: MatrixStore
    now_ms: int
    cutoff_ms: int
    entries: frozenset[str]  # every key with an entry file, valid or not
    locks: frozenset[str]  # the names in locks/

    def old(self, at_ms: int, floor_ms: int = 0) -> bool:
        """Whether something last touched at ``at_ms`` is past the window (and at least
        ``floor_ms`` old whatever the window: a launch or a job that may still be starting)."""
        return at_ms <= min(self.cutoff_ms, self.now_ms - floor_ms)

    def has_entry(self, key: str) -> bool:
        """Whether ``key`` has an entry file now (looked at on disk, not in the snapshot)."""
        return os.path.lexists(self.store.root / f"{key}{SUFFIX}")

    def lock_item(self, kind: str, name: str) -> tuple[Found, ...]:
        """The lock file of record ``kind/name``, when there is one (it goes with the record)."""
        lock = f"{kind}.{name}.lock"
        return (Found(f"{LOCKS}/{lock}", "the lock of a removed record"),) if lock in self.locks else ()


def stat_items(store: MatrixStore, folder: str) -> list[tuple[str, os.stat_result]]:
    """Every name in ``<state dir>/<folder>`` with its ``lstat`` (never following a symlink);
    nothing if the folder is absent, or is not a real folder (:func:`matrix_history` names it)."""
    try:
        with opened_dir(store.root / folder, create=False) as fd:
            if fd is None:
                return []
            found: list[tuple[str, os.stat_result]] = []
            for name in sorted(os.listdir(fd)):
                try:
                    found.append((name, os.stat(name, dir_fd=fd, follow_symlinks=False)))
                except FileNotFoundError:
                    continue
            return found
    except (PiMatrixError, OSError):
        return []


def owner_of(name: str, owners: frozenset[str]) -> str | None:
    """The longest of ``owners`` that ``name`` starts with, followed by a dot (a job's files are
    ``<job>.…``, and a job id may itself hold dots); None if none. One set lookup per dot."""
    cut = len(name)
    while (cut := name.rfind(".", 0, cut)) > 0:
        if name[:cut] in owners:
            return name[:cut]
    return None


def _folder_stats(store: MatrixStore, rel: str) -> tuple[int, int, int, list[str]]:
    """A sub-folder's newest mtime (ms), bytes and regular files, and the names in it that are
    not regular files (they stay)."""
    newest, size, files, odd = 0, 0, 0, []
    try:
        info = os.stat(store.root / rel, follow_symlinks=False)
        newest = info.st_mtime_ns // 1_000_000
        for name, item in stat_items(store, rel):
            newest = max(newest, item.st_mtime_ns // 1_000_000)
            if stat.S_ISREG(item.st_mode):
                size, files = size + item.st_size, files + 1
            else:
                odd.append(f"{rel}/{name}")
    except (OSError, PiMatrixError):
        odd.append(rel)
    return newest, size, files, odd


def _ms(info: os.stat_result) -> int:
    return info.st_mtime_ns // 1_000_000


def remove_path(root_fd: int, rel: str, cutoff_ms: int | None) -> Removal:
    """Remove ``rel`` (``folder/name``, or ``folder/name/`` for a folder of regular files) if it
    is still older than ``cutoff_ms`` (None: whatever its age). Anything not a regular file is
    left and named."""
    folder, _, name = rel.rstrip("/").partition("/")
    item = Found(rel, "")
    try:
        fd = os.open(folder, DIR_FLAGS, dir_fd=root_fd)
    except FileNotFoundError:
        return Removal()
    try:
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return Removal()
        if stat.S_ISDIR(info.st_mode):
            if cutoff_ms is not None and _newest(fd, name, info) > cutoff_ms:
                return Removal(kept=(attrs.evolve(item, reason="written since the survey"),))
            freed, left = remove_folder(fd, name)
            kept = tuple(Found(f"{folder}/{n}", _NOT_REGULAR) for n in left)
            return Removal((attrs.evolve(item, size=freed),), kept)
        if cutoff_ms is not None and _ms(info) > cutoff_ms:
            return Removal(kept=(attrs.evolve(item, reason="written since the survey"),))
        # pipes/ holds the FIFOs the hosts read their panes from: one left by a killed host
        # goes with its job (or past the window); a FIFO anywhere else is never removed.
        size = remove_regular(fd, name, fifo=folder == PIPES)
    finally:
        os.close(fd)
    if size is None:
        return Removal(kept=(attrs.evolve(item, reason=_NOT_REGULAR),))
    return Removal((attrs.evolve(item, size=size),))


def _newest(dir_fd: int, name: str, info: os.stat_result) -> int:
    newest = _ms(info)
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return newest
    try:
        for item in os.listdir(fd):
            try:
                newest = max(newest, _ms(os.stat(item, dir_fd=fd, follow_symlinks=False)))
            except OSError:
                continue
    finally:
        os.close(fd)
    return newest


def combine(parts: list[Removal]) -> Removal:
    """Several removals' results as one."""
    return Removal(tuple(f for p in parts for f in p.removed), tuple(f for p in parts for f in p.kept))


def apply(plan: Plan) -> Report:
    """Remove every group of ``plan``, each after its own re-check under its lock: a group that
    changed since the survey, or whose lock is busy, is kept (named) for the next sweep."""
    removed: list[Found] = []
    kept = list(plan.kept)
    for group in plan.groups:
        try:
            done = group.remove()
        except LockUnavailable:
            why = "busy: its lock is held; left for the next sweep"
            kept += [attrs.evolve(item, reason=why) for item in group.items]
            continue
        except (PiMatrixError, OSError) as exc:
            kept += [attrs.evolve(item, reason=f"not removed: {exc}") for item in group.items]
            continue
        removed += done.removed
        kept += done.kept
    return Report(plan, tuple(removed), tuple(kept))


# --- the matrix's own kinds ---------------------------------------------------------------------
def matrix_history(s: Survey, job_names: frozenset[str]) -> Iterator[Group | Found]:
    """Per key without an entry: its leftovers, and its events, artifacts and logs once past the
    window. Then launch tickets, lock files of records that are gone, logs of no job and no
    entry, and what is kept on purpose (quarantine, unreadable entries, names pi-matrix does
    not make). Logs named for a job in ``job_names`` are the job's (``dispatch.retention``)."""
    for folder in sorted(RESERVED_DIRS):
        try:
            info = os.stat(s.store.root / folder, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(info.st_mode):
            yield Found(folder, "not a real folder (a symlink or a file): never followed or removed")
    per_key: dict[str, list[Found]] = {}
    yield from _per_key_names(s, job_names, per_key)
    for key, items in sorted(per_key.items()):
        if key not in s.entries:
            yield Group(f"{key} (no entry)", tuple(items), partial(_remove_key, s, key, tuple(items)))
    yield from _launches(s)
    yield from _record_locks(s)
    for name, info in stat_items(s.store, QUARANTINE):
        why = "moved aside by 'pi-matrix repair': evidence, never removed by gc (remove it once read)"
        yield Found(f"{QUARANTINE}/{name}", why, info.st_size)
    for problem in s.store.list().problems:
        yield Found(os.path.relpath(problem.path, s.store.root), f"{problem.reason} ({problem.kind})")


def _per_key_names(
    s: Survey, job_names: frozenset[str], per_key: dict[str, list[Found]]
) -> Iterator[Group | Found]:
    """Sort each key's files into ``per_key`` (leftovers always, history when old); yield what
    is kept on purpose, and the groups of logs that belong to no job and no entry."""

    def add(key: str, item: Found) -> None:
        per_key.setdefault(key, []).append(item)

    for name, _info in stat_items(s.store, LOCKS):
        if name.endswith(".lock") and is_key(name[:-5]):
            add(name[:-5], Found(f"{LOCKS}/{name}", f"the lock file: {_LEFTOVER}"))
    for name, info in stat_items(s.store, MAILBOX):
        rel = f"{MAILBOX}/{name}"
        if stat.S_ISDIR(info.st_mode) and is_key(name):
            _newest_ms, size, files, odd = _folder_stats(s.store, rel)
            add(name, Found(f"{rel}/", f"its host's mailbox: {_LEFTOVER}", size, files))
            yield from (Found(p, _NOT_REGULAR) for p in odd if name not in s.entries)
        elif is_key(key := name.removesuffix(".agent.jsonl")) and notices_name(key) == name:
            if stat.S_ISREG(info.st_mode):
                add(key, Found(rel, f"its agent's notices: {_LEFTOVER}", info.st_size))
            elif key not in s.entries:
                yield Found(rel, _NOT_REGULAR)
        else:
            yield Found(rel, "not a name pi-matrix makes in mailbox/ (foreign)", info.st_size)
    yield from _history_names(s, job_names, add)


def _history_names(
    s: Survey, job_names: frozenset[str], add: Callable[[str, Found], None]
) -> Iterator[Group | Found]:
    for name, info in stat_items(s.store, "events"):
        rel = f"events/{name}"
        key = name.removesuffix(".1").removesuffix(".jsonl")
        if not (is_key(key) and name in (f"{key}.jsonl", f"{key}.jsonl.1")):
            yield Found(rel, "not a name pi-matrix makes in events/ (foreign)", info.st_size)
        elif not stat.S_ISREG(info.st_mode):
            yield Found(rel, _NOT_REGULAR)
        elif s.old(_ms(info)):
            add(key, Found(rel, "events of a removed entry, past the window", info.st_size))
    for name, info in stat_items(s.store, "artifacts"):
        rel = f"artifacts/{name}"
        if not (is_key(name) and stat.S_ISDIR(info.st_mode)):
            yield Found(rel, "not an agent's artifacts folder (foreign)", info.st_size)
            continue
        newest, size, files, odd = _folder_stats(s.store, rel)
        if name not in s.entries:
            yield from (Found(p, _NOT_REGULAR) for p in odd)
        if s.old(newest):
            add(name, Found(f"{rel}/", "bridge artifacts of a removed entry, past the window", size, files))
    for name, info in stat_items(s.store, "logs"):
        rel = f"logs/{name}"
        if owner_of(name, job_names) is not None:
            continue  # a job's log: it goes with its job
        if not stat.S_ISREG(info.st_mode):
            yield Found(rel, _NOT_REGULAR)
            continue
        key = name.removesuffix(".log").removesuffix(".rehost")
        if is_key(key) and name in (f"{key}.log", f"{key}.rehost.log"):
            if s.old(_ms(info)):
                add(key, Found(rel, "the log of a removed entry, past the window", info.st_size))
        elif s.old(_ms(info)):
            why = "a log of no job and no entry, past the window"
            item = Found(rel, why, info.st_size)
            yield Group(rel, (item,), partial(_remove_old, s, rel))


def _remove_old(s: Survey, rel: str) -> Removal:
    with s.store.open_root(create=False) as root_fd:
        return Removal() if root_fd is None else remove_path(root_fd, rel, s.cutoff_ms)


def _remove_key(s: Survey, key: str, items: tuple[Found, ...]) -> Removal:
    """Under ``key``'s lock, its entry still absent: its old history (re-checked), then its
    leftovers and lock file (``MatrixStore.drop_leftovers``)."""
    with s.store.locked(key) as root_fd:
        if s.has_entry(key):
            return Removal(kept=tuple(attrs.evolve(i, reason="its entry is back") for i in items))
        parts = [
            remove_path(root_fd, item.path, s.cutoff_ms)
            for item in items
            if not item.path.startswith((f"{LOCKS}/", f"{MAILBOX}/"))
        ]
        left = s.store.drop_leftovers(root_fd, key)
    leftovers = [i for i in items if i.path.startswith((f"{LOCKS}/", f"{MAILBOX}/"))]
    kept = tuple(Found(p, _NOT_REGULAR) for p in left.left)
    gone = tuple(i for i in leftovers if not any(_within(p, i.path) for p in left.left))
    return combine([*parts, Removal(gone, kept)])


def _within(path: str, item: str) -> bool:
    base = item.rstrip("/")
    return path == base or path.startswith(f"{base}/")


def _launches(s: Survey) -> Iterator[Group | Found]:
    for name, info in stat_items(s.store, "launches"):
        rel = f"launches/{name}"
        ticket = name[1:].split(".", 1)[0] if name.startswith(".") and name.endswith(".tmp") else name
        if len(ticket) != 32 or not set(ticket) <= _TICKET:
            yield Found(rel, "not a launch ticket (foreign)", info.st_size)
        elif not stat.S_ISREG(info.st_mode):
            yield Found(rel, _NOT_REGULAR)
        elif s.old(_ms(info), floor_ms=DAY_MS):  # a stalled tmux server may start a pane late
            item = Found(rel, "a launch ticket past the window", info.st_size)
            yield Group(rel, (item,), partial(_remove_old, s, rel))


def _record_locks(s: Survey) -> Iterator[Group | Found]:
    for name in sorted(s.locks):
        if not name.endswith(".lock") or is_key(name[:-5]) or name == GC_LOCK or name.startswith(_LOCKS_ONLY):
            continue
        kind, _, record = name[:-5].partition(".")
        if kind not in RECORD_KINDS or not ID_PATTERN.fullmatch(record):
            yield Found(f"{LOCKS}/{name}", "not a lock file pi-matrix makes (foreign)")
        elif not os.path.lexists(s.store.root / kind / f"{record}{SUFFIX}"):
            item = Found(f"{LOCKS}/{name}", "the lock of a record that is gone")
            yield Group(f"{LOCKS}/{name}", (item,), partial(_remove_record_lock, s, kind, record, item))


def _remove_record_lock(s: Survey, kind: str, record: str, item: Found) -> Removal:
    records = RecordStore(s.store, kind)
    why = records.delete_if(record, lambda current: None if current is None else "the record is back")
    return Removal((item,)) if why is None else Removal(kept=(attrs.evolve(item, reason=why),))


# --- the throttle ---------------------------------------------------------------------------------
def sweep_due(s: MatrixStore, now_ms: int) -> bool:
    """Whether the last sweep (``.gc.json``) is an hour old or more (or unknown, or in the future)."""
    with s.open_root(create=False) as root_fd:
        if root_fd is None:
            return False  # no state dir: nothing to sweep, and nothing is created to say so
        try:
            data = read_bounded(root_fd, STATE_FILE, str(s.root / STATE_FILE), 4096)
            raw = strictjson.loads(data, max_bytes=4096)
            at = raw["sweptAt"] if isinstance(raw, dict) else None
        except (FileNotFoundError, CorruptEntry, strictjson.StrictJSONError, KeyError):
            return True
    return not isinstance(at, int) or not 0 <= now_ms - at < SWEEP_EVERY_MS


def mark_swept(s: MatrixStore, root_fd: int, now_ms: int, removed: int) -> None:
    """Record this sweep in ``.gc.json`` (the caller holds ``locks/gc.lock``)."""
    data = json.dumps({"sweptAt": now_ms, "removed": removed}).encode() + b"\n"
    durable_write(root_fd, STATE_FILE, data, exclusive=False, path=str(s.root / STATE_FILE))
