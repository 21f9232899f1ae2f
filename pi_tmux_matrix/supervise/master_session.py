"""One master run: its session claim and takeover, its pi's argv and session file, its host's
hooks, and how a worker's handoff reaches it (posted to a bridged pi, printed otherwise).

The program (cli/master.py) parses the flags, builds what lives above this layer (the
relauncher, the housekeeping, the fork hooks) and shows what happens through a
:class:`MasterView`; everything the session decides is here, so it runs the same under any
program.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Final, Protocol

import attrs

from .. import procs
from ..errors import Conflict, ContractError
from ..identity import KEY_PATTERN, AgentIdentityContract, Role
from ..matrix import lifecycle
from ..matrix.model import Entry, Handoff, Status
from ..matrix.store import MatrixStore, now_ms
from ..piversion import program_length
from .claim import check_claim, live_master, stray_agent, take_over
from .handoff_text import handoff_message
from .host import AgentHost, HostHooks
from .master import ActivationReport, Decision, Master, Prompter, one_shot

if TYPE_CHECKING:
    from .relaunch import Rehoster, Relauncher

__all__ = [
    "ACK_THREADS",
    "BRIDGE_FLAG",
    "HANDOFF_REPOST_S",
    "TAKEOVER_GRACE_S",
    "TAKEOVER_WAIT_S",
    "MasterSession",
    "MasterTerms",
    "MasterView",
    "bridged_pi",
]

HANDOFF_REPOST_S: Final = 15.0  # a handoff notice pi has not taken by then is posted again
# Threads that mark pi's taken handoffs delivered: their durable writes overlap (one journal commit
# serves several fsyncs), none holding back the next (docs/decisions.md#handoffs-are-pushed-not-polled).
ACK_THREADS: Final = 4
# --takeover: how long the old host gets to stop its agent (its own stop sequence: the request,
# then SIGTERM and SIGKILL a stop grace apart), and the grace of the stop by identity after that.
TAKEOVER_WAIT_S: Final = 10.0
TAKEOVER_GRACE_S: Final = 3.0
BRIDGE_FLAG: Final = "-e"  # as the dispatcher loads it: the host then expects the bridge to report
_SESSION_FLAGS: Final = frozenset(
    {"--session", "--continue", "-c", "--resume", "-r", "--no-session", "--fork"}
)


def _session_of(session_id: str, cwd: str, previous: Entry | None) -> tuple[str, str]:
    """The pi session file of ``session_id`` and the cwd it runs in: the one file already holding
    that session (recorded by its last master, else found by its name) is continued, never a
    second file with the same header id; a new one goes where pi keeps ``cwd``'s sessions."""
    from ..pisession import new_session_file, read_header, session_file_of

    recorded = []
    if previous is not None:
        recorded.append(previous.identity.session_file)
        if previous.resumable is not None:
            recorded.append(previous.resumable.identity.session_file)
    found = session_file_of(session_id, recorded)
    if found is None:
        return new_session_file(cwd, session_id), cwd
    # pi runs a session in the cwd of its header, and stops at a prompt when that folder is gone.
    header_cwd = read_header(found, field="--session-id").cwd
    if not os.path.isdir(header_cwd):
        raise ContractError(
            "--session-id",
            f"session {session_id} is in {found}, whose folder {header_cwd} (its header's cwd) is gone",
            "restore that folder, or give pi another session (--session FILE after --) or another "
            "--session-id",
        )
    return found, header_cwd


def bridged_pi(
    argv: list[str], session_id: str, cwd: str, previous: Entry | None
) -> tuple[list[str], str | None, str]:
    """A pi master's argv with the bridge (master mode) and, unless the argv names its own
    session, ``--session`` with the session's one file (so pi's session id is the master's and a
    restarted master continues its conversation); and the cwd pi runs it in."""
    from ..bridge import bridge_path

    # pi's flags go after the program: `pi`, or `node …/cli.js`.
    at = program_length(argv)
    head, rest = argv[:at], argv[at:]
    added = [BRIDGE_FLAG, str(bridge_path())]
    session_file = None
    if not any(word.split("=", 1)[0] in _SESSION_FLAGS for word in rest):
        session_file, cwd = _session_of(session_id, cwd, previous)
        added += ["--session", session_file]
    return [*head, *added, *rest], session_file, cwd


class MasterView(Protocol):
    """What a person sees of a master run; the program decides how it looks and where it goes."""

    def activated(self, report: ActivationReport) -> None:
        """An activation's report (delivered handoffs were shown one by one already)."""

    def reclaimed(self, decisions: list[Decision]) -> None:
        """What a master that came back took back (its workers had counted it hung or lost)."""

    def died(self, entries: list[Entry]) -> None:
        """Its workers found dead outright (host and agent gone), now resumable."""

    def handoff(self, entry: Entry, handoff: Handoff) -> None:
        """A handoff for a master that is not a bridged pi: shown on its terminal."""

    def taking_over(self, old: Entry) -> None:
        """--takeover is stopping the session's old master (which may take seconds)."""

    def took_over(self, done: str) -> None:
        """How the takeover ended."""


@attrs.frozen(kw_only=True)
class MasterTerms:
    """What one master run is, fixed before it starts: the program's flags and wiring."""

    store: MatrixStore
    identity: AgentIdentityContract
    task_ref: str | None
    task_state: str
    takeover: bool
    # A pi with the bridge that can take a notice: handoffs are posted to it, else printed.
    bridged: bool
    relauncher: Relauncher
    rehoster: Rehoster | None = None  # a live agent whose host died gets a new one (rehost.py)
    prompter: Prompter | None = None  # None: foreign orphans are reported, nobody is asked
    housekeeping: Callable[[MatrixStore], object] | None = None

    @property
    def session_id(self) -> str:
        return self.identity.session_id

    @property
    def key(self) -> str:
        return self.identity.key(Role.MASTER)


@attrs.define
class MasterSession:
    """One master run: what its host hooks share (the host once registered, the Master once
    activated) and when each handoff notice was last posted to a bridged pi."""

    terms: MasterTerms
    view: MasterView
    host: AgentHost | None = None
    master: Master | None = None
    posted: dict[str, float] = attrs.field(factory=dict)
    awaiting: dict[str, str] = attrs.field(factory=dict)  # handoff id -> entry key, posted to pi
    replaced: Entry | None = None  # the record this master's registration replaced
    acks: ThreadPoolExecutor | None = None  # the running host's (see ACK_THREADS); none for --once
    ready: bool = False  # the bridge has reported: handoffs held until then were posted

    def claim(self, previous: Entry | None) -> None:
        """Under the entry's lock, as this master registers: one master per session (--takeover
        overrides), and the record it replaces kept for the takeover."""
        check_claim(previous, takeover=self.terms.takeover)
        self.replaced = previous

    def _start_session(self) -> None:
        """Registered: an old master of the session yields (--takeover), then the pi session file
        gets its header if it is new (so pi's session id is ours), before any agent starts."""
        from ..pisession import write_header

        old, terms = self.replaced, self.terms
        if terms.takeover and old is not None and (live_master(old) or stray_agent(old)):
            self.view.taking_over(old)
            done = take_over(
                terms.store, old, sender=terms.key, wait_s=TAKEOVER_WAIT_S, grace_s=TAKEOVER_GRACE_S
            )
            self.view.took_over(done)
        session_file = terms.identity.session_file
        if session_file is not None:  # only a file this master chose for pi (none if argv names one)
            write_header(session_file, terms.session_id, terms.identity.cwd or os.getcwd())

    def _master_at(self, me: procs.ProcessIdentity, *, deliver: bool) -> Master:
        terms = self.terms
        return Master(
            terms.store,
            terms.session_id,
            me,
            terms.relauncher,
            task_ref=terms.task_ref,
            task_state=terms.task_state,
            prompter=terms.prompter,
            rehoster=terms.rehoster,
            deliver=self.deliver if deliver else None,
            acks=self.acks,
            housekeeping=terms.housekeeping,
        )

    def deliver(self, entry: Entry, handoff: Handoff) -> bool:
        """Hand one handoff to the master; True once it may be marked delivered."""
        host = self.host
        if not self.terms.bridged or host is None:
            self.view.handoff(entry, handoff)
            return True
        if handoff.id in host.reports.handoffs_accepted:
            self.awaiting.pop(handoff.id, None)
            return True  # pi took it: now the handoff may be marked delivered
        if host.reports.seen:
            last = self.posted.get(handoff.id)
            if last is None or time.monotonic() - last > HANDOFF_REPOST_S:
                body = {"id": handoff.id, "parentSessionId": handoff.parent_session_id}
                host.notices.notify("handoff", json.dumps({**body, "text": handoff_message(entry, handoff)}))
                self.posted[handoff.id] = time.monotonic()
                self.awaiting[handoff.id] = entry.key
            return False
        if host.child is None or (host.reports.expected_by or 0) > time.monotonic():
            return False  # pi and its bridge are still starting
        self.view.handoff(entry, handoff)  # the bridge never reported: shown instead
        return True

    def once(self, *, deliver: bool) -> ActivationReport:
        """``--once``: register this process as the master, activate, and return the report
        (``deliver``: show the pending handoffs as it goes; --json leaves them pending)."""
        terms = self.terms
        me = procs.current()
        registered = terms.store.register(
            lifecycle.new_entry(
                role=Role.MASTER, identity=terms.identity, process=me, now=now_ms(), task_ref=terms.task_ref
            ),
            check=self.claim,
        )
        try:
            self._start_session()
            return one_shot(self._master_at(me, deliver=deliver).activate())
        finally:
            # This process ends here: its record must not stay `running` under a dead pid (every
            # view would show a master that is not there). Closed as a host closes its own record;
            # a newer registration of the session meanwhile is left alone.
            with contextlib.suppress(Conflict):
                terms.store.update(
                    registered.key,
                    lambda e: lifecycle.close(e, "once", now_ms()) if e.can_move_to(Status.CLOSED) else None,
                    registration=registered.registration,
                )

    def hooks(
        self, *, on_tick: Callable[[AgentHost], None], on_agent_end: Callable[[AgentHost], None]
    ) -> HostHooks:
        """The host's hooks for this session; ``on_tick`` and ``on_agent_end`` are the program's
        own (fork results and forks, from the layer above), run after the session's."""

        def tick(host: AgentHost) -> None:
            self.on_tick(host)
            on_tick(host)

        return HostHooks(
            self.on_registered,
            tick,
            self.on_switch,
            on_agent_end,
            may_register=self.claim,
            on_wake=self.on_wake,
        )

    def on_registered(self, host: AgentHost) -> None:
        self.host = host
        self._start_session()
        self.acks = ThreadPoolExecutor(ACK_THREADS, thread_name_prefix="handoff-ack")
        self.master = self._master_at(host.me, deliver=True)
        self.view.activated(self.master.activate())

    def on_wake(self, host: AgentHost) -> None:
        # A worker's word that its entry holds a new handoff, and pi's taking of some (its
        # bridge's report came in): delivered and acknowledged now
        # (docs/decisions.md#handoffs-are-pushed-not-polled). At the first report (pi is ready)
        # what was held is posted (docs/decisions.md#handoffs-go-in-when-pi-is-ready).
        keys: set[str] | None = {k for h, k in self.awaiting.items() if h in host.reports.handoffs_accepted}
        keys = (keys or set()) | {k for k in host.handoffs_told if KEY_PATTERN.fullmatch(k)}
        host.handoffs_told.clear()
        if host.reports.seen and not self.ready:
            self.ready, keys = True, None
        self._deliver(keys)

    def _deliver(self, keys: set[str] | None) -> None:
        if self.master is not None and keys != set():
            self.master.deliver_handoffs(keys)

    def on_tick(self, _host: AgentHost) -> None:
        if self.master is not None:
            self.master.deliver_handoffs()
            self.view.died(self.master.notice_dead())
            self.view.reclaimed(self.master.reclaim())

    def close(self) -> None:
        """The host is done: the marks already queued are written before the process ends."""
        if self.acks is not None:
            self.acks.shutdown(wait=True)

    def on_switch(self, host: AgentHost, _old_key: str) -> None:
        # Identity, notices and the orphan scan follow the active session.
        if self.master is not None:
            self.master.session_id = host.spec.identity.session_id
            self.master.task_ref = host.spec.contract.task_ref
            self.view.activated(self.master.activate())
