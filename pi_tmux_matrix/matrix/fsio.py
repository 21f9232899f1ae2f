"""Durable, bounded file I/O under the state dir: the only code that writes or reads its bytes.

This room owns how a file reaches the disk and comes back: :func:`durable_write` (temp
``O_EXCL|O_NOFOLLOW`` 0600 -> fsync -> rename or link -> fsync the directory, so a reader or a
crash sees the whole old version or the whole new one), :func:`durable_unlink`, the strict
readers :func:`read_bounded` and :func:`read_tail` (never a symlink, never a FIFO) and their
path-based face :func:`read_state_file` (every other state-dir file a reader takes), the
removal of what is no longer needed (:func:`remove_regular`, :func:`remove_folder`: regular files
only, never through a symlink), the FIFO a host reads its pane from (:func:`open_fifo`), and the
safe opening of a state directory (:func:`open_dir`: ours, 0700, never a symlink). The generation
tokens and timestamps every write carries are in ``tokens``; what the files mean is the business
of the stores above it (``store``, ``records``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Final

from ..errors import CorruptEntry, StateDirError, StoreError

__all__ = [
    "DIR_FLAGS",
    "check_dir",
    "drop_fifos",
    "durable_unlink",
    "durable_write",
    "open_append",
    "open_dir",
    "open_fifo",
    "open_state_file",
    "opened_dir",
    "read_bounded",
    "read_state_file",
    "read_tail",
    "remove_folder",
    "remove_regular",
]

_O_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_READ_FLAGS: Final = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC
_CREATE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC
DIR_FLAGS: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | _O_CLOEXEC


# --- seams: tests replace these to force error branches (EIO, ENOSPC) -----------------------
# Every fsync and every data write of the state dir goes through these two names, looked up
# at call time, so patching ``fsio._fsync`` reaches the entry store and the record stores alike.
def _fsync(fd: int) -> None:
    os.fsync(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


# --- writing -----------------------------------------------------------------------------------
def durable_write(
    dir_fd: int,
    name: str,
    data: bytes,
    *,
    exclusive: bool,
    path: str,
    tmp: str | None = None,
    sync_dir: bool = True,
) -> None:
    """Write ``name`` in ``dir_fd`` so a crash leaves the whole old or the whole new version.

    temp (``O_EXCL``, 0600) -> fsync -> rename (``link`` when ``exclusive``: FileExistsError if
    the name is taken) -> fsync the directory. The caller holds the name's lock, which is what
    makes the one fixed temp name per file safe. Any failure is a StoreError and the write was
    not acknowledged.

    ``sync_dir=False`` leaves out the last fsync: the new version is visible at once and still
    whole whenever a crash keeps it (its bytes reached the disk before it got its name), but a
    crash may undo it, leaving the old version (or, for a create, nothing). Only for a caller
    whose next write to the same folder is a durable one made before anyone relies on this one
    surviving a crash (that folder's fsync then keeps both), or whose record a crash makes moot;
    each such caller says which, where it asks.
    """
    # ``tmp``: a writer that holds no lock on the name (a launch ticket) brings its own temp name.
    tmp = tmp or f".{name}.tmp"
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
        if sync_dir:
            _fsync(dir_fd)
    except FileExistsError:
        raise
    except OSError as exc:
        note = "; the new version is in place but may not survive a crash" if committed else ""
        raise StoreError(
            f"{path}: write failed ({exc.strerror}){note}; the change was not acknowledged",
            path=path,
            errno=exc.errno,
            committed=committed,
        ) from None
    finally:
        if not committed:
            with suppress(OSError):
                os.unlink(tmp, dir_fd=dir_fd)


def durable_unlink(dir_fd: int, name: str) -> None:
    """Remove ``name`` from ``dir_fd`` and fsync the directory so the removal survives a crash.

    Raises the OSError as it came (FileNotFoundError when absent): the callers word it.
    """
    os.unlink(name, dir_fd=dir_fd)
    _fsync(dir_fd)


def remove_regular(dir_fd: int, name: str, *, fifo: bool = False) -> int | None:
    """Unlink ``name`` in ``dir_fd`` if it is a regular file (or, with ``fifo``, a FIFO: in
    ``pipes/``, where the hosts make theirs); returns its size (0 if it was already gone), or
    None when it is anything else (a symlink, a FIFO, a folder): that is left where it is, for
    the caller to report, never followed or removed.

    Not fsynced: this removes what is no longer needed (history past its window, an ended
    entry's mailbox), and a removal a crash undoes is simply done again by the next sweep.
    """
    try:
        info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return 0
    if not (stat.S_ISREG(info.st_mode) or (fifo and stat.S_ISFIFO(info.st_mode))):
        return None
    if stat.S_ISFIFO(info.st_mode):
        # A writer blocked in opening it (a pane pipe whose host was killed first) is let go by a
        # reader's open and close: it gets EOF or EPIPE and ends. The unlink alone would not.
        with suppress(OSError):
            os.close(os.open(name, _READ_FLAGS, dir_fd=dir_fd))
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return 0
    return info.st_size


def drop_fifos(folder: Path) -> None:
    """Remove every FIFO in ``folder`` (``pipes/``) through :func:`remove_regular`, so a writer
    blocked in opening one is let go first: for a teardown whose hosts are already stopped
    (their pane pipes' ``sh`` is nobody's child, and would wait for a reader for good)."""
    with opened_dir(folder, create=False) as fd:
        if fd is None:
            return
        for name in os.listdir(fd):
            with suppress(OSError):
                if stat.S_ISFIFO(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                    remove_regular(fd, name, fifo=True)


def remove_folder(dir_fd: int, name: str) -> tuple[int, tuple[str, ...]]:
    """Remove the folder ``name`` in ``dir_fd`` with the regular files in it (bytes freed, and
    the names left: ``name/<file>`` for anything in it that is not a regular file, ``name``
    itself when it is not a real folder or could not be removed). Never follows a symlink, never
    descends into a sub-folder (both are left and named). Absent: ``(0, ())``."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        return 0, ()
    except OSError:
        return 0, (name,)  # a symlink or a file where the folder should be: left, named
    freed = 0
    left: list[str] = []
    try:
        for item in sorted(os.listdir(fd)):
            size = remove_regular(fd, item)
            if size is None:
                left.append(f"{name}/{item}")
            else:
                freed += size
    finally:
        os.close(fd)
    if not left:
        try:
            os.rmdir(name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError:  # a file written into it meanwhile: the folder stays for the next sweep
            left.append(name)
    return freed, tuple(left)


# --- reading -----------------------------------------------------------------------------------
# Every read of a state-dir file goes through :func:`_open_regular`: ``O_NOFOLLOW`` (a symlink is
# refused, never followed out of the state dir), ``O_NONBLOCK`` (a FIFO, a tty or a device never
# blocks the open), then ``fstat`` must say a regular file (a FIFO opened without blocking would
# still block, or read nothing, at the first read). Callers add a size cap or read a tail.
_UNSAFE_FIX: Final = "pi-matrix reads only regular files there; move it aside (it was left untouched)"


def _open_regular(dir_fd: int, name: str, path: str, fix: str | None) -> tuple[int, os.stat_result]:
    """``name`` in ``dir_fd`` opened for reading, with its ``fstat``; FileNotFoundError if absent,
    CorruptEntry (the reason, and ``fix`` when given) for a symlink, a FIFO, a device, a directory."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptEntry(path, "is a symlink (never followed)", fix=fix) from None
        raise CorruptEntry(path, f"cannot open ({exc.strerror})", fix=fix) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptEntry(path, f"is not a regular file ({_kind(info.st_mode)})", fix=fix)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def _read_open(
    fd: int, info: os.stat_result, path: str, max_bytes: int, *, tail: bool, fix: str | None
) -> bytes:
    """Read the fd :func:`_open_regular` gave (and close it): all of it up to the cap, or its tail."""
    try:
        if tail:
            return os.pread(fd, max_bytes, max(0, info.st_size - max_bytes))
        if info.st_size > max_bytes:
            raise CorruptEntry(path, f"is {info.st_size} bytes, over the {max_bytes} byte cap", fix=fix)
        # st_size + 1, not the cap: a 1 MiB buffer per read costs; the extra byte sees a file
        # that grew since the fstat, and the cap still holds.
        data = os.read(fd, min(info.st_size, max_bytes) + 1)
        if len(data) > max_bytes:
            raise CorruptEntry(path, f"is over the {max_bytes} byte cap", fix=fix)
        return data
    except OSError as exc:
        raise CorruptEntry(path, f"cannot read ({exc.strerror})", fix=fix) from None
    finally:
        os.close(fd)


def read_bounded(dir_fd: int, name: str, path: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``, never following a symlink and never
    blocking on a FIFO. FileNotFoundError if absent; CorruptEntry (with the reason) otherwise."""
    fd, info = _open_regular(dir_fd, name, path, None)
    return _read_open(fd, info, path, max_bytes, tail=False, fix=None)


def read_tail(dir_fd: int, name: str, path: str, max_bytes: int) -> bytes:
    """The last ``max_bytes`` of a regular file (a growing log read while it is written), with
    :func:`read_bounded`'s rules: never a symlink, never a FIFO."""
    fd, info = _open_regular(dir_fd, name, path, None)
    return _read_open(fd, info, path, max_bytes, tail=True, fix=None)


def open_append(path: str | os.PathLike[str], *, mode: int = 0o600, read: bool = False) -> int:
    """The one open of a file the product appends to where others can write (the events, an
    agent's notices, a detached agent's log, a repository's ``info/exclude``): never through a
    symlink, never blocking on a FIFO, a regular file only (OSError saying so otherwise). The fd is
    left non-blocking, which changes nothing for a regular file. ``read`` opens it read-write."""
    flags = (os.O_RDWR if read else os.O_WRONLY) | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | _O_CLOEXEC, mode)
    except OSError as exc:
        if exc.errno != errno.ENXIO:  # a FIFO nobody reads: say what it is, not "no such device"
            raise
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file (move it aside)", str(path))
    return fd


def open_fifo(path: str | os.PathLike[str]) -> tuple[int, int]:
    """A FIFO made fresh at ``path`` (0600; whatever was there before is removed first, never
    followed), opened for reading, non-blocking, plus a writing end the caller keeps open so the
    reader never sees end-of-file while the real writer (tmux's ``pipe-pane``) comes and goes.
    Returns ``(read_fd, write_fd)``; the one place the product makes a FIFO in its state dir."""
    with suppress(FileNotFoundError):
        os.unlink(path)
    os.mkfifo(path, 0o600)
    read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | _O_CLOEXEC)
    try:
        info = os.fstat(read_fd)
        if not stat.S_ISFIFO(info.st_mode) or info.st_uid != os.geteuid():
            raise OSError(errno.EINVAL, "not our FIFO (move it aside)", str(path))
        write_fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | _O_CLOEXEC)
    except OSError:
        os.close(read_fd)
        raise
    return read_fd, write_fd


def open_state_file(path: str | os.PathLike[str]) -> int:
    """An fd reading the regular file at ``path``, for a reader that follows a growing file (a
    job's log) and so cannot take its bytes at once; every other reader uses
    :func:`read_state_file`. The folder is opened ``O_NOFOLLOW`` too, so neither the file nor its
    folder is ever a symlink followed. FileNotFoundError if absent; CorruptEntry saying why for a
    symlink, a FIFO, a device or a directory (the file is left untouched)."""
    dir_fd, name, shown = _open_parent(path)
    try:
        fd, _info = _open_regular(dir_fd, name, shown, _UNSAFE_FIX)
    finally:
        os.close(dir_fd)
    return fd


def read_state_file(path: str | os.PathLike[str], *, max_bytes: int, tail: bool = False) -> bytes:
    """The bytes of the regular file at ``path``: the one way the product reads a file of the
    state dir that is not an entry or a record (mailbox messages, usage claims, bridge artifacts,
    fork run files, launch tickets go through the dir-fd readers above, which share its rules).

    Never a symlink (the file's or its folder's), never blocking on a FIFO or a device, never more
    than ``max_bytes``: a larger file is refused, or with ``tail`` its last ``max_bytes`` are read
    (a log written while it is read). FileNotFoundError if absent (the caller's "none yet");
    CorruptEntry with the path, the reason and the fix for anything else, the file left untouched.
    """
    dir_fd, name, shown = _open_parent(path)
    try:
        fd, info = _open_regular(dir_fd, name, shown, _UNSAFE_FIX)
    finally:
        os.close(dir_fd)
    return _read_open(fd, info, shown, max_bytes, tail=tail, fix=_UNSAFE_FIX)


def _open_parent(path: str | os.PathLike[str]) -> tuple[int, str, str]:
    """The folder of ``path`` opened ``O_DIRECTORY|O_NOFOLLOW``, the file's name, and ``path`` as
    shown in errors."""
    shown = os.fspath(path)
    parent, name = os.path.split(shown)
    if not name:
        raise CorruptEntry(shown, "names a folder, not a file", fix=_UNSAFE_FIX)
    try:
        dir_fd = os.open(parent or ".", DIR_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise CorruptEntry(
                shown, f"its folder {parent} is a symlink or not a folder (never followed)", fix=_UNSAFE_FIX
            ) from None
        raise CorruptEntry(shown, f"cannot open its folder ({exc.strerror})", fix=_UNSAFE_FIX) from None
    return dir_fd, name, shown


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


# --- directories -------------------------------------------------------------------------------
def check_dir(fd: int, path: Path) -> None:
    """StateDirError unless the open directory ``fd`` is ours and closed to everyone else."""
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


def open_dir(path: Path, *, create: bool) -> int | None:
    """An fd for ``path`` after the safety checks; None if it is absent and not created."""
    for attempt in range(2):
        try:
            fd = os.open(path, DIR_FLAGS)
        except FileNotFoundError:
            if not create or attempt:
                return None
            _make_dir(path)
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
            check_dir(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd
    return None  # pragma: no cover


@contextmanager
def opened_dir(path: Path, *, create: bool) -> Iterator[int | None]:
    """:func:`open_dir` for the block, closed after it."""
    fd = open_dir(path, create=create)
    try:
        yield fd
    finally:
        if fd is not None:
            os.close(fd)


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
