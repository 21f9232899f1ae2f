"""The entry store: the only code that touches entry files (``<state dir>/<key>.json``).

Writes take the entry's lock, re-read, and replace or delete only if the generation token the
caller observed is still on disk; every write mints a fresh token. The write itself is
:func:`~.fsio.durable_write` (temp file -> fsync -> rename over the entry -> fsync the
directory), so a reader or a crash sees the whole old version or the whole new one. Readers
take no lock.

This room owns :class:`MatrixStore` (the entries: lock, CAS, get/find/list/create/register/
update/replace/delete) and :class:`ListResult`. The state dir's layout, safe opening and lock
files are :mod:`.statedir`'s, the bytes on disk :mod:`.fsio`'s, quarantine :mod:`.repair`'s and
the other record kinds :mod:`.records`'. Their public names are re-exported here, where callers
have always imported them from.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Final

import attrs

from ..errors import (
    Conflict,
    CorruptEntry,
    EntryExists,
    NotFound,
    StoreError,
)
from ..identity import parse_key
from .codec import MAX_ENTRY_BYTES, DecodeError, decode_entry, encode_entry
from .fsio import (
    DIR_FLAGS,
    durable_unlink,
    durable_write,
    read_bounded,
    read_tail,
    remove_folder,
    remove_regular,
)
from .layout import MAILBOX, inbox_name, notices_name
from .model import MAX_HANDOFFS, Entry
from .records import RecordStore
from .repair import RepairAction, repair
from .statedir import RESERVED_DIRS, SUFFIX, TMP_SUFFIX, Problem, StateDir, is_key
from .tokens import new_token, now_ms

__all__ = [
    "Leftovers",
    "ListResult",
    "MatrixStore",
    "Problem",
    "RecordStore",
    "RepairAction",
    "durable_write",
    "new_token",
    "now_ms",
    "read_bounded",
    "read_tail",
]


@attrs.frozen
class ListResult:
    """Every valid entry (with its raw on-disk mapping), and every problem found."""

    entries: tuple[Entry, ...]
    raw: tuple[dict[str, object], ...]
    problems: tuple[Problem, ...]


@attrs.frozen
class Leftovers:
    """What :meth:`MatrixStore.drop_leftovers` freed (bytes), and the paths it left (relative to
    the state dir: not regular files, never followed or removed)."""

    freed: int
    left: tuple[str, ...]


log = logging.getLogger(__name__)

KNOWN_WRITES: Final = 256  # entries whose last write a store remembers (see _read_locked)


class MatrixStore(StateDir):
    """File-backed entries with per-entry locks and generation-token CAS."""

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout: float = 10.0) -> None:
        super().__init__(root, lock_timeout=lock_timeout)
        # key -> (the bytes this store last wrote there, the entry they encode); only ever
        # trusted after reading the same bytes back under the key's lock.
        self._written: dict[str, tuple[bytes, Entry]] = {}

    # -- locking ------------------------------------------------------------------------------
    @contextmanager
    def locked(self, key: str) -> Iterator[int]:
        """Hold ``key``'s lock; yields the state dir fd (created if needed)."""
        parse_key(key)
        with self.hold(f"{key}.lock", f"{key}: lock still held", "this entry") as root_fd:
            self._sweep_temp(root_fd, key)
            yield root_fd

    @staticmethod
    def _sweep_temp(root_fd: int, key: str) -> None:
        # Writes to a key are serialised by its lock, so one temp name per key suffices and any
        # temp found while holding the lock was left by a writer that died mid-write. Looked up
        # first: a lookup of an absent name takes no directory lock, an unlink does (under 50
        # writers ending at once, each unlink of nothing waited ~5 ms for the directory).
        temp = f".{key}{TMP_SUFFIX}"
        with suppress(FileNotFoundError):
            os.stat(temp, dir_fd=root_fd, follow_symlinks=False)
            os.unlink(temp, dir_fd=root_fd)

    # -- reading --------------------------------------------------------------------------------
    def _read(self, root_fd: int, key: str) -> Entry | None:
        """The entry for ``key``, None if absent; CorruptEntry if the file is not valid."""
        try:
            return self._read_file(root_fd, key)[0]
        except FileNotFoundError:
            return None

    def _read_file(self, root_fd: int, key: str) -> tuple[Entry, dict[str, object]]:
        name = key + SUFFIX
        path = f"{self.root}{os.sep}{name}"  # a plain string: pathlib costs ~8 us per entry
        data = read_bounded(root_fd, name, path, MAX_ENTRY_BYTES)
        try:
            return decode_entry(data, key)
        except DecodeError as exc:
            raise CorruptEntry(path, exc.reason, newer=exc.newer) from None

    def _read_locked(self, root_fd: int, key: str) -> Entry | None:
        """:meth:`_read` under ``key``'s lock. The file is always read (the CAS compares what is
        on disk now); when its bytes are exactly those this store last wrote there, the entry
        written is returned without decoding them again (a host's own heartbeats: ~15% of a CAS)."""
        name = key + SUFFIX
        path = f"{self.root}{os.sep}{name}"
        try:
            data = read_bounded(root_fd, name, path, MAX_ENTRY_BYTES)
        except FileNotFoundError:
            return None
        known = self._written.get(key)
        if known is not None and known[0] == data:
            return known[1]
        try:
            return decode_entry(data, key)[0]
        except DecodeError as exc:
            raise CorruptEntry(path, exc.reason, newer=exc.newer) from None

    def get(self, key: str) -> Entry:
        """The current entry for ``key`` (no lock: every read sees a whole version)."""
        parse_key(key)
        with self.open_root(create=False) as root_fd:
            if root_fd is None:
                raise NotFound(key)
            entry = self._read(root_fd, key)
        if entry is None:
            raise NotFound(key)
        return entry

    def find(self, key: str) -> Entry | None:
        """Like :meth:`get` but None when absent."""
        try:
            return self.get(key)
        except NotFound:
            return None

    def keys(self) -> list[str]:
        """The key of every file named like an entry, valid or not, sorted; nothing is read (a
        name a person typed is matched against these, so a corrupt entry can still be named)."""
        with self.open_root(create=False) as root_fd:
            if root_fd is None:
                return []
            names = os.listdir(root_fd)
        return sorted(
            name[: -len(SUFFIX)] for name in names if name.endswith(SUFFIX) and is_key(name[: -len(SUFFIX)])
        )

    def list(self) -> ListResult:
        """Every valid entry, sorted by key; every other file reported, nothing changed."""
        # A listing makes dozens of containers per entry and no cycles: left on, the cyclic
        # collector rescans the growing listing again and again (~6% of ls over 10,000 entries).
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._list()
        finally:
            if collecting:
                gc.enable()

    def _list(self) -> ListResult:
        entries: list[tuple[str, Entry, dict[str, object]]] = []
        problems: list[Problem] = []
        with self.open_root(create=False) as root_fd:
            if root_fd is None:
                return ListResult((), (), ())
            with os.scandir(root_fd) as scan:
                names = [(item.name, item.is_dir(follow_symlinks=False)) for item in scan]
            for name, is_dir in sorted(names):
                if name.startswith("."):
                    continue  # writes in flight (or a dead writer's temp, swept under the lock)
                path = f"{self.root}{os.sep}{name}"  # not pathlib: ~3 us per entry
                if is_dir and name in RESERVED_DIRS:
                    continue
                if not name.endswith(SUFFIX):
                    problems.append(Problem(path, "not an entry file (foreign)", "foreign"))
                    continue
                key = name[: -len(SUFFIX)]
                if not is_key(key):
                    problems.append(
                        Problem(path, "file name is not an entry key (<role>-<sessionId>.json)", "foreign")
                    )
                    continue
                try:
                    entry, raw = self._read_file(root_fd, key)
                except FileNotFoundError:
                    continue  # deleted while we listed
                except CorruptEntry as exc:
                    kind = "newer" if exc.newer else "corrupt"
                    problems.append(Problem(path, exc.reason, kind))
                    continue
                entries.append((key, entry, raw))
        return ListResult(tuple(e for _, e, _ in entries), tuple(r for _, _, r in entries), tuple(problems))

    # -- writing ----------------------------------------------------------------------------------
    def _write(self, root_fd: int, key: str, entry: Entry, *, exclusive: bool, sync_dir: bool = True) -> None:
        name = key + SUFFIX
        data = encode_entry(entry)
        self._written.pop(key, None)  # a failed write leaves nothing known
        path = f"{self.root}{os.sep}{name}"
        try:
            durable_write(root_fd, name, data, exclusive=exclusive, path=path, sync_dir=sync_dir)
        except FileExistsError:
            raise EntryExists(key, None) from None
        self._written[key] = (data, entry)
        if len(self._written) > KNOWN_WRITES:
            with suppress(KeyError, StopIteration, RuntimeError):
                del self._written[next(iter(self._written))]

    def _stamp(self, entry: Entry, *, register: bool) -> Entry:
        token = new_token()
        now = now_ms()
        if register:
            return attrs.evolve(entry, generation=token, registration=token, updated_at=now)
        return attrs.evolve(entry, generation=token, updated_at=now)

    def create(self, entry: Entry, *, sync_dir: bool = True) -> Entry:
        """Write a new entry; :class:`EntryExists` if the key is taken. Returns it stamped.
        ``sync_dir=False``: whole and visible, not made durable (see :func:`.fsio.durable_write`:
        only for an entry a crash makes moot)."""
        with self.locked(entry.key) as root_fd:
            found = self._try_read(root_fd, entry.key)
            if found is not None:
                raise EntryExists(entry.key, found)
            stamped = self._stamp(entry, register=True)
            self._write(root_fd, entry.key, stamped, exclusive=True, sync_dir=sync_dir)
            return stamped

    def register(
        self,
        entry: Entry,
        *,
        expected: str | None = None,
        check: Callable[[Entry | None], None] | None = None,
    ) -> Entry:
        """Write ``entry`` as a new process generation, whatever was there before (with
        ``expected``: only over that generation, else :class:`Conflict`).

        This is how a newer process of the same session takes ownership: every write of the
        older process after this one fails with :class:`Conflict`. Undelivered terminal
        handoffs of the previous record are carried over: they belong to the owner, not to
        the process generation that wrote them. ``check`` sees the record about to be replaced
        (None if there is none) under the lock, and refuses the registration by raising.
        """
        with self.locked(entry.key) as root_fd:
            # A corrupt file here raises CorruptEntry: it is evidence, never overwritten
            # without an explicit repair.
            previous = self._read(root_fd, entry.key)
            if expected is not None and (previous is None or previous.generation != expected):
                raise Conflict(entry.key, expected, None if previous is None else previous.generation)
            if check is not None:
                check(previous)
            if previous is not None and previous.undelivered:
                kept = tuple(h for h in previous.undelivered if h not in entry.handoffs)
                entry = attrs.evolve(entry, handoffs=(*kept, *entry.handoffs)[-MAX_HANDOFFS:])
            stamped = self._stamp(entry, register=True)
            self._write(root_fd, entry.key, stamped, exclusive=False)
            return stamped

    def _try_read(self, root_fd: int, key: str) -> str | None:
        """The generation on disk for ``key`` (``<corrupt>`` if unreadable), or None if absent."""
        try:
            entry = self._read(root_fd, key)
        except CorruptEntry:
            return "<corrupt>"
        return None if entry is None else entry.generation

    def update(
        self,
        key: str,
        change: Callable[[Entry], Entry | None],
        *,
        expected: str | None = None,
        registration: str | None = None,
        sync_dir: bool = True,
    ) -> Entry:
        """Re-read under the lock, apply ``change``, write the result under a fresh token.

        If ``expected`` is given the entry must still carry that generation (the exact write
        the caller observed); if ``registration`` is given it must still be that process
        generation (the owner's own writes: a directive written by a master in between is
        seen by ``change``, a newer registration is a :class:`Conflict`). ``change`` may return
        None to write nothing (the current entry is returned). A corrupt entry is never
        overwritten: :class:`CorruptEntry` is raised. ``sync_dir=False``: whole, not made durable
        (see :func:`.fsio.durable_write`), for a write a crash makes moot (a heartbeat).
        """
        with self.locked(key) as root_fd:
            current = self._read_locked(root_fd, key)
            if current is None:
                if expected is not None or registration is not None:
                    raise Conflict(key, expected or registration, None)
                raise NotFound(key)
            if expected is not None and current.generation != expected:
                raise Conflict(key, expected, current.generation)
            if registration is not None and current.registration != registration:
                raise Conflict(key, registration, current.registration)
            changed = change(current)
            if changed is None:
                return current
            if changed.key != key:
                raise StoreError(f"{key}: an update may not change the key (to {changed.key})")
            stamped = self._stamp(changed, register=False)
            self._write(root_fd, key, stamped, exclusive=False, sync_dir=sync_dir)
            return stamped

    def replace(self, key: str, expected: str, entry: Entry) -> Entry:
        """Replace the entry only if ``expected`` is still its generation."""
        return self.update(key, lambda _current: entry, expected=expected)

    def delete(self, key: str, expected: str) -> None:
        """Delete the entry only if ``expected`` is still its generation. What belonged to it
        alone goes with it (:meth:`drop_leftovers`): its host's mailbox, its agent's notices and
        its lock file. Its history (events, artifacts, logs) stays for the retention window."""
        with self.locked(key) as root_fd:
            current = self._read(root_fd, key)
            found = None if current is None else current.generation
            if found != expected:
                raise Conflict(key, expected, found)
            path = str(self.root / (key + SUFFIX))
            try:
                durable_unlink(root_fd, key + SUFFIX)
            except OSError as exc:
                raise StoreError(
                    f"{path}: delete failed ({exc.strerror})", path=path, errno=exc.errno
                ) from None
            self._written.pop(key, None)
            try:
                self.drop_leftovers(root_fd, key)
            except (OSError, StoreError) as exc:
                # The entry is gone (that was the write asked for); what is left of it is small
                # and the next gc takes it.
                log.warning("%s: deleted; its mailbox or lock file is left for gc (%s)", key, exc)

    def drop_leftovers(self, root_fd: int, key: str) -> Leftovers:
        """Remove what belonged to ``key``'s entry alone, once the entry file is gone: its host's
        mailbox (``mailbox/<key>/``: a message there is for a host that no longer exists), its
        agent's notices (``mailbox/<key>.agent.jsonl``), then its lock file. Only under the key's
        lock (:meth:`locked`), which it removes last: a writer queued on it moves to a new one.
        Anything there that is not a regular file is left and named, never followed."""
        freed = 0
        left: list[str] = []
        try:
            mail_fd: int | None = os.open(MAILBOX, DIR_FLAGS, dir_fd=root_fd)
        except FileNotFoundError:
            mail_fd = None
        except OSError:
            mail_fd, left = None, [MAILBOX]  # a symlink or a file there: nothing taken from it
        if mail_fd is not None:
            try:
                got, kept = remove_folder(mail_fd, inbox_name(key))
                freed += got
                left += [f"{MAILBOX}/{name}" for name in kept]
                size = remove_regular(mail_fd, notices_name(key))
                if size is None:
                    left.append(f"{MAILBOX}/{notices_name(key)}")
                else:
                    freed += size
            finally:
                os.close(mail_fd)
        self.drop_lock(root_fd, f"{key}.lock")
        return Leftovers(freed, tuple(left))

    # -- repair -----------------------------------------------------------------------------------
    def repair(self, *, dry_run: bool = False) -> tuple[RepairAction, ...]:
        """Move corrupt and foreign files to ``quarantine/``; remove dead writers' temp files.

        See :func:`.repair.repair`: files written by a newer pi-matrix are reported and left
        alone; with ``dry_run`` nothing is created, locked, moved or removed.
        """
        return repair(self, dry_run=dry_run)
