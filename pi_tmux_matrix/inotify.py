"""A minimal inotify watch (Linux, via libc) so hosts wake on new mail instead of polling.

Only what the host needs: one non-blocking fd that becomes readable when a file is moved into
or closed-after-write in a directory. Where inotify is missing the caller polls instead.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct
from typing import Final

__all__ = ["DirWatch", "available"]

IN_MODIFY: Final = 0x00000002
IN_CLOSE_WRITE: Final = 0x00000008
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_Q_OVERFLOW: Final = 0x00004000
IN_NONBLOCK: Final = os.O_NONBLOCK
_EVENT: Final = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
IN_CLOEXEC: Final = os.O_CLOEXEC


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name or "libc.so.6", use_errno=True)
    except OSError:
        return None
    if not hasattr(lib, "inotify_init1"):
        return None
    return lib


_LIBC = _libc()


def available() -> bool:
    """Whether inotify can be used here."""
    return _LIBC is not None


class DirWatch:
    """``fd`` turns readable when a file lands in ``path``; :meth:`drain` clears it."""

    def __init__(self, path: str | os.PathLike[str], *, modify: bool = False) -> None:
        if _LIBC is None:
            raise OSError("inotify is not available")
        fd = _LIBC.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        # ``modify``: also every write to a watched file (following a growing log).
        mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE | (IN_MODIFY if modify else 0)
        if _LIBC.inotify_add_watch(fd, os.fsencode(path), mask) < 0:
            err = ctypes.get_errno()
            os.close(fd)
            raise OSError(err, os.strerror(err), str(path))
        self.fd: int = fd

    def drain(self) -> None:
        """Discard the queued events (the caller re-reads the directory anyway)."""
        while True:
            try:
                if not os.read(self.fd, 65536):
                    return
            except BlockingIOError:
                return

    def names(self) -> set[str]:
        """The names of the files the queued events are about (and the queue cleared): the
        caller re-reads only those. An overflowed queue has lost names: then the set holds
        the empty name, meaning "look at everything"."""
        found: set[str] = set()
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            if not data:
                return found
            at = 0
            while at + _EVENT.size <= len(data):
                _wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
                raw = data[at + _EVENT.size : at + _EVENT.size + length]
                at += _EVENT.size + length
                found.add("" if mask & IN_Q_OVERFLOW else os.fsdecode(raw.rstrip(b"\0")))

    def close(self) -> None:
        os.close(self.fd)
