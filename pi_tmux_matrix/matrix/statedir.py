"""The state dir itself: its layout, its safe opening, its lock files, and what is wrong in it.

Layout under the state dir (0700, owned by the user, never a symlink)::

    <key>.json            one entry per registered process (0600)
    .<key>.json.tmp       a write in flight (or left by a killed writer; swept under the lock)
    locks/<name>.lock     the flocks of entries and records; unlinked by its holder only, with what
                          it guards (see :func:`.locks.drop_held`)
    quarantine/           corrupt or foreign files moved aside by ``repair`` (never deleted)
    jobs/, runs/, …       record directories (:mod:`.records`) and the other reserved sub-dirs

:class:`StateDir` is what every store of the state dir shares: the directory opened with the
safety checks, side directories, and holding one named lock under ``locks/``. The entries
(:mod:`.store`), records (:mod:`.records`) and repair (:mod:`.repair`) build on it; this module
sits below all three so that none of them imports another for these basics.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from pathlib import Path

import attrs

from ..errors import LockUnavailable, StateDirError, StoreError
from ..identity import KEY_PATTERN
from .fsio import DIR_FLAGS, check_dir, open_dir, opened_dir
from .layout import LOCKS, QUARANTINE, RESERVED_DIRS, SUFFIX, TMP_SUFFIX
from .locks import LockError, LockTimeout, drop_held, entry_lock

__all__ = ["LOCKS", "QUARANTINE", "RESERVED_DIRS", "SUFFIX", "TMP_SUFFIX", "Problem", "StateDir", "is_key"]


def is_key(name: str) -> bool:
    """Whether ``name`` is an entry key (``<role>-<sessionId>``)."""
    # parse_key's own pattern, without building the Role a listing of every file does not need.
    return KEY_PATTERN.fullmatch(name) is not None


@attrs.frozen
class Problem:
    """A file in the state dir that is not a valid entry."""

    path: str
    reason: str
    kind: str  # "corrupt" | "foreign" | "newer"

    def line(self) -> str:
        """One line for stderr: path and reason."""
        return f"{self.path}: {self.reason}"


class StateDir:
    """The state dir at ``root``: opened with the safety checks, with named locks under ``locks/``."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        lock_timeout: float = 10.0,
    ) -> None:
        self.root = Path(root)
        self.lock_timeout = lock_timeout
        self._locks_ready = False  # locks/ made and checked by this object (see hold)

    def open_root(self, *, create: bool) -> AbstractContextManager[int | None]:
        """The state dir's fd for the block; None if it is absent and not ``create``."""
        return opened_dir(self.root, create=create)

    def side_dir(self, *parts: str) -> Path:
        """``<state dir>/<parts…>`` created 0700 with the state dir's checks (mailboxes, events)."""
        path = self.root
        for part in (None, *parts):
            if part is not None:
                path = path / part
            fd = open_dir(path, create=True)
            if fd is not None:
                os.close(fd)
        return path

    def exists(self) -> bool:
        """Whether the state dir exists (nothing is created by asking)."""
        return os.path.lexists(self.root)

    @contextmanager
    def hold(self, lock_name: str, what: str, writing: str) -> Iterator[int]:
        """Hold ``locks/<lock_name>``; yields the state dir fd (created if needed).

        ``what`` and ``writing`` word the timeout: "<what> after 10s; another pi-matrix process
        is writing <writing>".
        """
        with self.open_root(create=True) as root_fd:
            assert root_fd is not None
            path = f"{self.root}{os.sep}{LOCKS}{os.sep}{lock_name}"  # not pathlib: this is every CAS
            entered = False
            for attempt in range(2):
                if not self._locks_ready:
                    # locks/ is made and checked once per object, not on every CAS (an open, an
                    # fstat and a close each time); the state dir itself is checked on every open.
                    os.close(self._locks_fd(root_fd))
                    self._locks_ready = True
                try:
                    with entry_lock(root_fd, f"{LOCKS}/{lock_name}", path, self.lock_timeout):
                        entered = True
                        yield root_fd
                    return
                except LockTimeout:
                    raise LockUnavailable(
                        f"{what} after {self.lock_timeout:.0f}s; another pi-matrix process is writing "
                        f"{writing}, retry shortly",
                        path=path,
                    ) from None
                except LockError as exc:
                    if exc.errno == errno.ENOENT and not attempt and not entered:
                        self._locks_ready = False  # the state dir was made anew: locks/ with it
                        continue
                    raise LockUnavailable(
                        f"{path}: cannot take a real file lock ({exc.strerror}); the state dir must be "
                        "on a local filesystem that supports flock",
                        path=path,
                        errno=exc.errno,
                    ) from None

    def drop_lock(self, root_fd: int, lock_name: str) -> bool:
        """Remove ``locks/<lock_name>``, which this thread holds (inside :meth:`hold`), because
        what it guards is gone; True if removed. A process queued on it moves to the file the next
        writer creates (the lock helper re-checks the inode after every ``flock``), so this is the
        last act under the lock (:func:`.locks.drop_held`)."""
        path = f"{self.root}{os.sep}{LOCKS}{os.sep}{lock_name}"
        try:
            return drop_held(root_fd, f"{LOCKS}/{lock_name}", path)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StoreError(
                f"{path}: cannot remove the lock file ({exc.strerror}); it is left for the next gc",
                path=path,
                errno=exc.errno,
            ) from None

    def _locks_fd(self, root_fd: int) -> int:
        try:
            fd = os.open(LOCKS, DIR_FLAGS, dir_fd=root_fd)
        except FileNotFoundError:
            with suppress(FileExistsError):
                os.mkdir(LOCKS, 0o700, dir_fd=root_fd)
            fd = os.open(LOCKS, DIR_FLAGS, dir_fd=root_fd)
            os.fchmod(fd, 0o700)
        except OSError as exc:
            path = self.root / LOCKS
            raise StateDirError(
                f"{path}: is a symlink or not a directory ({exc.strerror}); move it aside",
                path=str(path),
                errno=exc.errno,
            ) from None
        try:
            check_dir(fd, self.root / LOCKS)
        except BaseException:
            os.close(fd)
            raise
        return fd
