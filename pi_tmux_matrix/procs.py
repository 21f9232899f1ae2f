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
from collections.abc import Callable, Iterable
from typing import Final

from .identity import ProcessIdentity

__all__ = [
    "ProcessIdentity",
    "SignalWakeup",
    "ancestors",
    "boot_id",
    "cpu_seconds",
    "current",
    "die_with_parent",
    "group_members",
    "identify",
    "is_alive",
    "open_pidfd",
    "process_state",
    "release_free_heap",
    "rss_bytes",
    "running_pids",
    "send_signal",
    "signal_group",
    "stop",
    "stop_group",
    "usage",
    "wait_for_exit",
    "with_argument",
]

_BOOT_ID_PATH: Final = "/proc/sys/kernel/random/boot_id"
_PR_SET_PDEATHSIG: Final = 1  # <linux/prctl.h>
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
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:  # FileNotFoundError, ProcessLookupError: no such process
        if exc.errno in (errno.ESRCH, errno.ENOENT):
            return None
        raise
    try:
        data = os.read(fd, 4096)
    except ProcessLookupError:
        return None
    finally:
        os.close(fd)
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
    return None if stat is None else ProcessIdentity(pid, stat[1], boot_id())


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
    if ticks != identity.start_ticks:
        return False
    if state in _DEAD_STATES:
        # A leader whose main thread exited shows Z while its other threads still run.
        return state == "Z" and _has_live_threads(identity.pid)
    return True


def running_pids() -> frozenset[int]:
    """Every pid /proc lists now. A listing reads it once, after its entries, and reads the stat
    of only those pids: one missing here cannot be the live process of an entry read before."""
    return frozenset(int(name) for name in os.listdir("/proc") if name.isdigit())


def _has_live_threads(pid: int) -> bool:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        if tid == str(pid):
            continue
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as handle:
                state = handle.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X", b"x"):
            return True
    return False


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


def send_signal(identity: ProcessIdentity, sig: int | signal.Signals, *, group: bool = False) -> bool:
    """The one way the product signals a process: ``identity`` only if it is still that process
    (checked right before the send), or with ``group`` the process group it leads (only while it
    still is that leader; a process that leads no group is signalled alone). False if it was
    already gone, or if it is not ours to signal (EPERM: another user's): a caller that needed it
    gone sees it still alive and reports it, never a traceback.

    With a pidfd the check and the send cannot race a pid reuse: the signal goes to the process
    the pidfd pins, which was confirmed to be ``identity`` after opening it.
    """
    if group:
        return _signal_group(identity, sig)
    fd = _open_pidfd(identity)
    if fd is not None:
        try:
            signal.pidfd_send_signal(fd, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False
        finally:
            os.close(fd)
    if not is_alive(identity):
        return False
    try:
        os.kill(identity.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(leader: ProcessIdentity, sig: int | signal.Signals) -> bool:
    if not is_alive(leader):
        return False
    try:
        if os.getpgid(leader.pid) != leader.pid:
            return send_signal(leader, sig)
        os.killpg(leader.pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def die_with_parent(sig: int | signal.Signals) -> Callable[[], None]:
    """A ``preexec_fn`` for a child that must not outlive the process starting it unseen: the
    kernel sends ``sig`` to the child the moment its parent dies, kill -9 included
    (``PR_SET_PDEATHSIG``); if the parent is already gone by then, the child signals itself.
    libc is loaded here, in the parent: the child makes only system calls."""
    import ctypes  # here: only a process that spawns an agent needs libc (~4 ms of every start)

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    number = int(sig)

    def arm() -> None:
        if (
            prctl(
                _PR_SET_PDEATHSIG,
                ctypes.c_ulong(number),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
                ctypes.c_ulong(0),
            )
            != 0
        ):
            return  # not armed: the record names the agent, so views and `stop` still see it
        if os.getppid() != parent:
            os.kill(os.getpid(), number)  # ourselves: no pid that could have been reused

    return arm


def release_free_heap() -> None:
    """Give the memory the C allocator holds free back to the kernel (glibc's ``malloc_trim``;
    nothing where libc has none, as musl's). A long-lived process that allocated much on its way
    to idling (imports, parsing) otherwise keeps those pages resident for good."""
    import ctypes

    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim(0)


def open_pidfd(identity: ProcessIdentity) -> int | None:
    """A pidfd pinned to exactly ``identity`` (caller closes it), or None if it is gone."""
    return _open_pidfd(identity)


def signal_group(identity: ProcessIdentity, sig: int | signal.Signals) -> bool:
    """The process group led by ``identity``: ``send_signal(identity, sig, group=True)``."""
    return send_signal(identity, sig, group=True)


def _scan() -> dict[int, tuple[int, int, int, int]]:
    """``{pid: (ppid, pgrp, session, start ticks)}`` of this user's live (non-zombie) processes."""
    found: dict[int, tuple[int, int, int, int]] = {}
    me = os.geteuid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != me:
                continue
            with open(f"/proc/{name}/stat", "rb") as handle:
                data = handle.read()
        except OSError:
            continue
        tail = data[data.rfind(b")") + 2 :].split()
        try:
            if tail[0] in (b"Z", b"X", b"x"):
                continue
            found[int(name)] = (int(tail[1]), int(tail[2]), int(tail[3]), int(tail[19]))
        except (IndexError, ValueError):
            continue
    return found


def group_members(leader: ProcessIdentity) -> list[ProcessIdentity]:
    """Every live process that belongs to what ``leader`` started: its process group and session
    (a tmux pane's process leads both) and every descendant of those, even one that made its own
    session (node's ``detached`` children do). ``leader`` itself is included while it lives.

    The leader may already be dead: Linux never gives its pid to a new process while a group or
    session still carries it, and members must have started after the leader (same boot), so
    nothing unrelated is ever named."""
    if leader.boot_id != boot_id():
        return []
    table = _scan()
    holder = table.get(leader.pid)
    if holder is not None and holder[3] != leader.start_ticks:
        # The leader's pid has a new owner: Linux hands a pid out again only once no group or
        # session carries it, so the leader's group is gone, and whatever now has that pid (and
        # its own group) is someone else's.
        return []
    chosen = {
        pid
        for pid, (_ppid, pgrp, session, ticks) in table.items()
        if leader.pid in (pid, pgrp, session) and ticks >= leader.start_ticks
    }
    grew = True
    while grew:
        grew = False
        for pid, (ppid, _pgrp, _session, ticks) in table.items():
            if pid not in chosen and ppid in chosen and ticks >= leader.start_ticks:
                chosen.add(pid)
                grew = True
    chosen.discard(os.getpid())  # never this process, whatever it belongs to
    return [ProcessIdentity(pid, table[pid][3], leader.boot_id) for pid in sorted(chosen)]


KILL_WAIT_S: Final = 2.0  # after SIGKILL: only the kernel's own work is left


def stop(
    targets: Iterable[ProcessIdentity | None],
    grace_s: float,
    *,
    group: bool = False,
    kill_wait_s: float = KILL_WAIT_S,
) -> list[ProcessIdentity]:
    """The one stop by identity: SIGTERM to each of ``targets`` still alive (with ``group``, to
    the group each leads), up to ``grace_s`` for all to leave, then SIGKILL to whoever is left and
    up to ``kill_wait_s`` more. Each signal goes only to the very process (checked right before the
    send: :func:`send_signal`), and only a process it reached is waited for: one that refused it
    (EPERM: another user's) will not leave for it. Returns those still alive after all that (none,
    normally)."""
    alive = [t for t in targets if t is not None and is_alive(t)]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, kill_wait_s)):
        reached = [t for t in alive if send_signal(t, sig, group=group)]
        deadline = time.monotonic() + wait_s
        while reached and time.monotonic() < deadline:
            reached = [t for t in reached if is_alive(t)]
            if reached:
                time.sleep(0.05)
        alive = [t for t in alive if is_alive(t)]
        if not alive:
            break
    return alive


def stop_group(leader: ProcessIdentity, grace_s: float = 5.0) -> bool:
    """Stop everything ``leader`` started (:func:`group_members`): SIGTERM to each, up to
    ``grace_s`` to leave, then SIGKILL to whatever is left. Members found once are kept: a
    process whose parent died is re-parented and would no longer be found through it, and a
    dying process may have started another. True when nothing is left."""
    known = set(group_members(leader))
    for member in known:
        send_signal(member, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(is_alive(member) for member in known):
        time.sleep(0.05)
    for _round in range(3):
        known |= set(group_members(leader))
        left = [member for member in known if is_alive(member)]
        if not left:
            return True
        for member in left:
            send_signal(member, signal.SIGKILL)
        for member in left:
            wait_for_exit(member, 2.0)
    return not any(is_alive(member) for member in known | set(group_members(leader)))


def ancestors(pid: int | None = None) -> list[ProcessIdentity]:
    """The identities of ``pid``'s ancestors, nearest first (``pid`` itself excluded)."""
    import psutil

    found: list[ProcessIdentity] = []
    try:
        process = psutil.Process(os.getpid() if pid is None else pid)
        parents = process.parents()
    except psutil.Error:
        return found
    for parent in parents:
        identity = identify(parent.pid)
        if identity is not None:
            found.append(identity)
    return found


def cmdline(identity: ProcessIdentity) -> list[str] | None:
    """The argv of the process ``identity`` names, or None if it is gone (or another process now
    holds the pid). A process may have rewritten it (pi sets its title to ``pi``)."""
    try:
        with open(f"/proc/{identity.pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    if not is_alive(identity):
        return None
    return [os.fsdecode(word) for word in raw.split(b"\0")[:-1]]


def with_argument(word: str) -> list[ProcessIdentity]:
    """Processes of this user with ``word`` as one whole argv element, or one naming a path under
    it (e.g. a unique scratch state dir, or a FIFO in it): how the demo finds the helpers it
    started indirectly (the pane pipes tmux's pipe-pane runs)."""
    found: list[ProcessIdentity] = []
    me = os.getpid()
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            if os.stat(f"/proc/{name}").st_uid != os.geteuid():
                continue
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        whole, under = os.fsencode(word), os.fsencode(word.rstrip("/") + "/")
        if any(arg == whole or arg.startswith(under) for arg in argv):
            identity = identify(int(name))
            if identity is not None:
                found.append(identity)
    return found


def _usage(pid: int) -> tuple[float, int, float] | None:
    import psutil

    try:
        process = psutil.Process(pid)
        with process.oneshot():
            times, memory, started = process.cpu_times(), process.memory_info(), process.create_time()
    except psutil.Error:
        return None
    return float(times.user + times.system), int(memory.rss), max(0.0, time.time() - started)


def rss_bytes(pid: int) -> int | None:
    """Resident set size of ``pid`` in bytes, or None if it is gone."""
    return None if (got := _usage(pid)) is None else got[1]


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` so far, or None if it is gone."""
    return None if (got := _usage(pid)) is None else got[0]


def usage(identity: ProcessIdentity) -> tuple[float, int, float] | None:
    """CPU seconds so far, resident bytes and seconds since it started, of exactly this process
    (one /proc read), or None when it is gone or its pid now names another. Instant: a CPU % is
    two of these apart (``psutil.cpu_percent(interval)`` would sleep the caller)."""
    return _usage(identity.pid) if identify(identity.pid) == identity else None


class SignalWakeup:
    """Turn signals into readable bytes on a pipe (``signal.set_wakeup_fd``), so one ``select``
    loop sees everything and the host's selector wakes at once instead of polling."""

    def __init__(self, signals: tuple[int, ...]) -> None:
        self.read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._signals = signals
        self._previous: dict[int, object] = {}
        self._old_wakeup = -1

    def __enter__(self) -> SignalWakeup:
        self._old_wakeup = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, lambda *_: None)
        return self

    def drain(self) -> list[int]:
        """The signals received since the last drain, in order."""
        received: list[int] = []
        while True:
            try:
                chunk = os.read(self.read_fd, 512)
            except BlockingIOError:
                return received
            if not chunk:
                return received
            received.extend(chunk)

    def __exit__(self, *_exc: object) -> None:
        signal.set_wakeup_fd(self._old_wakeup)
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        os.close(self.read_fd)
        os.close(self._write_fd)
