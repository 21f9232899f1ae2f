"""Repair of the state dir: dead writers' temp files removed, corrupt and foreign files quarantined.

Nothing is ever deleted here but a temp file no writer owns any more and, once a corrupt entry is
moved aside, what belonged to that entry alone (its mailbox, its lock file: see
``MatrixStore.drop_leftovers``): a file that is not a valid entry is evidence, moved to
``quarantine/<name>.<ms>.<random>`` under the entry's lock after a re-check (a writer may have
repaired it meanwhile). Files written by a newer pi-matrix are
reported and left alone. A quarantined worker whose bytes still name its identity and a session
file that is there is not lost: a ``resumable`` entry is written for it from them
(docs/decisions.md#quarantine-keeps-the-way-back). The entry store
(:class:`~.store.MatrixStore`) is reached through the small :class:`EntryFiles` protocol,
because ``MatrixStore.repair`` delegates here and this module must not import ``store``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, suppress
from pathlib import Path
from typing import Protocol

import attrs

from .. import strictjson
from ..errors import CorruptEntry, PiMatrixError, StoreError
from ..identity import AgentIdentityContract, Role, parse_key
from .codec import structure
from .fsio import open_dir, read_state_file
from .model import Entry, ResumablePayload, Status
from .statedir import QUARANTINE, SUFFIX, TMP_SUFFIX, Problem, is_key
from .tokens import now_ms

__all__ = ["EntryFiles", "RepairAction", "repair", "salvage"]


@attrs.frozen
class RepairAction:
    """What ``repair`` did (or, dry, would do) with one file."""

    path: str
    action: str  # "quarantine" | "remove-temp" | "skip"
    reason: str
    target: str | None = None
    # A quarantined worker made resumable again from its own bytes: its session file (else None).
    resumable: str | None = None


class _Listing(Protocol):
    @property
    def problems(self) -> tuple[Problem, ...]: ...


class EntryFiles(Protocol):
    """What repair needs of the entry store (a :class:`~.store.MatrixStore`)."""

    @property
    def root(self) -> Path: ...

    def open_root(self, *, create: bool) -> AbstractContextManager[int | None]: ...

    def locked(self, key: str) -> AbstractContextManager[int]: ...

    def find(self, key: str) -> Entry | None: ...

    def drop_leftovers(self, root_fd: int, key: str) -> object: ...

    def create(self, entry: Entry, *, sync_dir: bool = True) -> Entry: ...

    def list(self) -> _Listing: ...


def repair(store: EntryFiles, *, dry_run: bool = False) -> tuple[RepairAction, ...]:
    """Move corrupt and foreign files to ``quarantine/``; remove dead writers' temp files.

    Files written by a newer pi-matrix are reported and left alone. With ``dry_run`` nothing
    is created, locked, moved or removed.
    """
    with store.open_root(create=False) as root_fd:
        if root_fd is None:
            return ()
        with os.scandir(root_fd) as scan:
            names = sorted(item.name for item in scan)
    actions = list(_sweep_temps(store, names, dry_run=dry_run))
    for problem in store.list().problems:
        if problem.kind == "newer":
            actions.append(RepairAction(problem.path, "skip", problem.reason))
            continue
        name = os.path.basename(problem.path)
        target = str(store.root / QUARANTINE / f"{name}.{now_ms()}.{os.urandom(3).hex()}")
        salvaged = salvage(problem.path)
        resumable = salvaged.identity.session_file if salvaged is not None else None
        actions.append(RepairAction(problem.path, "quarantine", problem.reason, target, resumable))
        if not dry_run:
            _quarantine(store, name, target)
            if salvaged is not None:
                with suppress(PiMatrixError):  # a writer made the key anew meanwhile: its record stands
                    store.create(salvaged)
    return tuple(actions)


def salvage(path: str) -> Entry | None:
    """A ``resumable`` entry for the worker whose corrupt entry file is ``path``, built from what
    its bytes still say: its identity (a pi agent with its cwd, whose session file is there),
    parent, task ref and summary. None when they say too little to resume it by."""
    name = os.path.basename(path)
    key = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else ""
    if not is_key(key) or parse_key(key)[0] is not Role.WORKER:
        return None
    try:
        raw = strictjson.loads(read_state_file(path, max_bytes=1024 * 1024), max_bytes=1024 * 1024)
        identity = structure(raw.get("identity") if isinstance(raw, dict) else None, AgentIdentityContract)
    except (PiMatrixError, strictjson.StrictJSONError, ValueError, OSError):
        return None
    assert isinstance(raw, dict)
    session = identity.session_file
    if identity.key(Role.WORKER) != key or not identity.relaunchable:
        return None
    if not session or not os.path.isfile(session):
        return None
    task_ref = raw.get("taskRef") if isinstance(raw.get("taskRef"), str) else None
    summary = str(raw["taskSummary"]) if isinstance(raw.get("taskSummary"), str) else ""
    parent = raw.get("parentSessionId") if isinstance(raw.get("parentSessionId"), str) else None
    now = now_ms()
    try:
        payload = ResumablePayload(
            identity=identity, reason="repaired", at=now, task_ref=task_ref, task_summary=summary
        )
        return Entry(
            key=key,
            role=Role.WORKER,
            status=Status.RESUMABLE,
            identity=identity,
            created_at=now,
            updated_at=now,
            reason="repaired",
            parent_session_id=parent,
            task_ref=task_ref,
            task_summary=summary,
            resumable=payload,
        )
    except (PiMatrixError, ValueError, TypeError):
        return None


def _sweep_temps(store: EntryFiles, names: list[str], *, dry_run: bool) -> Iterator[RepairAction]:
    for name in names:
        if not (name.startswith(".") and name.endswith(TMP_SUFFIX)):
            continue
        key = name[1 : -len(TMP_SUFFIX)]
        if not is_key(key):
            continue
        yield RepairAction(str(store.root / name), "remove-temp", "left by a writer that died")
        if not dry_run:
            with store.locked(key):
                pass  # taking the lock sweeps the temp


def _quarantine(store: EntryFiles, name: str, target: str) -> None:
    key = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else None
    fd = open_dir(store.root / QUARANTINE, create=True)
    if fd is not None:
        os.close(fd)
    if key is not None and is_key(key):
        with store.locked(key) as root_fd:
            # Re-check under the lock: a writer may have repaired it meanwhile.
            try:
                store.find(key)
                return
            except CorruptEntry:
                pass
            _move(store.root / name, target)
            # The entry is gone from the matrix as surely as a removed one: its mailbox and lock
            # file go with it (the evidence is the file itself, kept in quarantine/).
            store.drop_leftovers(root_fd, key)
    else:
        _move(store.root / name, target)


def _move(source: Path, target: str) -> None:
    if os.path.lexists(target):  # pragma: no cover - names carry a timestamp and random suffix
        raise StoreError(f"{target}: already exists; retry repair", path=target)
    try:
        os.rename(source, target)  # renames the symlink/FIFO itself, never its target
    except OSError as exc:
        raise StoreError(
            f"{source}: cannot move to quarantine ({exc.strerror})", path=str(source), errno=exc.errno
        ) from None
