"""Records: small JSON documents of one kind beside the entries (dispatcher jobs, agent results, fork runs).

:class:`RecordStore` gives a record directory ``<state dir>/<kind>/`` the entries' guarantees: a
per-record lock, durable atomic writes, exclusive create (exactly one result per marker), strict
bounded reads, and corrupt files reported, never deleted. Its records are plain JSON objects.

:class:`Records` is the typed face every owner shares: records of one attrs class, encoded and
decoded by the one converter of :mod:`.codec`, with the checks each owner used to repeat (a
record written by a newer pi-matrix is reported, not misread; a record's own id must match its
file name; a record that does not structure is a :class:`CorruptEntry` naming its file).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from .. import strictjson
from ..errors import CorruptEntry
from ..identity import ID_PATTERN, validate_id
from ..strictjson import JSONObject
from .codec import MAX_ENTRY_BYTES, DecodeError, structure, unstructure
from .fsio import durable_unlink, durable_write, opened_dir, read_bounded
from .statedir import LOCKS, QUARANTINE, RESERVED_DIRS, SUFFIX, Problem, StateDir

__all__ = ["RecordStore", "Records"]

if TYPE_CHECKING:
    from attrs import AttrsInstance

T = TypeVar("T", bound="AttrsInstance")  # records are attrs classes: the codec reads and writes them


class RecordStore:
    """Small JSON documents of one kind beside the entries (dispatcher jobs, agent results).

    The entries' guarantees, in ``<state dir>/<kind>/``: a per-record lock, durable atomic
    writes, exclusive create (exactly one result per marker), strict bounded reads, and corrupt
    files reported, never deleted. Records are plain JSON objects; their owners give them types
    (most through :class:`Records`).
    """

    def __init__(self, store: StateDir, kind: str, *, folders: bool = False) -> None:
        if kind not in RESERVED_DIRS or kind in (LOCKS, QUARANTINE):
            raise ValueError(f"{kind!r} is not a record directory")
        self.store = store
        self.kind = kind
        self.root = store.root / kind
        # Records that own a folder of files beside them (<kind>/<name>/, e.g. a fork run's).
        self.folders = folders

    def folder(self, name: str) -> Path:
        """``<kind>/<name>/``, created 0700 with the state dir's checks (records with folders)."""
        validate_id(name, f"{self.kind} record name")
        return self.store.side_dir(self.kind, name)

    def _name(self, name: str) -> str:
        validate_id(name, f"{self.kind} record name")
        return name + SUFFIX

    def _dir_fd(self, *, create: bool) -> AbstractContextManager[int | None]:
        if create:
            self.store.side_dir(self.kind)
        return opened_dir(self.root, create=False)

    @contextmanager
    def locked(self, name: str) -> Iterator[int]:
        """Hold the record's lock; yields the record dir fd (created if needed)."""
        file_name = self._name(name)
        lock = f"{self.kind}.{name}.lock"  # entry locks are <role>-<id>.lock: no collision
        held = self.store.hold(lock, f"{self.kind}/{name}: lock still held", "this record")
        with held, self._dir_fd(create=True) as fd:
            assert fd is not None
            with suppress(FileNotFoundError):
                os.unlink(f".{file_name}.tmp", dir_fd=fd)  # a dead writer's temp
            yield fd

    def _decode(self, data: bytes, path: str) -> JSONObject:
        try:
            value = strictjson.loads(data, max_bytes=MAX_ENTRY_BYTES)
        except strictjson.StrictJSONError as exc:
            raise CorruptEntry(path, str(exc)) from None
        if not isinstance(value, dict):
            raise CorruptEntry(path, f"is JSON {type(value).__name__}, not an object")
        return value

    def _read(self, fd: int, name: str) -> JSONObject | None:
        file_name = self._name(name)
        path = str(self.root / file_name)
        try:
            return self._decode(read_bounded(fd, file_name, path, MAX_ENTRY_BYTES), path)
        except FileNotFoundError:
            return None

    def _write(
        self, fd: int, name: str, record: JSONObject, *, exclusive: bool, sync_dir: bool = True
    ) -> None:
        file_name = self._name(name)
        data = (json.dumps(record) + "\n").encode()
        path = str(self.root / file_name)
        durable_write(fd, file_name, data, exclusive=exclusive, path=path, sync_dir=sync_dir)

    def get(self, name: str) -> JSONObject | None:
        """The record, None if absent (no lock: every read sees a whole version)."""
        self._name(name)
        with self._dir_fd(create=False) as fd:
            return None if fd is None else self._read(fd, name)

    def put(self, name: str, record: JSONObject, *, exclusive: bool = False, sync_dir: bool = True) -> bool:
        """Write the record; with ``exclusive`` only if absent (False when it was taken).
        ``sync_dir=False``: whole but not yet durable (see :func:`~.fsio.durable_write`)."""
        with self.locked(name) as fd:
            try:
                self._write(fd, name, record, exclusive=exclusive, sync_dir=sync_dir)
            except FileExistsError:
                return False
        return True

    def update(
        self, name: str, change: Callable[[JSONObject | None], JSONObject | None], *, sync_dir: bool = True
    ) -> JSONObject | None:
        """Read, change and write under the record's lock; ``change`` returning None writes nothing.
        ``sync_dir=False``: whole but not yet durable (see :func:`~.fsio.durable_write`)."""
        with self.locked(name) as fd:
            current = self._read(fd, name)
            changed = change(current)
            if changed is None:
                return current
            self._write(fd, name, changed, exclusive=False, sync_dir=sync_dir)
            return changed

    def names(self) -> list[str]:
        """The name of every file named like a record, valid or not, sorted; nothing is read."""
        with self._dir_fd(create=False) as fd:
            if fd is None:
                return []
            files = os.listdir(fd)
        return sorted(
            f[: -len(SUFFIX)] for f in files if f.endswith(SUFFIX) and ID_PATTERN.fullmatch(f[: -len(SUFFIX)])
        )

    def list(self) -> tuple[list[tuple[str, JSONObject]], list[Problem]]:
        """Every valid record by name, and a problem for every other file."""
        records: list[tuple[str, JSONObject]] = []
        problems: list[Problem] = []
        with self._dir_fd(create=False) as fd:
            if fd is None:
                return records, problems
            for file_name in sorted(os.listdir(fd)):
                if file_name.startswith(".") or self._is_own_folder(fd, file_name):
                    continue
                path = str(self.root / file_name)
                name = file_name[: -len(SUFFIX)] if file_name.endswith(SUFFIX) else ""
                if not name or ID_PATTERN.fullmatch(name) is None:
                    problems.append(Problem(path, f"not a {self.kind} record (foreign)", "foreign"))
                    continue
                try:
                    record = self._read(fd, name)
                except CorruptEntry as exc:
                    problems.append(Problem(path, exc.reason, "corrupt"))
                    continue
                if record is not None:
                    records.append((name, record))
        return records, problems

    def _is_own_folder(self, fd: int, file_name: str) -> bool:
        """Whether ``file_name`` is a record's own folder (kinds with folders), not a stray file."""
        if not self.folders or file_name.endswith(SUFFIX) or not ID_PATTERN.fullmatch(file_name):
            return False
        try:
            return stat.S_ISDIR(os.stat(file_name, dir_fd=fd, follow_symlinks=False).st_mode)
        except OSError:
            return False

    def delete(self, name: str) -> bool:
        """Remove the record and its lock file (True if it was there)."""
        file_name = self._name(name)
        lock = f"{self.kind}.{name}.lock"
        with self.store.hold(lock, f"{self.kind}/{name}: lock still held", "this record") as root_fd:
            with self._dir_fd(create=False) as fd:
                try:
                    if fd is None:
                        raise FileNotFoundError(file_name)
                    durable_unlink(fd, file_name)
                    existed = True
                except FileNotFoundError:
                    existed = False
            self.store.drop_lock(root_fd, lock)
        return existed

    def delete_if(
        self,
        name: str,
        keep: Callable[[JSONObject | None], str | None],
        first: Callable[[], None] | None = None,
    ) -> str | None:
        """Under the record's lock: read it (None if absent), ask ``keep`` for a reason to keep
        it, and if it gives none run ``first`` (what goes with the record: a job's results, a run's
        folder) and remove the record and its lock file (the history sweep's removal: not
        fsynced). Returns the reason it was kept, None when removed. A record that cannot be read
        is kept (``keep`` is not asked)."""
        file_name = self._name(name)
        lock = f"{self.kind}.{name}.lock"
        with self.store.hold(lock, f"{self.kind}/{name}: lock still held", "this record") as root_fd:
            with self._dir_fd(create=False) as fd:
                try:
                    current = None if fd is None else self._read(fd, name)
                except CorruptEntry as exc:
                    return f"unreadable ({exc.reason})"
                why = keep(current)
                if why is not None:
                    return why
                if first is not None:
                    first()
                if fd is not None:
                    # Not fsynced (a sweep removes hundreds): a removal a crash undoes is done
                    # again by the next sweep, as fsio.remove_regular says.
                    for gone in (f".{file_name}.tmp", file_name):  # a dead writer's temp, the record
                        with suppress(FileNotFoundError):
                            os.unlink(gone, dir_fd=fd)
            self.store.drop_lock(root_fd, lock)
        return None


class Records(Generic[T]):
    """Records of one attrs class ``cls`` in ``<state dir>/<kind>/``, through the one converter.

    ``newest`` is the newest ``schemaVersion`` this pi-matrix reads: a newer record is a
    :class:`CorruptEntry` that says to upgrade, never a misread. ``own_name`` gives a record's
    own id, which must match its file name. ``missing`` makes the owner's error for an absent
    record (:meth:`get`, :meth:`update`); a kind only ever read with :meth:`find` needs none.
    """

    def __init__(
        self,
        store: StateDir,
        kind: str,
        cls: type[T],
        *,
        newest: int | None = None,
        own_name: Callable[[T], str] | None = None,
        missing: Callable[[str], Exception] | None = None,
        folders: bool = False,
    ) -> None:
        self.files = RecordStore(store, kind, folders=folders)
        self.cls = cls
        self.newest = newest
        self.own_name = own_name
        self.missing = missing

    @property
    def root(self) -> Path:
        """``<state dir>/<kind>``."""
        return self.files.root

    def path(self, name: str) -> str:
        """The record's file, as errors and problems name it."""
        return str(self.files.root / f"{name}{SUFFIX}")

    def folder(self, name: str) -> Path:
        """The record's own folder (kinds with folders), created 0700."""
        return self.files.folder(name)

    def locked(self, name: str) -> AbstractContextManager[int]:
        """Hold the record's (or any other name's) lock in this kind's directory."""
        return self.files.locked(name)

    def decode(self, raw: JSONObject, name: str) -> T:
        """The record ``name`` from its raw mapping; :class:`CorruptEntry` if it is not one."""
        version = raw.get("schemaVersion")
        if self.newest is not None and type(version) is int and version > self.newest:
            why = f"written by a newer pi-matrix (schemaVersion {version})"
            raise CorruptEntry(self.path(name), why, newer=True)
        try:
            record = structure(raw, self.cls)
        except DecodeError as exc:
            raise CorruptEntry(self.path(name), exc.reason) from None
        if self.own_name is not None and (own := self.own_name(record)) != name:
            raise CorruptEntry(self.path(name), f"inner id {own!r} differs from the name")
        return record

    @staticmethod
    def encode(record: T) -> JSONObject:
        """The on-disk (camelCase) mapping of ``record``."""
        raw: JSONObject = unstructure(record)
        return raw

    def find(self, name: str) -> T | None:
        """The record, None if absent (no lock: every read sees a whole version)."""
        raw = self.files.get(name)
        return None if raw is None else self.decode(raw, name)

    def get(self, name: str) -> T:
        """The record; the owner's ``missing`` error if absent."""
        record = self.find(name)
        if record is None:
            raise self._missing(name)
        return record

    def put(self, name: str, record: T, *, exclusive: bool = False, sync_dir: bool = True) -> bool:
        """Write the record; with ``exclusive`` only if absent (False when it was taken).
        ``sync_dir=False``: whole but not yet durable (see :func:`~.fsio.durable_write`)."""
        return self.files.put(name, self.encode(record), exclusive=exclusive, sync_dir=sync_dir)

    def update(self, name: str, change: Callable[[T], T | None], *, sync_dir: bool = True) -> T:
        """Change the record under its lock (``change`` returning None writes nothing); returns
        what is on disk afterwards. The owner's ``missing`` error if absent. ``sync_dir=False``:
        whole but not yet durable (see :func:`~.fsio.durable_write`)."""
        seen: list[T] = []

        def apply(raw: JSONObject | None) -> JSONObject | None:
            if raw is None:
                raise self._missing(name)
            current = self.decode(raw, name)
            changed = change(current)
            seen.append(current if changed is None else changed)
            return None if changed is None else self.encode(changed)

        self.files.update(name, apply, sync_dir=sync_dir)
        return seen[-1]

    def names(self) -> list[str]:
        """Every record's name, valid or not (see :meth:`RecordStore.names`)."""
        return self.files.names()

    def list(self) -> tuple[list[T], list[Problem]]:
        """Every valid record, by file name, and a problem for every other file."""
        raws, problems = self.files.list()
        records: list[T] = []
        for name, raw in raws:
            try:
                records.append(self.decode(raw, name))
            except CorruptEntry as exc:
                problems.append(Problem(self.path(name), exc.reason, "newer" if exc.newer else "corrupt"))
        return records, problems

    def delete(self, name: str) -> bool:
        """Remove the record and its lock file (True if it was there)."""
        return self.files.delete(name)

    def delete_if(
        self, name: str, keep: Callable[[T], str | None], first: Callable[[], None] | None = None
    ) -> str | None:
        """:meth:`RecordStore.delete_if` through the typed record: ``keep`` sees it decoded (an
        absent record is kept as ``absent``, one that does not decode as unreadable)."""

        def judge(raw: JSONObject | None) -> str | None:
            if raw is None:
                return "absent"
            try:
                return keep(self.decode(raw, name))
            except CorruptEntry as exc:
                return f"unreadable ({exc.reason})"

        return self.files.delete_if(name, judge, first)

    def _missing(self, name: str) -> Exception:
        if self.missing is None:  # a programming error: this kind is only read with find
            return KeyError(f"{self.files.kind}/{name}")
        return self.missing(name)
