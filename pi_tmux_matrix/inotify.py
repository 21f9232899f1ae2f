"""inotify (Linux, via libc): one instance per process, shared by all of its watches.

The kernel counts instances per user (``fs.inotify.max_user_instances``, 128 by default) and
watches per user (``max_user_watches``). A fleet of 100 agents under one master ran out of
instances when every host and every watcher made its own, so a process makes at most
one (:class:`Watches`), holds every watch it needs on it (``inotify_add_watch`` on the same fd),
and hands each event to the handler of the watch it is about. An agent's host is the only process
of an agent that holds one; one-shot verbs hold none (docs/decisions.md#one-inotify-instance-per-host).

When the kernel refuses (EMFILE: the instances are spent; ENOSPC: the watches are; ENOMEM), or
there is no inotify here, the caller polls instead: :meth:`Watches.add` returns None and tells the
process's ``on_refused`` once, so the process says so once, not at every retry.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
from collections.abc import Callable
from typing import Final

__all__ = ["IN_MOVED_TO", "LANDED", "Watches", "available", "errno_name"]

IN_CLOSE_WRITE: Final = 0x00000008
IN_MOVED_TO: Final = 0x00000080
IN_CREATE: Final = 0x00000100
IN_Q_OVERFLOW: Final = 0x00004000
IN_MASK_ADD: Final = 0x20000000
IN_NONBLOCK: Final = os.O_NONBLOCK
_EVENT: Final = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (then the name)
IN_CLOEXEC: Final = os.O_CLOEXEC
# A file landing in a watched directory: written and closed, renamed in, or made.
LANDED: Final = IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE

# What "inotify cannot be had" is: the user's instances (EMFILE) or watches (ENOSPC) spent, the
# system's files (ENFILE) or the kernel's memory (ENOMEM), no inotify at all (ENOSYS). Anything
# else (a folder gone, not a folder) is about that one path: it is polled, and nothing is said.
REFUSALS: Final = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.ENOMEM, errno.ENOSYS})

# Told the names of the files an event batch is about; the empty name means "events were lost,
# look at everything".
Handler = Callable[[set[str]], None]


def _libc() -> ctypes.CDLL | None:
    # The interpreter's own symbols (libc among them), as procs does for prctl: not
    # ctypes.util.find_library, which imports tempfile and runs ldconfig in every process that
    # loads this module (every host: docs/decisions.md#a-host-loads-only-what-it-uses).
    try:
        lib = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    if not hasattr(lib, "inotify_init1"):
        return None
    return lib


_LIBC = _libc()


def available() -> bool:
    """Whether this libc has inotify at all (the kernel may still refuse an instance)."""
    return _LIBC is not None


def _failed(*extra: str) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, os.strerror(err), *extra)


# The two seams every instance and every watch is made through, looked up at call time: a test
# replaces them to be refused (EMFILE, ENOSPC) or to count the calls.
def _init() -> int:
    """A new inotify instance's fd (non-blocking, close-on-exec); OSError when refused."""
    if _LIBC is None:
        raise OSError(errno.ENOSYS, "inotify is not available")
    fd = int(_LIBC.inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
    if fd < 0:
        raise _failed()
    return fd


def _add_watch(fd: int, path: str, mask: int) -> int:
    """A watch of ``path`` on the instance ``fd``: its descriptor; OSError when refused."""
    assert _LIBC is not None  # an instance was made, so there is a libc
    wd = int(_LIBC.inotify_add_watch(fd, os.fsencode(path), mask))
    if wd < 0:
        raise _failed(path)
    return wd


def _rm_watch(fd: int, wd: int) -> None:
    if _LIBC is not None:
        _LIBC.inotify_rm_watch(fd, wd)  # a watch the kernel already dropped (its folder gone): fine


def errno_name(exc: OSError) -> str:
    """A refusal's errno as its name (``EMFILE``), what an event says."""
    return errno.errorcode.get(exc.errno or 0, "unknown")


class Watches:
    """The process's one inotify instance (made at the first :meth:`add`) and its watches.

    ``fd`` turns readable when any watch has events; :meth:`dispatch` reads them and calls each
    watch's handler with the names they are about. ``on_refused`` is told the first refusal,
    once: the instance (then none is asked for again: the process polls for its life) or a
    watch (the next watch is asked for as ever)."""

    def __init__(self, on_refused: Callable[[OSError], None] | None = None) -> None:
        self.fd: int | None = None
        self.refused: OSError | None = None  # the first refusal, when there was one
        self._on_refused = on_refused
        self._instance_refused = False
        self._watches: dict[int, tuple[int, Handler]] = {}  # our token -> (wd, handler)
        self._next = 0

    def add(self, path: str | os.PathLike[str], handler: Handler, mask: int = LANDED) -> int | None:
        """Watch the directory ``path`` for files landing in it (``mask``: how they land); returns
        a token for :meth:`remove`, or None when it cannot be watched and the caller must poll
        (inotify refused, or a folder that is not there). Two watches of one path share the
        kernel's."""
        if self._instance_refused:
            return None
        try:
            if self.fd is None:
                try:
                    self.fd = _init()
                except OSError:
                    self._instance_refused = True
                    raise
            # Added to the mask a path watched twice already has, never narrowing it.
            wd = _add_watch(self.fd, os.fspath(path), mask | IN_MASK_ADD)
        except OSError as exc:
            if exc.errno in REFUSALS or self.fd is None:
                self._refuse(exc)
            return None
        self._next += 1
        self._watches[self._next] = (wd, handler)
        return self._next

    def _refuse(self, exc: OSError) -> None:
        if self.refused is not None:
            return
        self.refused = exc
        if self._on_refused is not None:
            self._on_refused(exc)

    def remove(self, token: int | None) -> None:
        """Stop a watch (``None``: one that was refused, nothing to do)."""
        if token is None or token not in self._watches:
            return
        wd, _ = self._watches.pop(token)
        if self.fd is not None and all(other != wd for other, _ in self._watches.values()):
            _rm_watch(self.fd, wd)

    def dispatch(self) -> None:
        """Read the queued events and hand each watch the names of its files (the empty name
        for every watch when the queue overflowed: events were lost)."""
        by_wd = self._read()
        for wd, handler in list(self._watches.values()):
            names = by_wd.get(wd, set()) | by_wd.get(-1, set())
            if names:
                handler(names)

    def _read(self) -> dict[int, set[str]]:
        found: dict[int, set[str]] = {}
        if self.fd is None:
            return found
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return found
            if not data:
                return found
            at = 0
            while at + _EVENT.size <= len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, at)
                raw = data[at + _EVENT.size : at + _EVENT.size + length]
                at += _EVENT.size + length
                if mask & IN_Q_OVERFLOW:
                    found.setdefault(-1, set()).add("")
                else:
                    found.setdefault(wd, set()).add(os.fsdecode(raw.rstrip(b"\0")))

    def close(self) -> None:
        """Give the instance back (the process is done watching)."""
        self._watches.clear()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
