"""Master activation: reconcile once, scan once for orphans, recover or ask, deliver handoffs.

A master never kills what it finds (docs/decisions.md#the-matrix-never-kills-on-its-own). Exact
orphans (recorded ``parentSessionId`` and ``taskRef`` equal to this master's session and task)
are recovered without asking: live ones re-adopted, dead ones with a complete pi context
relaunched into their exact session. Every foreign orphan is owner-gated: with a TTY the owner is
asked (resume / adopt / clean up / leave); headless, it is only reported and nothing is written
(docs/decisions.md#exact-orphans-are-recovered-without-asking).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from typing import IO, Final, Protocol

import attrs

from .. import procs
from ..errors import AdoptionRefused, Conflict, NotFound, PiMatrixError, ResumeRefused
from ..identity import ProcessIdentity, Role
from ..matrix import lifecycle
from ..matrix.mailbox import EventLog, Inbox
from ..matrix.model import Entry, Handoff, Status
from ..matrix.reconcile import ActionKind, Facts, Plan, reconcile
from ..matrix.store import MatrixStore, now_ms
from ..matrix.strays import stray_agent
from .decisions import Decision, await_acceptance, launching_note, told_one_shot
from .relaunch import Rehoster, Relauncher

__all__ = [
    "ActivationReport",
    "Decision",
    "Master",
    "Prompter",
    "TtyPrompter",
    "apply_plan",
    "gather_facts",
    "gave_up_on_parent",
    "grant",
    "handshake",
    "is_exact",
    "one_shot",
    "recorded_goal",
    "settle_dead",
]

log = logging.getLogger(__name__)

TASK_STATES: Final = ("active", "blocked", "terminal")
# The task ref the dispatcher once made up for a launch without a goal: ``job:`` and the job id.
MINTED_TASK_REF: Final = re.compile(r"job:job-[0-9]{8}-[0-9]{6}-[0-9a-f]{6}")


class Prompter(Protocol):
    """Asks the owner a yes/no question."""

    def ask(self, question: str) -> bool: ...


@attrs.define
class TtyPrompter:
    """Asks on a terminal; anything but y/yes is no."""

    input: IO[str]
    output: IO[str]

    def ask(self, question: str) -> bool:
        self.output.write(f"{question} [y/N] ")
        self.output.flush()
        answer = self.input.readline()
        return answer.strip().lower() in ("y", "yes")


@attrs.frozen
class ActivationReport:
    """Everything one activation did, for the CLI to print."""

    key: str
    session_id: str
    reconciled: tuple[tuple[str, str, str], ...]  # (key, action, reason)
    orphans: tuple[Decision, ...]
    delivered: tuple[tuple[str, Handoff], ...]


def one_shot(report: ActivationReport) -> ActivationReport:
    """The report of ``master --once``, whose process ends right after it: see
    :func:`~.decisions.told_one_shot`."""
    return attrs.evolve(report, orphans=tuple(told_one_shot(d) for d in report.orphans))


def gave_up_on_parent(entry: Entry) -> bool:
    """The worker itself counted its parent lost (dead, hung, or not a running master) and winds
    down or waits ``resumable``. Its parent's process may live on (a stopped master), and it is
    still no parent: such a worker is an orphan like one whose parent died."""
    return (
        entry.role is Role.WORKER
        and entry.status in (Status.WINDING_DOWN, Status.RESUMABLE)
        and entry.reason == lifecycle.PARENT_LOST
    )


def gather_facts(entries: Iterable[Entry], now: int | None = None) -> Facts:
    """Liveness by process identity, for the pure reconciliation pass."""
    alive: dict[str, bool] = {}
    child: dict[str, bool] = {}
    parent: dict[str, bool] = {}
    for entry in entries:
        alive[entry.key] = procs.is_alive(entry.process)
        child[entry.key] = procs.is_alive(entry.child_process)
        parent[entry.key] = procs.is_alive(entry.parent_process) and not gave_up_on_parent(entry)
    return Facts(now_ms=now_ms() if now is None else now, alive=alive, child_alive=child, parent_alive=parent)


def apply_plan(store: MatrixStore, plan: Plan) -> list[tuple[str, str, str]]:
    """Apply a plan under CAS; an entry that changed meanwhile is skipped for the next pass."""
    done: list[tuple[str, str, str]] = []
    for action in plan.actions:
        if action.kind is ActionKind.KEEP:
            continue
        try:
            if action.kind is ActionKind.REMOVE:
                store.delete(action.key, action.generation)
            elif action.entry is not None:
                store.replace(action.key, action.generation, action.entry)
        except Conflict:
            done.append((action.key, "skipped", "changed since the facts were gathered"))
            continue
        except PiMatrixError as exc:
            done.append((action.key, "failed", str(exc)))
            continue
        done.append((action.key, action.kind.value, action.reason))
    return done


# What a live host says of its agent; a record in one of these whose host and agent are both gone
# is news nobody wrote (a kill -9 of both): the same one-entry pass as reconcile settles it.
# Not ``launching``: a launcher between its claim and its host's start holds that one.
_SAYS_LIVE: Final = frozenset({Status.RUNNING, Status.WINDING_DOWN, Status.ADOPTED})


def settle_dead(store: MatrixStore, entry: Entry, *, write: bool = True) -> Entry:
    """``entry`` as the reconcile pass leaves a worker that says it runs while its host and agent
    are both gone: ``resumable`` (``interrupted``), under CAS, so ``resume`` works at once and a
    live master notices at its next look (docs/decisions.md#a-dead-worker-is-noticed-by-its-master).
    Anything else, or a pass that would not make it resumable, is left as it is. ``write=False``:
    only what it would be (a dry run)."""
    if entry.status not in _SAYS_LIVE or procs.is_alive(entry.process) or procs.is_alive(entry.child_process):
        return entry
    plan = reconcile([entry], gather_facts([entry]))
    resumable = plan.of(ActionKind.MARK_RESUMABLE)
    if not resumable or resumable[0].entry is None:
        return entry
    if not write:
        return resumable[0].entry
    apply_plan(store, Plan(resumable, ()))
    return store.find(entry.key) or entry


def handshake(
    store: MatrixStore,
    observed: Entry,
    step: Callable[[Entry], Entry | None],
    sender: str,
    *,
    check: Callable[[Entry], None] | None = None,
) -> Entry:
    """An owner's write into a worker's entry, then a wake-up for its host.

    Fenced by what the owner decided on: the same process generation, in the same status, with
    the same directive. A heartbeat in between moves only the time and does not void the
    owner's answer (a person may take longer to answer than ``heartbeatMs``); any other change
    is a :class:`Conflict` and nothing is written. ``check`` runs first, under the same lock: a
    refusal of its own says more than a Conflict (a lost adoption names the master that won).
    """

    def apply(current: Entry) -> Entry | None:
        if check is not None:
            check(current)
        if current.status is not observed.status or current.directive != observed.directive:
            raise Conflict(observed.key, observed.generation, current.generation)
        return step(current)

    written = store.update(observed.key, apply, registration=observed.registration)
    Inbox(store, observed.key).post("wake", sender=sender, to=observed.registration)
    return written


def grant(store: MatrixStore, observed: Entry, master: ProcessIdentity, session: str, sender: str) -> Entry:
    """An adoption grant by handshake, decided on ``observed``: one grant wins. Over another
    master's live grant, or a worker that re-parented since ``observed``, nothing is written:
    the refusal goes to the worker's events (``adoption_refused``, naming both masters) and is
    raised (:class:`AdoptionRefused` names the winner) for the loser to say."""
    now = now_ms()
    alive = procs.is_alive
    try:
        return handshake(
            store,
            observed,
            lambda e: lifecycle.grant_adoption(e, master, session, now, alive=alive),
            sender,
            check=lambda e: lifecycle.refuse_adoption(e, master, session, seen=observed, alive=alive),
        )
    except AdoptionRefused as exc:
        # The worker's own log (its host writes the winner's "adopted" there): who lost to whom.
        EventLog(store, observed.key, max_bytes=None).write(
            "adoption_refused",
            by_pid=master.pid,
            by_session=session,
            sender=sender,
            winner_pid=exc.winner_pid,
            winner_session=exc.winner_session,
            how=exc.how,
        )
        raise


def recorded_goal(task_ref: str | None) -> str | None:
    """The goal a worker's recorded task ref names: none for none, and none for the ref the
    dispatcher used to make up from the job's id when it was given no goal (``job:<job id>``), so
    a worker launched before that stopped is still its goal-less master's own."""
    if task_ref is None or MINTED_TASK_REF.fullmatch(task_ref):
        return None
    return task_ref


def is_exact(entry: Entry, session_id: str, task_ref: str | None) -> bool:
    """The identity fence for recovery without asking: the same parent session and the same
    goal, where no goal on both sides is the same goal (a master run without ``--task-ref`` owns
    the workers it fired without one; docs/decisions.md#exact-orphans-are-recovered-without-asking)."""
    return entry.parent_session_id == session_id and recorded_goal(entry.task_ref) == task_ref


@attrs.define
class Master:
    """One master session's activation and its recurring duties."""

    store: MatrixStore
    session_id: str
    me: ProcessIdentity
    relauncher: Relauncher
    task_ref: str | None = None
    task_state: str = "active"
    prompter: Prompter | None = None  # None: headless, report only
    deliver: Callable[[Entry, Handoff], bool] | None = None
    # Where pi's taken handoffs are marked delivered: None, at once; the master's host passes a
    # few threads, so a durable write queued behind a burst of workers' own (hundreds of ms on a
    # busy disk) never holds back the posting of the next handoffs to pi.
    acks: Executor | None = None
    _delivered_ids: set[str] = attrs.field(factory=set)
    _acking: set[str] = attrs.field(factory=set)  # handoff ids whose mark is queued or being written
    _reclaimed: set[tuple[str, str]] = attrs.field(factory=set)  # (key, generation) acted on
    # The state dir's sweep (``retention.sweep_if_due``, from the layer above): run after each
    # activation's reconcile, at most once an hour, never raising.
    housekeeping: Callable[[MatrixStore], object] | None = None
    # A new host for a live agent whose host died (``recovery.rehost``, from the layer above);
    # None: such an agent is reported, never taken over.
    rehoster: Rehoster | None = None

    @property
    def key(self) -> str:
        return f"{Role.MASTER.value}-{self.session_id}"

    def activate(self, *, reconcile_first: bool = True) -> ActivationReport:
        """The once-per-activation pass: reconcile, scan, recover/ask/report, deliver."""
        listing = self.store.list()
        facts = gather_facts(listing.entries)
        plan = reconcile(listing.entries, facts)
        reconciled = apply_plan(self.store, plan) if reconcile_first else []
        if reconcile_first and self.housekeeping is not None:
            self.housekeeping(self.store)
        decided = [d for d in (self._decide(key) for key in plan.orphans) if d is not None]
        # Said as it stands: a grant is an adoption once the worker's host accepts it
        # (docs/decisions.md#a-grant-is-not-an-adoption-until-the-worker-accepts-it).
        decisions = await_acceptance(self.store, decided, self.me, self.session_id)
        delivered = self.deliver_handoffs()
        return ActivationReport(
            key=self.key,
            session_id=self.session_id,
            reconciled=tuple(reconciled),
            orphans=tuple(decisions),
            delivered=tuple(delivered),
        )

    # -- orphans ----------------------------------------------------------------------------------
    def _decide(self, key: str) -> Decision | None:
        try:
            entry = self.store.get(key)
        except NotFound:
            return None
        except PiMatrixError as exc:
            return Decision(key, "?", None, False, False, "failed", str(exc))
        if procs.is_alive(entry.parent_process) and not gave_up_on_parent(entry):
            return None  # re-parented since the scan
        alive = procs.is_alive(entry.process) or procs.is_alive(entry.child_process)
        exact = is_exact(entry, self.session_id, self.task_ref)
        decision = Decision(key, entry.identity.agent_id, entry.identity.lane, exact, alive, "reported")
        launching = launching_note(entry, procs.is_alive)
        if launching is not None:  # another launcher resumes it: nothing to adopt or relaunch
            return attrs.evolve(decision, action="skipped", detail=launching)
        if exact and self.task_state == "active":
            return self._recover(entry, decision)
        if exact:
            decision = attrs.evolve(
                decision, detail=f"task is {self.task_state}: automatic recovery disabled"
            )
        if self.prompter is None:
            if decision.alive and stray_agent(entry) is not None:
                return attrs.evolve(
                    decision, detail=f"agent pid {entry.child_pid} unsupervised (its host died)"
                )
            return decision
        return self._ask(entry, decision)

    def _recover(self, entry: Entry, decision: Decision, adopted: str = "re-adopted") -> Decision:
        if decision.alive and stray_agent(entry) is not None:
            return self._rehost(entry, decision)
        if decision.alive:
            return self._adopt(entry, decision, adopted)
        return self._resume(entry, decision, "relaunched")

    def _rehost(self, entry: Entry, decision: Decision) -> Decision:
        """Its host died and its agent lives: a grant would never be read; a new host takes it."""
        if self.rehoster is None:
            return attrs.evolve(decision, detail=f"agent pid {entry.child_pid} unsupervised (its host died)")
        try:
            pid = self.rehoster(self.store, entry, self.me, self.session_id)
        except ResumeRefused as exc:
            return attrs.evolve(decision, action="reported", detail=str(exc))
        except (PiMatrixError, OSError) as exc:
            return attrs.evolve(decision, action="failed", detail=str(exc))
        return attrs.evolve(
            decision, action="rehosted", detail=f"agent pid {entry.child_pid}, new host pid {pid}"
        )

    def _adopt(self, entry: Entry, decision: Decision, action: str) -> Decision:
        try:
            grant(self.store, entry, self.me, self.session_id, self.key)
        except AdoptionRefused as exc:
            return attrs.evolve(decision, action="refused", detail=str(exc))
        except PiMatrixError as exc:
            return attrs.evolve(decision, action="failed", detail=str(exc))
        return attrs.evolve(decision, action=action)

    def _cleanup(self, entry: Entry, decision: Decision) -> Decision:
        try:
            handshake(
                self.store, entry, lambda e: lifecycle.request_cleanup(e, self.session_id, now_ms()), self.key
            )
        except PiMatrixError as exc:
            return attrs.evolve(decision, action="failed", detail=str(exc))
        return attrs.evolve(decision, action="cleanup_requested")

    def _resume(self, entry: Entry, decision: Decision, action: str) -> Decision:
        try:
            pid = self.relauncher(entry, self.me, self.session_id)
        except ResumeRefused as exc:
            return attrs.evolve(decision, action="reported", detail=str(exc))
        except (PiMatrixError, OSError) as exc:
            return attrs.evolve(decision, action="failed", detail=str(exc))
        return attrs.evolve(decision, action=action, detail=f"new host pid {pid}")

    def _ask(self, entry: Entry, decision: Decision) -> Decision:
        assert self.prompter is not None
        name = f"worker {entry.identity.agent_id} (lane {entry.identity.lane or '-'})"
        # The owner decides about another master's worker: say whose it was, on a line of its
        # own before the first question.
        session, task = entry.parent_session_id or "-", entry.task_ref or "-"
        whose = f"pid {entry.parent_pid}, session {session}, task {task}"
        origin = [f"{entry.key}: its master ({whose}) is gone\n"]

        def ask(question: str) -> bool:
            assert self.prompter is not None
            said = self.prompter.ask("".join(origin) + question)
            origin.clear()
            return said

        if not decision.alive:
            resumable = entry.status is Status.RESUMABLE and entry.identity.relaunchable
            if resumable and ask(f"resume {name} in its own session?"):
                return self._resume(entry, decision, "resumed")
            return attrs.evolve(decision, action="left")
        if stray_agent(entry) is not None:
            # No host would read a cleanup directive: taking it over is the only offer.
            unsupervised = f"its host died; its agent pid {entry.child_pid} runs unsupervised"
            if ask(f"take {name} over with a new host ({unsupervised})?"):
                return self._rehost(entry, decision)
            return attrs.evolve(decision, action="left", detail=f"agent pid {entry.child_pid} unsupervised")
        if ask(f"adopt {name}?"):
            return self._adopt(entry, decision, "adopted")
        if ask(f"clean up {name} gracefully?"):
            return self._cleanup(entry, decision)
        return attrs.evolve(decision, action="left")

    def reclaim(self) -> list[Decision]:
        """A master that comes back (it was stopped, or too busy to beat) takes back, without
        asking, its exact workers that counted it lost, as at activation: live ones re-claimed (a
        grant; a new host for an agent whose host died), dead ones relaunched. Called on every
        heartbeat; each worker version is acted on once (a refused relaunch is not retried until
        the entry changes)."""
        if self.task_state != "active":
            return []
        decisions: list[Decision] = []
        for entry in self.store.list().entries:
            mine = (entry.parent_pid, entry.parent_proc_start) == (self.me.pid, self.me.start_ticks)
            if not (mine and gave_up_on_parent(entry) and is_exact(entry, self.session_id, self.task_ref)):
                continue
            if (entry.key, entry.generation) in self._reclaimed:
                continue
            self._reclaimed.add((entry.key, entry.generation))
            alive = procs.is_alive(entry.process) or procs.is_alive(entry.child_process)
            identity = entry.identity
            decision = Decision(entry.key, identity.agent_id, identity.lane, True, alive, "reported")
            decisions.append(self._recover(entry, decision, adopted="re-claimed"))
        return decisions

    def notice_dead(self) -> list[Entry]:
        """Its own workers that died outright (host and agent gone, the record still saying they
        run), made resumable now rather than at the next activation; on every heartbeat."""
        noticed: list[Entry] = []
        for entry in self.store.list().entries:
            mine = (entry.parent_pid, entry.parent_proc_start) == (self.me.pid, self.me.start_ticks)
            if mine and entry.role is Role.WORKER:
                settled = settle_dead(self.store, entry)
                if settled.status is Status.RESUMABLE and entry.status is not Status.RESUMABLE:
                    noticed.append(settled)
        return noticed

    # -- handoffs -----------------------------------------------------------------------------------
    def deliver_handoffs(self, keys: Iterable[str] | None = None) -> list[tuple[str, Handoff]]:
        """Deliver each undelivered handoff addressed to this session exactly once; only those of
        ``keys`` (entries seen changing) when given, else every entry's."""
        delivered: list[tuple[str, Handoff]] = []
        for entry in self._entries(keys):
            for handoff in entry.undelivered:
                if handoff.parent_session_id != self.session_id:
                    continue
                if handoff.id not in self._delivered_ids:
                    accepted = self.deliver(entry, handoff) if self.deliver is not None else True
                    if not accepted:
                        continue
                    self._delivered_ids.add(handoff.id)
                    delivered.append((entry.key, handoff))
                self._acknowledge(entry.key, handoff.id)
        return delivered

    def _entries(self, keys: Iterable[str] | None) -> list[Entry]:
        if keys is None:
            return list(self.store.list().entries)
        found = []
        for key in sorted(set(keys)):
            try:
                found.append(self.store.get(key))
            except PiMatrixError:
                continue  # gone, or not readable now: the next full pass (every heartbeat) sees it
        return found

    def _acknowledge(self, key: str, handoff_id: str) -> None:
        if self.acks is None:
            self._mark(key, handoff_id)
        elif handoff_id not in self._acking:  # the feed sees the entry again before it is marked
            self._acking.add(handoff_id)
            self.acks.submit(self._mark_queued, key, handoff_id)

    def _mark_queued(self, key: str, handoff_id: str) -> None:
        try:
            self._mark(key, handoff_id)
        finally:
            self._acking.discard(handoff_id)

    def _mark(self, key: str, handoff_id: str) -> None:
        # Merged under the lock on the version re-read there: only this handoff is marked, and
        # only a *terminal* record closes, so a newer registration of the same session (which
        # carried the undelivered handoff over) is never closed by an old completion.
        def mark(entry: Entry) -> Entry | None:
            if not any(h.id == handoff_id for h in entry.undelivered):
                return None
            return lifecycle.mark_delivered(entry, handoff_id, now_ms())

        try:
            self.store.update(key, mark)
        except PiMatrixError as exc:
            log.warning("%s: handoff %s delivered but not yet acknowledged: %s", key, handoff_id, exc)
