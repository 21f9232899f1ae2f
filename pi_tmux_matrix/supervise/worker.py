"""The worker side of the host: watching the declared parent, winding down to ``resumable`` when
it is gone, the one steer notice, and the grace window that ends in an adoption, a cleanup, or
expiry (docs/decisions.md#a-worker-whose-parent-is-lost-winds-down-and-waits).

The parent is watched with a pidfd, so its death is seen at once; the loop's ``watcherPollMs``
poll is the safety net, and it also asks what a pidfd cannot tell (the origin's
``declaredParentIsAlive``): is the parent a running master of this matrix, and does its heartbeat
still move? A parent that is not a registered master, or whose heartbeat stood still for
``2 x heartbeatMs + watcherPollMs`` of this host's own monotonic time, is lost like a dead one.
That window is never measured across a suspend or a wall-clock jump this host detected: it is
recorded and the window starts again. A master's host has no parent: its phase stays
``RUNNING`` until it is asked to stop.
"""

from __future__ import annotations

import contextlib
import enum
import os
import selectors
import time
from collections.abc import Iterable
from typing import Final

import attrs

from .. import procs
from ..errors import PiMatrixError
from ..identity import ProcessIdentity, Role
from ..matrix import lifecycle
from ..matrix.model import DirectiveKind, Entry, ExitKind, Status
from ..matrix.owners import master_entry, masters_of
from ..matrix.store import now_ms
from .child import AgentChild
from .record import OwnRecord

__all__ = [
    "PARENT_TAG",
    "Clocks",
    "ParentBeat",
    "ParentState",
    "Phase",
    "WorkerSide",
    "grant_pending",
    "parent_master",
]

PARENT_TAG: Final = "parent"  # the selector's tag for the parent's pidfd
# How far the clocks may drift apart between two looks before it counts as a suspend or a jump:
# well above scheduling noise and NTP's slewing, well below any heartbeat window.
CLOCK_TOLERANCE_S: Final = 2.0


class Phase(enum.Enum):
    """Where the host is in its wind-down
    (docs/decisions.md#a-worker-whose-parent-is-lost-winds-down-and-waits)."""

    RUNNING = "running"  # under a live parent (or a master's own host)
    GRACE = "grace"  # the parent is gone: resumable, waiting for an adoption or a cleanup
    STOPPING = "stopping"  # a cleanup or the grace window's end: the child is being stopped


class ParentState(enum.Enum):
    """What the host's last look found of its declared parent."""

    ALIVE = "alive"  # a running master whose heartbeat moves
    GONE = "gone"  # the process is gone
    UNREGISTERED = "unregistered"  # alive, but not a running master of this matrix
    HUNG = "hung"  # its heartbeat stood still for the whole window (stopped, wedged)


@attrs.frozen
class Clocks:
    """One reading of the three clocks: monotonic (stops while the machine sleeps), boot time
    (runs on through a suspend) and the wall clock (may be set)."""

    monotonic: float
    boottime: float
    wall: float

    @classmethod
    def read(cls) -> Clocks:
        return cls(time.monotonic(), time.clock_gettime(time.CLOCK_BOOTTIME), time.time())


@attrs.define
class ParentBeat:
    """Whether the parent's heartbeat still moves, judged on this host's own clocks.

    Pure: it is given the parent's master entry (or None) and a :class:`Clocks` reading. The
    heartbeat is compared with itself, never with our wall clock (the master's clock and ours may
    disagree, and either may be set), and its age is counted in our monotonic time since we last
    saw it move. A suspend or a wall-clock jump between two looks restarts the window.
    """

    window_s: float
    tolerance_s: float = CLOCK_TOLERANCE_S
    _beat: int | None = None
    _since: float | None = None  # monotonic: when the beat was last seen to move (or the window began)
    _last: Clocks | None = None
    _unregistered: bool = False  # the last look found no running master entry of the parent

    def restart(self) -> None:
        """A new parent (an adoption): its window starts at the next look."""
        self._beat = None
        self._since = None
        self._unregistered = False

    def discontinuity(self, now: Clocks) -> tuple[str, float] | None:
        """``("suspend", seconds slept)`` or ``("clock_jump", seconds moved)`` since the last
        reading, else None."""
        last, self._last = self._last, now
        if last is None:
            return None
        ran = now.monotonic - last.monotonic
        slept = (now.boottime - last.boottime) - ran
        if slept > self.tolerance_s:
            return "suspend", round(slept, 3)
        jumped = (now.wall - last.wall) - (now.boottime - last.boottime)
        if abs(jumped) > self.tolerance_s:
            return "clock_jump", round(jumped, 3)
        return None

    def stands_still(self, master: Entry, now: Clocks) -> bool:
        """This look would find ``master``'s beat unmoved for longer than the window."""
        if self._since is None or master.heartbeat_at != self._beat:
            return False
        return now.monotonic - self._since > self.window_s

    def judge(self, master: Entry | None, now: Clocks) -> tuple[ParentState, tuple[str, float] | None]:
        """The parent's state by its master entry, and any discontinuity seen on the way."""
        jump = self.discontinuity(now)
        if master is None:
            # Confirmed on a second look: a master's session switch closes its old entry just
            # before it registers the new one, and a look in between must not lose the parent.
            seen, self._unregistered = self._unregistered, True
            return (ParentState.UNREGISTERED if seen else ParentState.ALIVE), jump
        self._unregistered = False
        if jump is not None or self._since is None or master.heartbeat_at != self._beat:
            self._beat = master.heartbeat_at
            self._since = now.monotonic
            return ParentState.ALIVE, jump
        if now.monotonic - self._since > self.window_s:
            return ParentState.HUNG, None
        return ParentState.ALIVE, None


def parent_master(entries: Iterable[Entry], parent: ProcessIdentity) -> Entry | None:
    """The running master entry of exactly this process (by pid and start time, so a session
    switch, which re-keys the master, keeps it), the freshest if it holds two for an instant."""
    return max(masters_of(entries, parent), key=lambda e: e.heartbeat_at or 0, default=None)


def grant_pending(entry: Entry, boot_id: str) -> bool:
    """A master granted adoption and is still alive (a grant can land on a running entry, before
    the host saw its parent die)."""
    d = entry.directive
    if entry.status is not Status.ADOPTED or d is None or d.kind is not DirectiveKind.ADOPT:
        return False
    if d.parent_pid is None or d.parent_proc_start is None:
        return False
    return procs.is_alive(ProcessIdentity(d.parent_pid, d.parent_proc_start, entry.boot_id or boot_id))


_LOST_AS: Final = {
    ParentState.GONE: "is gone",
    ParentState.UNREGISTERED: "is not a registered master",
    ParentState.HUNG: "stopped answering (its heartbeat stands still)",
    ParentState.ALIVE: "is gone",
}


@attrs.define(eq=False)
class WorkerSide:
    """The parent, its watch, and the phase of the wind-down."""

    record: OwnRecord
    agent: AgentChild
    role: Role
    me: ProcessIdentity
    grace_s: float  # the adoption grace window (``adoptionGraceMs``)
    # 2 x heartbeatMs + watcherPollMs: how long the parent's heartbeat may stand still; None: the
    # parent's process alone is watched (a host built without settings).
    beat_window_s: float | None = attrs.field(default=None, kw_only=True)
    parent: ProcessIdentity | None = None
    phase: Phase = Phase.RUNNING
    grace_deadline: float | None = None  # monotonic end of the grace window while in GRACE
    told_lost: bool = False  # the agent was told its parent is gone (an adoption then tells it more)
    _fd: int | None = attrs.field(default=None, init=False)  # the parent's pidfd, while watched
    _selector: selectors.BaseSelector | None = attrs.field(default=None, init=False)  # the loop's
    _beat: ParentBeat | None = attrs.field(default=None, init=False)
    lost_as: ParentState | None = attrs.field(default=None, init=False)  # why the parent was lost
    _by_listing: bool = attrs.field(default=False, init=False)  # the parent's key proved stale

    def __attrs_post_init__(self) -> None:
        if self.beat_window_s is not None:
            self._beat = ParentBeat(self.beat_window_s)

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
        """The parent holds: its process lives and (with a window) it is a running master whose
        heartbeat moves."""
        state = self.look()
        if state is not ParentState.ALIVE:
            self.lost_as = state
        return state is ParentState.ALIVE

    def look(self) -> ParentState:
        if self.parent is None or not procs.is_alive(self.parent):
            return ParentState.GONE
        if self._beat is None:
            return ParentState.ALIVE
        try:
            entries = self._parent_entries(self.parent)
        except PiMatrixError as exc:
            # The state dir cannot be read right now: that is no evidence against the parent.
            self.record.events.write("parent_unchecked", error=str(exc)[:300])
            return ParentState.ALIVE
        now = Clocks.read()
        master = parent_master(entries, self.parent)
        if master is not None and not self._by_listing and self._beat.stands_still(master, now):
            # Read by its key, the entry's beat stands still: the master may beat under another
            # key (a session switch whose close of the old entry failed). From now on it is
            # judged on all its entries, the freshest (one source, or two stale entries taking
            # turns would each look like a beat that moved).
            self._by_listing = True
            with contextlib.suppress(PiMatrixError):  # unreadable now: the key's entry is judged
                master = parent_master(self.record.store.list().entries, self.parent)
        state, jump = self._beat.judge(master, now)
        if jump is not None:
            # Recorded, and the heartbeat window starts again: a sleep of the whole machine or a
            # clock being set is never taken for a hung master.
            self.record.events.write(jump[0], seconds=jump[1])
        return state

    def _parent_entries(self, parent: ProcessIdentity) -> list[Entry]:
        """The parent's master entry, read by its key: one file, where a hundred workers' polls
        each reading the whole state dir cost the fleet most of its idle CPU
        (docs/decisions.md#a-worker-polls-its-parents-entry-not-the-state-dir). The whole
        listing only when that key is not the parent's (a session switch re-keyed it)."""
        own = self.record.entry
        if own is not None and own.parent_session_id and not self._by_listing:
            found = master_entry(self.record.store, parent, own.parent_session_id)
            if found is not None:
                return [found]
        return list(self.record.store.list().entries)

    def check(self) -> None:
        """The pidfd woke us: the parent may be gone."""
        if self.parent is None or not procs.is_alive(self.parent):
            self.lost_as = ParentState.GONE
            self.parent_lost()

    def poll(self) -> None:
        """The safety net, on every ``watcherPollMs`` tick, and the only look at the parent's
        registration and heartbeat."""
        if self.phase is Phase.RUNNING and self.role is Role.WORKER and not self.alive():
            self.parent_lost()

    # -- the wind-down ------------------------------------------------------------------------------
    def parent_lost(self) -> None:
        """The wind-down: winding_down -> resumable -> one steer notice -> grace window
        (docs/decisions.md#a-worker-whose-parent-is-lost-winds-down-and-waits)."""
        if self.role is not Role.WORKER or self.phase is not Phase.RUNNING:
            return
        record = self.record
        self.unwatch()
        self.phase = Phase.GRACE
        now = now_ms()
        why = (self.lost_as or ParentState.GONE).value
        record.events.write("parent_lost", parent_pid=self.parent.pid if self.parent else None, why=why)
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
        what = _LOST_AS[self.lost_as or ParentState.GONE]
        text = (
            f"[pi-matrix] Your parent session ({entry.parent_session_id if entry else '?'}, "
            f"pid {entry.parent_pid if entry else '?'}) {what}. Finish or checkpoint the current "
            f"step and start no new work. A master may adopt you within {self.grace_s:.0f}s; "
            "otherwise this agent will be stopped and left resumable."
        )
        self.agent.steer(text, notice=True)
        self.told_lost = True
        self.grace_deadline = time.monotonic() + self.grace_s

    # -- how the grace window ends ------------------------------------------------------------------
    def check_entry(self, current: Entry | None = None) -> None:
        """Act on a master's directive in our entry (``current``, else read now, lock-free): a
        cleanup stops the child, a grant to a live master adopts the worker."""
        if current is None:
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
        # ``current`` was read without the lock: it only says a grant is there. The grant
        # accepted is the one on disk under the lock, and the parent watched is the one that
        # write records; a grant read before may have been replaced since (a void grant
        # re-granted), and watching it would leave the entry naming a parent whose death winds
        # nothing down (docs/decisions.md#one-adoption-grant-wins).
        boot = current.boot_id or self.me.boot_id
        dead: list[int] = []
        accepted: list[Entry] = []

        def accept(entry: Entry) -> Entry | None:
            d = lifecycle.standing_grant(entry)
            if d is None or d.parent_pid is None or d.parent_proc_start is None:
                return None
            if not procs.is_alive(ProcessIdentity(d.parent_pid, d.parent_proc_start, entry.boot_id or boot)):
                dead.append(d.parent_pid)
                return None
            accepted.append(lifecycle.accept_adoption(entry, now_ms()))
            return accepted[-1]

        written = self.record.write(accept)
        if dead:
            self.record.events.write("adoption_ignored", reason="new parent not alive", pid=dead[-1])
        if written is None or not accepted or written.parent_pid is None or written.parent_proc_start is None:
            return
        new_parent = ProcessIdentity(written.parent_pid, written.parent_proc_start, written.boot_id or boot)
        self.parent = new_parent
        self.phase = Phase.RUNNING
        self.grace_deadline = None
        self.lost_as = None
        if self._beat is not None:
            self._beat.restart()
            self._by_listing = False
        # The parent now watched, as the entry names it: the evidence a host and its entry agree.
        self.record.events.write(
            "adopted",
            parent_pid=new_parent.pid,
            parent_start=new_parent.start_ticks,
            parent_session=written.parent_session_id,
        )
        if self.told_lost:
            # One notice into the agent's own session: its last one said it would be stopped.
            self.told_lost = False
            self.agent.steer(
                f"[pi-matrix] You were adopted by a new parent (session {written.parent_session_id}, "
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
