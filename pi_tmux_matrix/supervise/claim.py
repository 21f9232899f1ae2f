"""One agent per session file: a session's one master, and an agent whose host is gone.

A session id names one conversation: one pi session file, one master, one agent writing it.
:func:`check_claim` is what a new master of a session checks against the record it would
replace (before anything is written, and again under the entry's lock as it registers): a live
master of the session refuses it, and so does the agent of its last master still running
without a host. ``--takeover`` overrides both, and :func:`take_over` then makes the new master
the only one: the old host is woken to find the generation fence (it tells its user once and
stops its agent: :class:`Yielding`), and an agent still running after the wait (its host hung,
or gone) is stopped by its identity.

An agent whose host is gone is never left unseen: :func:`unsupervised` is what every view says
of it, and :func:`stop_stray` is how ``stop KEY`` reaches it without its host: SIGTERM, the
grace, SIGKILL, each after checking its identity, and its end recorded as ``killed`` (code
unknown: it is nobody's child to wait for).
"""

from __future__ import annotations

import logging
from typing import IO, Final

import attrs

from .. import procs
from ..errors import PiMatrixError
from ..identity import Mode, Role
from ..matrix.mailbox import Inbox
from ..matrix.model import Entry, ExitKind, Status
from ..matrix.store import MatrixStore
from ..matrix.strays import stop_agent, stop_stray, stray_agent, unsupervised
from .child import AgentChild
from .record import OwnRecord

__all__ = [
    "TAKEN_OVER",
    "Yielding",
    "check_claim",
    "live_master",
    "stop_agent",
    "stop_stray",
    "stray_agent",
    "take_over",
    "unsupervised",
]

log = logging.getLogger(__name__)

TAKEN_OVER: Final = "taken_over"  # the stop reason of a master's agent whose session was taken over


def _stop_command(key: str) -> str:
    # cli/base.py's STOP_WORD: the one word every stop takes (the CLI sits above this layer).
    return f"pi-matrix stop {key} --confirm yes-tmux-stop"


def live_master(entry: Entry | None) -> bool:
    """A master's host that is alive and has not recorded its end."""
    return (
        entry is not None
        and entry.role is Role.MASTER
        and entry.status not in (Status.TERMINAL, Status.CLOSED)
        and procs.is_alive(entry.process)
    )


def check_claim(previous: Entry | None, *, takeover: bool) -> None:
    """Refuse a new master of ``previous``'s session while its master lives, or while the agent
    of its last master runs on without a host (it writes the session file the new master would
    continue); ``takeover`` overrides both. Raises before anything is written."""
    if previous is None or takeover or previous.role is not Role.MASTER:
        return
    session = previous.identity.session_id
    if live_master(previous):
        running = f", agent pid {previous.child_pid}" if procs.is_alive(previous.child_process) else ""
        raise PiMatrixError(
            f"--session-id {session}: session {session} already has a live master (host pid "
            f"{previous.pid}{running}); stop it with '{_stop_command(previous.key)}', or pass "
            "--takeover to make this one its only master (the old one stops its agent)"
        )
    agent = stray_agent(previous)
    if agent is not None:
        raise PiMatrixError(
            f"--session-id {session}: the agent of its last master (pid {agent.pid}) still runs "
            f"without its host (pid {previous.pid}, gone) and writes the session this master would "
            f"continue; stop it with '{_stop_command(previous.key)}', or pass --takeover to stop it "
            "and go on"
        )


def take_over(store: MatrixStore, previous: Entry, *, sender: str, wait_s: float, grace_s: float) -> str:
    """After a ``--takeover`` master registered over ``previous``: wake the old host (it finds the
    fence, tells its user and stops its agent), wait up to ``wait_s`` for its agent to end, and
    stop it by its identity if it has not (a hung host, or none). Returns what was done."""
    host_alive = procs.is_alive(previous.process)
    agent = previous.child_process if procs.is_alive(previous.child_process) else None
    if host_alive:
        try:
            Inbox(store, previous.key).post("wake", sender=sender, to=previous.registration)
        except PiMatrixError as exc:  # the wait and the stop below still hold
            log.warning("%s: the old host was not woken: %s", previous.key, exc)
    done = f"took over session {previous.identity.session_id}"
    if agent is None:
        return done + (f" from host pid {previous.pid}" if host_alive else "")
    if host_alive and procs.wait_for_exit(agent, wait_s):
        return done + f" from host pid {previous.pid}; its agent (pid {agent.pid}) stopped"
    if not stop_agent(agent, previous.identity.mode, grace_s):
        raise PiMatrixError(
            f"--takeover: the old agent (pid {agent.pid}) is still there after SIGKILL; this master "
            "starts no second agent on its session"
        )
    return done + f"; its agent (pid {agent.pid}) was stopped by its identity"


@attrs.define(eq=False)
class Yielding:
    """A host whose entry a newer process generation registered (another master's
    ``--takeover``, or its agent's session taken up by another host). The fence already keeps its
    writes out; a master's host also stops its agent (two would write one session file). Its
    user is told once, on stderr: at once, or, while an interactive agent still holds the
    terminal, once that agent is gone (its screen would swallow the line)."""

    record: OwnRecord
    agent: AgentChild
    role: Role
    err: IO[str]
    line: str | None = None
    told: bool = False

    def __call__(self, _found: str | None) -> None:
        if self.line is not None:
            return
        try:
            successor = self.record.store.find(self.record.key)
        except PiMatrixError:
            successor = None
        who = f"pid {successor.pid}" if successor is not None and successor.pid else "another process"
        running = self.agent.popen is not None and self.agent.popen.poll() is None
        stopping = self.role is Role.MASTER and running
        self.line = f"pi-matrix: {self.record.key} was taken over by {who}: this host writes nothing more" + (
            "; its agent is stopped" if stopping else ""
        )
        if stopping:
            self.agent.request_stop(ExitKind.KILLED, TAKEN_OVER)
        elif self.role is Role.MASTER:
            # No agent (left): only the loop ends. Nothing is told through the agent's mailbox,
            # which the new master's agent reads now.
            self.agent.stop.begin(ExitKind.KILLED, TAKEN_OVER)
        if not (stopping and self.agent.mode is Mode.INTERACTIVE):
            self.tell()

    def tell(self) -> None:
        """Say it, once."""
        if self.line is None or self.told:
            return
        self.told = True
        self.err.write(self.line + "\n")
        self.err.flush()
