"""The entry store: the only code that touches entry files.

Layout under the state dir (0700, owned by the user, never a symlink)::

    <key>.json            one entry per registered process (0600)
    .<key>.json.tmp       a write in flight (or left by a killed writer; swept under the lock)
    locks/<key>.lock      the per-entry flock; never unlinked while the entry may live
    quarantine/           corrupt or foreign files moved aside by ``repair`` (never deleted)

Writes take the entry's lock, re-read, and replace or delete only if the generation token the
caller observed is still on disk; every write mints a fresh token. The write itself is temp file
(O_EXCL|O_NOFOLLOW, 0600) -> fsync -> rename over the entry -> fsync the directory, so a reader
or a crash sees the whole old version or the whole new one. Readers take no lock.
"""

from __future__ import annotations

import builtins
import errno
import itertools
import json
import os
import secrets
import stat
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Final

import attrs

from .. import strictjson
from ..errors import (
    Conflict,
    CorruptEntry,
    EntryExists,
    LockUnavailable,
    NotFound,
    StateDirError,
    StoreError,
)
from ..identity import ID_PATTERN, parse_key, validate_id
from .codec import MAX_ENTRY_BYTES, DecodeError, decode_entry, encode_entry
from .locks import LockError, LockTimeout, entry_lock
from .model import MAX_HANDOFFS, Entry

__all__ = [
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

SUFFIX: Final = ".json"
TMP_SUFFIX: Final = ".json.tmp"
LOCKS: Final = "locks"
QUARANTINE: Final = "quarantine"
# Sub-directories the matrix itself keeps beside the entries; never reported as foreign.
RESERVED_DIRS: Final = frozenset(
    {LOCKS, QUARANTINE, "events", "mailbox", "results", "runs", "jobs", "logs", "artifacts"}
)

_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC
_CREATE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC
_DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC


# --- seams: tests replace these to force error branches (EIO, ENOSPC) -----------------------
def _fsync(fd: int) -> None:
    os.fsync(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def durable_write(dir_fd: int, name: str, data: bytes, *, exclusive: bool, path: str) -> None:
    """Write ``name`` in ``dir_fd`` so a crash leaves the whole old or the whole new version.

    temp (``O_EXCL``, 0600) -> fsync -> rename (``link`` when ``exclusive``: FileExistsError if
    the name is taken) -> fsync the directory. The caller holds the name's lock, which is what
    makes the one fixed temp name per file safe. Any failure is a StoreError and the write was
    not acknowledged.
    """
    tmp = f".{name}.tmp"
    try:
        fd = os.open(tmp, _CREATE_FLAGS, 0o600, dir_fd=dir_fd)
    except OSError as exc:
        raise StoreError(f"{path}: cannot write ({exc.strerror})", path=path, errno=exc.errno) from None
    committed = False
    try:
        try:
            # O_CREAT's mode is filtered by the umask (000 -> fine, 277 -> unwritable); the
            # file is 0600 whatever the umask.
            os.fchmod(fd, 0o600)
            _write_all(fd, data)
            _fsync(fd)
        finally:
            os.close(fd)
        if exclusive:
            os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            committed = True
            # The file is in place; the temp name is only a second link to it now, and a
            # leftover one is swept under the lock by the next writer.
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)
        else:
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            committed = True
        _fsync(dir_fd)
    except FileExistsError:
        raise
    except OSError as exc:
        note = "; the new version is in place but may not survive a crash" if committed else ""
        raise StoreError(
            f"{path}: write failed ({exc.strerror}){note}; the change was not acknowledged",
            path=path,
            errno=exc.errno,
        ) from None
    finally:
        if not committed:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)


def read_bounded(dir_fd: int, name: str, path: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, never following a symlink and never
    blocking on a FIFO. FileNotFoundError if absent; CorruptEntry (with the reason) otherwise."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptEntry(path, "is a symlink (never followed)") from None
        raise CorruptEntry(path, f"cannot open ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptEntry(path, f"is not a regular file ({_kind(info.st_mode)})")
        if info.st_size > max_bytes:
            raise CorruptEntry(path, f"is {info.st_size} bytes, over the {max_bytes} byte cap")
        return os.read(fd, info.st_size + 1)  # not the cap: a 1 MiB buffer per read costs
    except OSError as exc:
        raise CorruptEntry(path, f"cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)


def read_tail(dir_fd: int, name: str, path: str, max_bytes: int) -> bytes:
    """The last ``max_bytes`` of a regular file (a growing log read while it is written), with
    :func:`read_bounded`'s rules: never a symlink, never a FIFO."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise CorruptEntry(path, f"cannot open ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptEntry(path, f"is not a regular file ({_kind(info.st_mode)})")
        return os.pread(fd, max_bytes, max(0, info.st_size - max_bytes))
    except OSError as exc:
        raise CorruptEntry(path, f"cannot read ({exc.strerror})") from None
    finally:
        os.close(fd)


# --- generation tokens -----------------------------------------------------------------------
_incarnation = secrets.token_hex(8)
_counter = itertools.count(1)


def _reset_tokens_after_fork() -> None:
    # A forked child must never mint a token its parent also mints.
    global _incarnation, _counter  # noqa: PLW0603
    _incarnation = secrets.token_hex(8)
    _counter = itertools.count(1)


os.register_at_fork(after_in_child=_reset_tokens_after_fork)


def new_token() -> str:
    """A token never minted before by any process: random incarnation + a counter."""
    return f"{_incarnation}-{next(_counter)}"


def now_ms() -> int:
    """Wall-clock milliseconds; records are for humans and expiry, never for liveness."""
    return time.time_ns() // 1_000_000


# --- results -----------------------------------------------------------------------------------
@attrs.frozen
class Problem:
    """A file in the state dir that is not a valid entry."""

    path: str
    reason: str
    kind: str  # "corrupt" | "foreign" | "newer"

    def line(self) -> str:
        """One line for stderr: path and reason."""
        return f"{self.path}: {self.reason}"


@attrs.frozen
class ListResult:
    """Every valid entry (with its raw on-disk mapping), and every problem found."""

    entries: tuple[Entry, ...]
    raw: tuple[dict[str, object], ...]
    problems: tuple[Problem, ...]


@attrs.frozen
class RepairAction:
    """What ``repair`` did (or, dry, would do) with one file."""

    path: str
    action: str  # "quarantine" | "remove-temp" | "skip"
    reason: str
    target: str | None = None


# --- the store ---------------------------------------------------------------------------------
class MatrixStore:
    """File-backed entries with per-entry locks and generation-token CAS."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        lock_timeout: float = 10.0,
    ) -> None:
        self.root = Path(root)
        self.lock_timeout = lock_timeout

    # -- directories ------------------------------------------------------------------------
    def _check_dir(self, fd: int, path: Path) -> None:
        info = os.fstat(fd)
        if not stat.S_ISDIR(info.st_mode):  # pragma: no cover - O_DIRECTORY guarantees this
            raise StateDirError(f"{path}: not a directory", path=str(path))
        if info.st_uid != os.geteuid():
            raise StateDirError(
                f"{path}: owned by uid {info.st_uid}, not by you (uid {os.geteuid()}); "
                "use a state dir of your own (--state-dir or PI_MATRIX_STATE_DIR)",
                path=str(path),
            )
        if info.st_mode & 0o077:
            raise StateDirError(
                f"{path}: mode {stat.S_IMODE(info.st_mode):04o} lets others in; run 'chmod 700 {path}'",
                path=str(path),
            )

    def _open_dir(self, path: Path, *, create: bool) -> int | None:
        """An fd for ``path`` after the safety checks; None if it is absent and not created."""
        for attempt in range(2):
            try:
                fd = os.open(path, _DIR_FLAGS)
            except FileNotFoundError:
                if not create or attempt:
                    return None
                self._make_dir(path)
                continue
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise StateDirError(
                        f"{path}: is a symlink or not a directory; point the state dir at a real "
                        "directory (--state-dir or PI_MATRIX_STATE_DIR)",
                        path=str(path),
                        errno=exc.errno,
                    ) from None
                raise StoreError(
                    f"{path}: cannot open ({exc.strerror})", path=str(path), errno=exc.errno
                ) from None
            try:
                self._check_dir(fd, path)
            except BaseException:
                os.close(fd)
                raise
            return fd
        return None  # pragma: no cover

    @staticmethod
    def _make_dir(path: Path) -> None:
        missing = []
        probe = path
        while not probe.exists() and probe != probe.parent:
            missing.append(probe)
            probe = probe.parent
        for directory in reversed(missing):
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:
                continue
            except OSError as exc:
                raise StoreError(
                    f"{directory}: cannot create the state dir ({exc.strerror})",
                    path=str(directory),
                    errno=exc.errno,
                ) from None
            # mkdir's mode is filtered by the umask; the state dir is 0700 whatever the umask.
            os.chmod(directory, 0o700)

    @contextmanager
    def _root_fd(self, *, create: bool) -> Iterator[int | None]:
        fd = self._open_dir(self.root, create=create)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    def side_dir(self, *parts: str) -> Path:
        """``<state dir>/<parts…>`` created 0700 with the state dir's checks (mailboxes, events)."""
        path = self.root
        for part in (None, *parts):
            if part is not None:
                path = path / part
            fd = self._open_dir(path, create=True)
            if fd is not None:
                os.close(fd)
        return path

    def exists(self) -> bool:
        """Whether the state dir exists (nothing is created by asking)."""
        return os.path.lexists(self.root)

    # -- locking ------------------------------------------------------------------------------
    @contextmanager
    def locked(self, key: str) -> Iterator[int]:
        """Hold ``key``'s lock; yields the state dir fd (created if needed)."""
        parse_key(key)
        with self._hold(f"{key}.lock", f"{key}: lock still held", "this entry") as root_fd:
            self._sweep_temp(root_fd, key)
            yield root_fd

    @contextmanager
    def _hold(self, lock_name: str, what: str, writing: str) -> Iterator[int]:
        """Hold ``locks/<lock_name>``; yields the state dir fd (created if needed)."""
        with self._root_fd(create=True) as root_fd:
            assert root_fd is not None
            locks_fd = self._locks_fd(root_fd)
            path = str(self.root / LOCKS / lock_name)
            try:
                with entry_lock(locks_fd, lock_name, path, self.lock_timeout):
                    yield root_fd
            except LockTimeout:
                raise LockUnavailable(
                    f"{what} after {self.lock_timeout:.0f}s; another pi-matrix process is writing "
                    f"{writing}, retry shortly",
                    path=path,
                ) from None
            except LockError as exc:
                raise LockUnavailable(
                    f"{path}: cannot take a real file lock ({exc.strerror}); the state dir must be "
                    "on a local filesystem that supports flock",
                    path=path,
                    errno=exc.errno,
                ) from None
            finally:
                os.close(locks_fd)

    def _locks_fd(self, root_fd: int) -> int:
        try:
            fd = os.open(LOCKS, _DIR_FLAGS, dir_fd=root_fd)
        except FileNotFoundError:
            with suppress(FileExistsError):
                os.mkdir(LOCKS, 0o700, dir_fd=root_fd)
            fd = os.open(LOCKS, _DIR_FLAGS, dir_fd=root_fd)
            os.fchmod(fd, 0o700)
        except OSError as exc:
            path = self.root / LOCKS
            raise StateDirError(
                f"{path}: is a symlink or not a directory ({exc.strerror}); move it aside",
                path=str(path),
                errno=exc.errno,
            ) from None
        try:
            self._check_dir(fd, self.root / LOCKS)
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def _sweep_temp(root_fd: int, key: str) -> None:
        # Writes to a key are serialised by its lock, so one temp name per key suffices and any
        # temp found while holding the lock was left by a writer that died mid-write.
        with suppress(FileNotFoundError):
            os.unlink(f".{key}{TMP_SUFFIX}", dir_fd=root_fd)

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
            error = CorruptEntry(path, exc.reason)
            error.newer = exc.newer  # type: ignore[attr-defined]
            raise error from None

    def get(self, key: str) -> Entry:
        """The current entry for ``key`` (no lock: every read sees a whole version)."""
        parse_key(key)
        with self._root_fd(create=False) as root_fd:
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

    def list(self) -> ListResult:
        """Every valid entry, sorted by key; every other file reported, nothing changed."""
        entries: list[tuple[str, Entry, dict[str, object]]] = []
        problems: list[Problem] = []
        with self._root_fd(create=False) as root_fd:
            if root_fd is None:
                return ListResult((), (), ())
            with os.scandir(root_fd) as scan:
                names = [(item.name, item.is_dir(follow_symlinks=False)) for item in scan]
            for name, is_dir in sorted(names):
                if name.startswith("."):
                    continue  # writes in flight (or a dead writer's temp, swept under the lock)
                path = str(self.root / name)
                if is_dir and name in RESERVED_DIRS:
                    continue
                if not name.endswith(SUFFIX):
                    problems.append(Problem(path, "not an entry file (foreign)", "foreign"))
                    continue
                key = name[: -len(SUFFIX)]
                if not _is_key(key):
                    problems.append(
                        Problem(path, "file name is not an entry key (<role>-<sessionId>.json)", "foreign")
                    )
                    continue
                try:
                    entry, raw = self._read_file(root_fd, key)
                except FileNotFoundError:
                    continue  # deleted while we listed
                except CorruptEntry as exc:
                    kind = "newer" if getattr(exc, "newer", False) else "corrupt"
                    problems.append(Problem(path, exc.reason, kind))
                    continue
                entries.append((key, entry, raw))
        return ListResult(tuple(e for _, e, _ in entries), tuple(r for _, _, r in entries), tuple(problems))

    # -- writing ----------------------------------------------------------------------------------
    def _write(self, root_fd: int, key: str, entry: Entry, *, exclusive: bool) -> None:
        name = key + SUFFIX
        try:
            durable_write(root_fd, name, encode_entry(entry), exclusive=exclusive, path=str(self.root / name))
        except FileExistsError:
            raise EntryExists(key, None) from None

    def _stamp(self, entry: Entry, *, register: bool) -> Entry:
        token = new_token()
        now = now_ms()
        if register:
            return attrs.evolve(entry, generation=token, registration=token, updated_at=now)
        return attrs.evolve(entry, generation=token, updated_at=now)

    def create(self, entry: Entry) -> Entry:
        """Write a new entry; :class:`EntryExists` if the key is taken. Returns it stamped."""
        with self.locked(entry.key) as root_fd:
            found = self._try_read(root_fd, entry.key)
            if found is not None:
                raise EntryExists(entry.key, found)
            stamped = self._stamp(entry, register=True)
            self._write(root_fd, entry.key, stamped, exclusive=True)
            return stamped

    def register(self, entry: Entry) -> Entry:
        """Write ``entry`` as a new process generation, whatever was there before.

        This is how a newer process of the same session takes ownership: every write of the
        older process after this one fails with :class:`Conflict`. Undelivered terminal
        handoffs of the previous record are carried over: they belong to the owner, not to
        the process generation that wrote them.
        """
        with self.locked(entry.key) as root_fd:
            # A corrupt file here raises CorruptEntry: it is evidence, never overwritten
            # without an explicit repair.
            previous = self._read(root_fd, entry.key)
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
    ) -> Entry:
        """Re-read under the lock, apply ``change``, write the result under a fresh token.

        If ``expected`` is given the entry must still carry that generation (the exact write
        the caller observed); if ``registration`` is given it must still be that process
        generation (the owner's own writes: a directive written by a master in between is
        seen by ``change``, a newer registration is a :class:`Conflict`). ``change`` may return
        None to write nothing (the current entry is returned). A corrupt entry is never
        overwritten: :class:`CorruptEntry` is raised.
        """
        with self.locked(key) as root_fd:
            current = self._read(root_fd, key)
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
            self._write(root_fd, key, stamped, exclusive=False)
            return stamped

    def replace(self, key: str, expected: str, entry: Entry) -> Entry:
        """Replace the entry only if ``expected`` is still its generation."""
        return self.update(key, lambda _current: entry, expected=expected)

    def delete(self, key: str, expected: str) -> None:
        """Delete the entry only if ``expected`` is still its generation. The lock file stays."""
        with self.locked(key) as root_fd:
            current = self._read(root_fd, key)
            found = None if current is None else current.generation
            if found != expected:
                raise Conflict(key, expected, found)
            path = str(self.root / (key + SUFFIX))
            try:
                os.unlink(key + SUFFIX, dir_fd=root_fd)
                _fsync(root_fd)
            except OSError as exc:
                raise StoreError(
                    f"{path}: delete failed ({exc.strerror})", path=path, errno=exc.errno
                ) from None

    # -- repair -----------------------------------------------------------------------------------
    def repair(self, *, dry_run: bool = False) -> tuple[RepairAction, ...]:
        """Move corrupt and foreign files to ``quarantine/``; remove dead writers' temp files.

        Files written by a newer pi-matrix are reported and left alone. With ``dry_run`` nothing
        is created, locked, moved or removed.
        """
        actions: builtins.list[RepairAction] = []
        with self._root_fd(create=False) as root_fd:
            if root_fd is None:
                return ()
            with os.scandir(root_fd) as scan:
                names = sorted(item.name for item in scan)
        temps = [n for n in names if n.startswith(".") and n.endswith(TMP_SUFFIX)]
        for name in temps:
            key = name[1 : -len(TMP_SUFFIX)]
            if not _is_key(key):
                continue
            actions.append(RepairAction(str(self.root / name), "remove-temp", "left by a writer that died"))
            if not dry_run:
                with self.locked(key):
                    pass  # taking the lock sweeps the temp
        for problem in self.list().problems:
            if problem.kind == "newer":
                actions.append(RepairAction(problem.path, "skip", problem.reason))
                continue
            name = os.path.basename(problem.path)
            target = str(self.root / QUARANTINE / f"{name}.{now_ms()}.{secrets.token_hex(3)}")
            actions.append(RepairAction(problem.path, "quarantine", problem.reason, target))
            if not dry_run:
                self._quarantine(name, target)
        return tuple(actions)

    def _quarantine(self, name: str, target: str) -> None:
        key = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else None
        qdir = self.root / QUARANTINE
        fd = self._open_dir(qdir, create=True)
        if fd is not None:
            os.close(fd)
        if key is not None and _is_key(key):
            with self.locked(key) as root_fd:
                # Re-check under the lock: a writer may have repaired it meanwhile.
                try:
                    self._read(root_fd, key)
                    return
                except CorruptEntry:
                    pass
                _move(self.root / name, target)
        else:
            _move(self.root / name, target)


def _move(source: Path, target: str) -> None:
    if os.path.lexists(target):  # pragma: no cover - names carry a timestamp and random suffix
        raise StoreError(f"{target}: already exists; retry repair", path=target)
    try:
        os.rename(source, target)  # renames the symlink/FIFO itself, never its target
    except OSError as exc:
        raise StoreError(
            f"{source}: cannot move to quarantine ({exc.strerror})", path=str(source), errno=exc.errno
        ) from None


def _is_key(name: str) -> bool:
    try:
        parse_key(name)
    except ValueError:
        return False
    return True


def _kind(mode: int) -> str:
    for test, label in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return label
    return "not a regular file"


class RecordStore:
    """Small JSON documents of one kind beside the entries (dispatcher jobs, agent results).

    The entries' guarantees, in ``<state dir>/<kind>/``: a per-record lock, durable atomic
    writes, exclusive create (exactly one result per marker), strict bounded reads, and corrupt
    files reported, never deleted. Records are plain JSON objects; their owners give them types.
    """

    def __init__(self, store: MatrixStore, kind: str, *, folders: bool = False) -> None:
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

    @contextmanager
    def _dir_fd(self, *, create: bool) -> Iterator[int | None]:
        if create:
            self.store.side_dir(self.kind)
        fd = self.store._open_dir(self.root, create=False)
        try:
            yield fd
        finally:
            if fd is not None:
                os.close(fd)

    @contextmanager
    def locked(self, name: str) -> Iterator[int]:
        """Hold the record's lock; yields the record dir fd (created if needed)."""
        file_name = self._name(name)
        lock = f"{self.kind}.{name}.lock"  # entry locks are <role>-<id>.lock: no collision
        held = self.store._hold(lock, f"{self.kind}/{name}: lock still held", "this record")
        with held, self._dir_fd(create=True) as fd:
            assert fd is not None
            with suppress(FileNotFoundError):
                os.unlink(f".{file_name}.tmp", dir_fd=fd)  # a dead writer's temp
            yield fd

    def _decode(self, data: bytes, path: str) -> dict[str, Any]:
        try:
            value = strictjson.loads(data, max_bytes=MAX_ENTRY_BYTES)
        except strictjson.StrictJSONError as exc:
            raise CorruptEntry(path, str(exc)) from None
        if not isinstance(value, dict):
            raise CorruptEntry(path, f"is JSON {type(value).__name__}, not an object")
        return value

    def _read(self, fd: int, name: str) -> dict[str, Any] | None:
        file_name = self._name(name)
        path = str(self.root / file_name)
        try:
            return self._decode(read_bounded(fd, file_name, path, MAX_ENTRY_BYTES), path)
        except FileNotFoundError:
            return None

    def get(self, name: str) -> dict[str, Any] | None:
        """The record, None if absent (no lock: every read sees a whole version)."""
        self._name(name)
        with self._dir_fd(create=False) as fd:
            return None if fd is None else self._read(fd, name)

    def put(self, name: str, record: dict[str, Any], *, exclusive: bool = False) -> bool:
        """Write the record; with ``exclusive`` only if absent (False when it was taken)."""
        file_name = self._name(name)
        data = (json.dumps(record) + "\n").encode()
        with self.locked(name) as fd:
            try:
                durable_write(fd, file_name, data, exclusive=exclusive, path=str(self.root / file_name))
            except FileExistsError:
                return False
        return True

    def update(
        self, name: str, change: Callable[[dict[str, Any] | None], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        """Read, change and write under the record's lock; ``change`` returning None writes nothing."""
        file_name = self._name(name)
        with self.locked(name) as fd:
            current = self._read(fd, name)
            changed = change(current)
            if changed is None:
                return current
            data = (json.dumps(changed) + "\n").encode()
            durable_write(fd, file_name, data, exclusive=False, path=str(self.root / file_name))
            return changed

    def list(self) -> tuple[list[tuple[str, dict[str, Any]]], list[Problem]]:
        """Every valid record by name, and a problem for every other file."""
        records: list[tuple[str, dict[str, Any]]] = []
        problems: list[Problem] = []
        with self._dir_fd(create=False) as fd:
            if fd is None:
                return records, problems
            for file_name in sorted(os.listdir(fd)):
                if file_name.startswith("."):
                    continue
                path = str(self.root / file_name)
                name = file_name[: -len(SUFFIX)] if file_name.endswith(SUFFIX) else ""
                if self.folders and not name and ID_PATTERN.fullmatch(file_name):
                    with suppress(OSError):
                        if stat.S_ISDIR(os.stat(file_name, dir_fd=fd, follow_symlinks=False).st_mode):
                            continue  # a record's own folder
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

    def delete(self, name: str) -> bool:
        """Remove the record (True if it was there)."""
        file_name = self._name(name)
        with self.locked(name) as fd:
            try:
                os.unlink(file_name, dir_fd=fd)
            except FileNotFoundError:
                return False
            _fsync(fd)
        return True
