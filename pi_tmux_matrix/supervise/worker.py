"""The worker side of the host (seed 000): watching the declared parent, winding down to
``resumable`` when it is gone, the one steer notice, and the grace window that ends in an
adoption, a cleanup, or expiry.

The parent is watched with a pidfd, so its death is seen at once; the loop's ``watcherPollMs``
poll is the safety net. A master's host has no parent: its phase stays ``RUNNING`` until it is
asked to stop.
"""

from __future__ import annotations

import enum
import os
import selectors
import time
from typing import Final

import attrs

from .. import procs
from ..identity import ProcessIdentity, Role
from ..matrix import lifecycle
from ..matrix.model import DirectiveKind, Entry, ExitKind, Status
from ..matrix.store import now_ms
from .child import AgentChild
from .record import OwnRecord

__all__ = ["PARENT_TAG", "Phase", "WorkerSide", "grant_pending"]

PARENT_TAG: Final = "parent"  # the selector's tag for the parent's pidfd


class Phase(enum.Enum):
    """Where the host is in the seed's wind-down."""

    RUNNING = "running"  # under a live parent (or a master's own host)
    GRACE = "grace"  # the parent is gone: resumable, waiting for an adoption or a cleanup
    STOPPING = "stopping"  # a cleanup or the grace window's end: the child is being stopped


def grant_pending(entry: Entry, boot_id: str) -> bool:
    """A master granted adoption and is still alive (a grant can land on a running entry, before
    the host saw its parent die)."""
    d = entry.directive
    if entry.status is not Status.ADOPTED or d is None or d.kind is not DirectiveKind.ADOPT:
        return False
    if d.parent_pid is None or d.parent_proc_start is None:
        return False
    return procs.is_alive(ProcessIdentity(d.parent_pid, d.parent_proc_start, entry.boot_id or boot_id))


def _accept(entry: Entry) -> Entry | None:
    d = entry.directive
    if d is None or d.kind is not DirectiveKind.ADOPT or entry.status is not Status.ADOPTED:
        return None
    return lifecycle.accept_adoption(entry, now_ms())


@attrs.define(eq=False)
class WorkerSide:
    """The parent, its watch, and the phase of the wind-down."""

    record: OwnRecord
    agent: AgentChild
    role: Role
    me: ProcessIdentity
    grace_s: float  # the adoption grace window (``adoptionGraceMs``)
    parent: ProcessIdentity | None = None
    phase: Phase = Phase.RUNNING
    grace_deadline: float | None = None  # monotonic end of the grace window while in GRACE
    told_lost: bool = False  # the agent was told its parent is gone (an adoption then tells it more)
    _fd: int | None = attrs.field(default=None, init=False)  # the parent's pidfd, while watched
    _selector: selectors.BaseSelector | None = attrs.field(default=None, init=False)  # the loop's

    # -- the watch --------------------------------------------------------------------------------
    def start_watching(self, selector: selectors.BaseSelector) -> None:
        self._selector = selector
        if self.phase is Phase.RUNNING:
            self._watch()

    def stop_watching(self) -> None:
        self.unwatch()
        self._selector = None

    def _watch(self) -> None:
        self.unwatch()
        if self.parent is None or self._selector is None:
            return
        fd = procs.open_pidfd(self.parent)
        if fd is None:
            return
        self._fd = fd
        self._selector.register(fd, selectors.EVENT_READ, PARENT_TAG)

    def unwatch(self) -> None:
        if self._fd is not None:
            if self._selector is not None:
                self._selector.unregister(self._fd)
            os.close(self._fd)
            self._fd = None

    def alive(self) -> bool:
        return self.parent is not None and procs.is_alive(self.parent)

    def check(self) -> None:
        """The pidfd woke us: the parent may be gone."""
        if not self.alive():
            self.parent_lost()

    def poll(self) -> None:
        """The safety net, on every ``watcherPollMs`` tick."""
        if self.phase is Phase.RUNNING and self.role is Role.WORKER and not self.alive():
            self.parent_lost()

    # -- the wind-down ------------------------------------------------------------------------------
    def parent_lost(self) -> None:
        """Seed 000 steps 1-3: winding_down -> resumable -> one steer notice -> grace window."""
        if self.role is not Role.WORKER or self.phase is not Phase.RUNNING:
            return
        record = self.record
        self.unwatch()
        self.phase = Phase.GRACE
        now = now_ms()
        record.events.write("parent_lost", parent_pid=self.parent.pid if self.parent else None)
        boot = self.me.boot_id

        # Winding down over a live grant would void an approved adoption, so the grant wins; a
        # grant to a master that is itself gone is dropped with the wind-down.
        def down(e: Entry) -> Entry | None:
            if grant_pending(e, boot) or not e.can_move_to(Status.WINDING_DOWN):
                return None
            if e.status is Status.ADOPTED:
                e = attrs.evolve(e, directive=None)
            return lifecycle.wind_down(e, now)

        record.write(down)
        record.write(
            lambda e: (
                lifecycle.make_resumable(e, now_ms())
                if not grant_pending(e, boot) and e.can_move_to(Status.RESUMABLE)
                else None
            )
        )
        self.check_entry()  # a grant or a cleanup request that landed first is honoured now
        if self.phase is not Phase.GRACE:
            return
        entry = record.entry
        text = (
            f"[pi-matrix] Your parent session ({entry.parent_session_id if entry else '?'}, "
            f"pid {entry.parent_pid if entry else '?'}) is gone. Finish or checkpoint the current "
            f"step and start no new work. A new master may adopt you within {self.grace_s:.0f}s; "
            "otherwise this agent will be stopped and left resumable."
        )
        self.agent.steer(text, notice=True)
        self.told_lost = True
        self.grace_deadline = time.monotonic() + self.grace_s

    # -- how the grace window ends ------------------------------------------------------------------
    def check_entry(self) -> None:
        """Read our entry (lock-free) and act on a master's directive: a cleanup stops the child, a
        grant to a live master adopts the worker."""
        current = self.record.read()
        if current is None:
            return
        directive = current.directive
        if directive is None:
            return
        if directive.kind is DirectiveKind.CLEANUP and not self.agent.stop.requested:
            self.record.events.write("cleanup_requested", by=directive.parent_session_id)
            self.phase = Phase.STOPPING
            self.agent.request_stop(ExitKind.KILLED, "cleanup")
        elif directive.kind is DirectiveKind.ADOPT and current.status is Status.ADOPTED:
            self._accept_adoption(current)

    def _accept_adoption(self, current: Entry) -> None:
        directive = current.directive
        assert directive is not None
        boot = current.boot_id or self.me.boot_id
        if directive.parent_pid is None or directive.parent_proc_start is None:
            return
        new_parent = ProcessIdentity(directive.parent_pid, directive.parent_proc_start, boot)
        if not procs.is_alive(new_parent):
            self.record.events.write("adoption_ignored", reason="new parent not alive", pid=new_parent.pid)
            return
        if self.record.write(_accept) is None:
            return
        self.parent = new_parent
        self.phase = Phase.RUNNING
        self.grace_deadline = None
        self.record.events.write(
            "adopted", parent_pid=new_parent.pid, parent_session=directive.parent_session_id
        )
        if self.told_lost:
            # One notice into the agent's own session: its last one said it would be stopped.
            self.told_lost = False
            self.agent.steer(
                f"[pi-matrix] You were adopted by a new parent (session {directive.parent_session_id}, "
                f"pid {new_parent.pid}). Resuming: carry on with your task.",
                notice=True,
            )
        self._watch()
        if not procs.is_alive(new_parent):
            self.parent_lost()

    def expired(self, now: float) -> bool:
        return self.grace_deadline is not None and now >= self.grace_deadline

    def expire(self) -> None:
        """Nobody adopted the worker in time: its child is stopped, its entry left resumable."""
        self.grace_deadline = None
        self.record.events.write("grace_expired")
        self.phase = Phase.STOPPING
        self.agent.request_stop(ExitKind.KILLED, "grace_expired")
