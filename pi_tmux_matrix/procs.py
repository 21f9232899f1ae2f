"""Process identity and liveness: the only module that reads /proc, pidfds and sends signals.

A process is ``(pid, kernel start time in clock ticks, boot id)``. A pid alone lies after reuse,
psutil's ``create_time`` moves when the wall clock is set, and ``pid_exists`` says True for an
unreaped zombie; the kernel's start ticks (field 22 of ``/proc/<pid>/stat``) and the boot id do
neither.
"""

from __future__ import annotations

import errno
import functools
import os
import select
import signal
import time
from typing import Final

from .identity import ProcessIdentity

__all__ = [
    "ProcessIdentity",
    "boot_id",
    "current",
    "identify",
    "is_alive",
    "process_state",
    "send_signal",
    "wait_for_exit",
]

_BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
_DEAD_STATES: Final = frozenset({"Z", "X", "x"})


@functools.lru_cache(maxsize=1)
def boot_id() -> str:
    """This boot's id; identities recorded under another boot are never alive."""
    with open(_BOOT_ID_PATH, encoding="ascii") as handle:
        return handle.read().strip()


def _read_stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start ticks) of ``pid``, or None if there is no such process."""
    if pid <= 0:
        return None
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError as exc:
        if exc.errno in (errno.ESRCH, errno.ENOENT):
            return None
        raise
    # The command name (field 2) may hold spaces and parentheses; fields after the *last* ')'
    # are fixed: state is field 3, starttime field 22.
    tail = data[data.rfind(b")") + 2 :].split()
    try:
        return tail[0].decode("ascii"), int(tail[19])
    except (IndexError, ValueError, UnicodeDecodeError):
        return None


def identify(pid: int) -> ProcessIdentity | None:
    """The identity of the process now running as ``pid``, or None if none is."""
    stat = _read_stat(pid)
    if stat is None:
        return None
    return ProcessIdentity(pid, stat[1], boot_id())


def current() -> ProcessIdentity:
    """This process's identity."""
    found = identify(os.getpid())
    if found is None:  # pragma: no cover - /proc/self always exists on Linux
        raise RuntimeError("cannot read /proc/self/stat")
    return found


def process_state(pid: int) -> str | None:
    """The kernel state letter (``R``, ``S``, ``Z``...) of ``pid``, or None."""
    stat = _read_stat(pid)
    return None if stat is None else stat[0]


def is_alive(identity: ProcessIdentity | None) -> bool:
    """True only if the same process (pid, start time, boot) still runs and is not a zombie."""
    if identity is None or identity.boot_id != boot_id():
        return False
    stat = _read_stat(identity.pid)
    if stat is None:
        return False
    state, ticks = stat
    return ticks == identity.start_ticks and state not in _DEAD_STATES


def _open_pidfd(identity: ProcessIdentity) -> int | None:
    """A pidfd for exactly ``identity``, or None if it is already gone (or pidfds are missing)."""
    if not hasattr(os, "pidfd_open"):
        return None
    try:
        fd = os.pidfd_open(identity.pid)
    except OSError:
        return None
    # The pid may have been reused between the caller's check and the open: the pidfd now
    # pins whatever runs as pid, so confirm it is still the process we mean.
    if not is_alive(identity):
        os.close(fd)
        return None
    return fd


def wait_for_exit(
    identity: ProcessIdentity, timeout: float | None = None, *, poll_interval: float = 0.25
) -> bool:
    """Block until ``identity`` is no longer alive; True if it ended, False on timeout.

    Uses a pidfd (works for a non-child and wakes as soon as the process exits, zombie or not);
    re-reads ``/proc`` every ``poll_interval`` as the fallback where pidfds are missing and as
    the safety net if a wake-up is ever lost.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    if not is_alive(identity):
        return True
    fd = _open_pidfd(identity)
    if fd is None and not is_alive(identity):
        return True
    try:
        while True:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return not is_alive(identity)
            step = poll_interval if remaining is None else min(poll_interval, remaining)
            if fd is not None:
                poller = select.poll()
                poller.register(fd, select.POLLIN)
                poller.poll(step * 1000)
            else:
                time.sleep(step)
            if not is_alive(identity):
                return True
    finally:
        if fd is not None:
            os.close(fd)


def send_signal(identity: ProcessIdentity, sig: int | signal.Signals) -> bool:
    """Signal ``identity`` only if it is still that process; False if it was already gone.

    With a pidfd the check and the send cannot race a pid reuse: the signal goes to the process
    the pidfd pins, which was confirmed to be ``identity`` after opening it.
    """
    fd = _open_pidfd(identity)
    if fd is not None:
        try:
            signal.pidfd_send_signal(fd, sig)
            return True
        except ProcessLookupError:
            return False
        finally:
            os.close(fd)
    if not is_alive(identity):
        return False
    try:
        os.kill(identity.pid, sig)
    except ProcessLookupError:
        return False
    return True
