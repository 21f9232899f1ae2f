"""An agent whose host is gone: seen, and stopped by its identity without its host.

Every view says ``agent pid N unsupervised`` of it (:func:`unsupervised`); ``stop KEY`` and
``stop JOB`` reach it through :func:`stop_stray`: SIGTERM, the grace, SIGKILL, each after checking
its identity (a print or rpc agent with the process group it leads, as its host would), and its
end recorded as ``killed`` with the code unknown (it is nobody's child to wait for). A master
takes such an agent over with a new host instead (``recovery.rehost``).
"""

from __future__ import annotations

from .. import procs
from ..errors import NotFound, PiMatrixError
from ..identity import Mode, ProcessIdentity
from . import lifecycle
from .mailbox import announce_handoffs
from .model import Entry, ExitKind, ExitRecord, Status
from .store import MatrixStore, now_ms

__all__ = ["shown_status", "stop_agent", "stop_stray", "stray_agent", "unsupervised"]

# What a live host writes of its agent: a record in one of these whose host is gone is not true.
_SAYS_RUNNING = frozenset({Status.RUNNING, Status.ADOPTED, Status.WINDING_DOWN})


def stray_agent(entry: Entry) -> ProcessIdentity | None:
    """The agent ``entry`` names, when it runs while its host does not."""
    agent = entry.child_process
    if agent is None or procs.is_alive(entry.process) or not procs.is_alive(agent):
        return None
    return agent


def unsupervised(entry: Entry) -> str | None:
    """What every view says of an agent running without its host, or None."""
    agent = stray_agent(entry)
    return None if agent is None else f"agent pid {agent.pid} unsupervised"


def shown_status(entry: Entry, host_alive: bool, *, reason: bool = True) -> str:
    """The status every view shows (``ls``, ``tree``, ``top``): the record's words; but for a
    record that says its agent runs while its host is gone, what is true: ``running, host gone``
    while the agent runs on unsupervised, else ``gone (recorded running)``: nothing of it runs
    (``resume`` or ``reconcile`` settles it). ``reason=False``: without the record's reason (a
    view with a column of its own for it)."""
    if host_alive or entry.status not in _SAYS_RUNNING:
        if reason:
            return entry.status_text
        return entry.status.value + (f" ({entry.readiness})" if entry.readiness else "")
    if stray_agent(entry) is not None:
        return f"{entry.status.value}, host gone"
    return f"gone (recorded {entry.status.value})"


def stop_agent(agent: ProcessIdentity, mode: Mode | None, grace_s: float) -> bool:
    """SIGTERM, up to ``grace_s`` to leave, then SIGKILL: each signal to exactly ``agent``
    (identity checked right before the send), a print or rpc agent with its process group as its
    host would. True once it is gone."""
    group = (mode or Mode.INTERACTIVE) is not Mode.INTERACTIVE  # a print/rpc agent leads its group
    return not procs.stop([agent], grace_s, group=group)


def stop_stray(store: MatrixStore, entry: Entry, *, grace_s: float) -> Entry | None:
    """Stop the agent ``entry`` names while its host is gone, and record its end as ``killed``
    (a worker's owner gets it as a handoff; a master's record closes). Returns the entry as
    written, None when it changed meanwhile (a new host registered: its record is its own)."""
    agent = stray_agent(entry)
    if agent is None:
        raise PiMatrixError(f"{entry.key}: no agent of it runs without its host; nothing was stopped")
    if not stop_agent(agent, entry.identity.mode, grace_s):
        raise PiMatrixError(
            f"{entry.key}: its agent (pid {agent.pid}) is still there after SIGKILL (stuck in the kernel, "
            "or another user's?); look at it with 'ps -o pid,stat,wchan -p PID'"
        )
    now = now_ms()
    ended = ExitRecord(kind=ExitKind.KILLED, at=now)  # code unknown: it was nobody's child

    def finish(current: Entry) -> Entry | None:
        same = (current.registration, current.child_pid) == (entry.registration, entry.child_pid)
        if not same or not current.can_move_to(Status.TERMINAL):
            return None
        summary = "stopped by its owner (pi-matrix stop) while its host was gone"
        return lifecycle.record_terminal(current, ended, now, summary=summary)

    try:
        written = store.update(entry.key, finish)
    except NotFound:
        return None
    if written.exit != ended:
        return None
    announce_handoffs(store, entry, written)
    return written
