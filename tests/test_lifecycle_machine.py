"""A Hypothesis state machine over one worker entry's lifecycle, on the real store.

No processes: every rule applies the pure steps of ``matrix/lifecycle.py`` through
``MatrixStore.update`` exactly the way their real callers do -- the host's own writes fenced by
its ``registration=`` (``OwnRecord.write``), a master's handshakes fenced by the generation it
observed (``expected=``, ``Master._adopt`` / ``_cleanup``, the relauncher's publish, the
reconciliation pass), and delivery merged under the lock (``Master._acknowledge``). Snapshots a
master took earlier stay in a bundle, so old observed generations race newer writes; every
superseded host registration stays in a list, so a stale in-flight watcher tick races a stop.

Invariants:

* a closed record never changes status again (within its process generation);
* a write fenced by an old registration or an old observed generation raises ``Conflict`` and
  leaves the file byte-for-byte as it was (and a write whose fence is current is never refused);
* every status change of a generation is in ``LEGAL_TRANSITIONS`` (and terminal only closes);
* generation and registration tokens never repeat;
* an undelivered handoff is never lost, by re-registration or anything else;
* one grant wins: a grant is never written over another owner's standing grant (it is refused
  with ``AdoptionRefused``, the file untouched), and the same grant again writes nothing.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Final

import attrs
import pytest
from helpers import make_entry, make_identity
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    multiple,
    precondition,
    rule,
)

from pi_tmux_matrix.errors import AdoptionRefused, Conflict, IllegalTransition, NotFound
from pi_tmux_matrix.identity import ProcessIdentity, Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import (
    LEGAL_TRANSITIONS,
    DirectiveKind,
    Entry,
    ExitKind,
    ExitRecord,
    Status,
)
from pi_tmux_matrix.matrix.reconcile import ActionKind, Facts, reconcile
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
from pi_tmux_matrix.supervise.master import apply_plan

SESSION: Final = "w1"
KEY: Final = f"worker-{SESSION}"
BOOT: Final = "machine-boot"
OWNERS: Final = ("boss", "other")
IDENTITY: Final = make_identity(
    SESSION, session_file="/nonexistent/w1.jsonl", cwd="/nonexistent", provider="pi"
)
MASTER: Final = ProcessIdentity(4242, 77, BOOT)

# The seed's ends of the lifecycle, independent of the package's table: a terminal record only
# gains delivery marks until it closes, and a closed record never changes status again.
SEED_ENDS: Final = {Status.TERMINAL: {Status.CLOSED}, Status.CLOSED: set[Status]()}

HOST_STEPS: Final = ("heartbeat", "wind_down", "make_resumable", "record_terminal", "close", "accept")


def _exit(kind: ExitKind = ExitKind.EXITED) -> ExitRecord:
    return ExitRecord(kind=kind, at=now_ms(), code=0 if kind is ExitKind.EXITED else None)


def host_step(name: str, now: int) -> Callable[[Entry], Entry | None]:
    """The closures the host passes to ``write`` (guards included, exactly as in supervise/)."""

    def accept(entry: Entry) -> Entry | None:
        d = entry.directive
        if d is None or d.kind is not DirectiveKind.ADOPT or entry.status is not Status.ADOPTED:
            return None
        return lifecycle.accept_adoption(entry, now)

    def finish(entry: Entry) -> Entry | None:
        if not entry.can_move_to(Status.TERMINAL):
            return None
        return lifecycle.record_terminal(entry, _exit(), now, summary="done", result_pointer="/x")

    steps: dict[str, Callable[[Entry], Entry | None]] = {
        "heartbeat": lambda e: lifecycle.heartbeat(e, now),
        # A pending grant wins over the host's own wind-down (the machine's masters are all taken
        # as alive, so an ADOPTED record is always a live grant).
        "wind_down": lambda e: (
            lifecycle.wind_down(e, now)
            if e.status is not Status.ADOPTED and e.can_move_to(Status.WINDING_DOWN)
            else None
        ),
        "make_resumable": lambda e: (
            lifecycle.make_resumable(e, now)
            if e.status is not Status.ADOPTED and e.can_move_to(Status.RESUMABLE)
            else None
        ),
        "record_terminal": finish,
        # _record_end after a cleanup request: close, whatever the status (closed -> refused).
        "close": lambda e: lifecycle.close(_with_exit(e, _exit(ExitKind.KILLED)), "cleanup", now),
        # _record_end after the grace window: only the exit is noted, the record stays resumable.
        "grace_expired": lambda e: (
            _with_exit(e, _exit(ExitKind.KILLED)) if e.status is Status.RESUMABLE else None
        ),
        "accept": accept,
    }
    return steps[name]


def _with_exit(entry: Entry, record: ExitRecord) -> Entry:
    return attrs.evolve(entry, exit=record)


class LifecycleMachine(RuleBasedStateMachine):
    """One worker key; many host generations; masters acting on old and new observations."""

    snapshots = Bundle("snapshots")

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.mkdtemp(prefix="pm-machine-")
        self.store = MatrixStore(Path(self.tmp) / "process-matrix")
        self.registrations: list[str] = []  # every host generation, oldest first
        self.generation: str | None = None  # the model's idea of the token on disk
        self.tokens: set[str] = set()  # every generation/registration token ever written
        self.undelivered: dict[str, str] = {}  # handoff id -> owner session, per the model
        self.clock = now_ms()
        self.pids = 1000

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers ----------------------------------------------------------------------------------
    def tick(self) -> int:
        self.clock += 1000
        return self.clock

    def raw(self) -> bytes | None:
        try:
            return (self.store.root / f"{KEY}.json").read_bytes()
        except FileNotFoundError:
            return None

    def current(self) -> Entry | None:
        return self.store.find(KEY)

    @property
    def registration(self) -> str | None:
        return self.registrations[-1] if self.registrations else None

    def check_change(self, before: Entry | None, after: Entry, what: str) -> None:
        """One successful non-registering write: fresh token, same generation, legal move."""
        assert after.generation not in self.tokens, f"{what}: token {after.generation} repeated"
        self.tokens.add(after.generation)
        assert before is not None, f"{what}: wrote an entry that was not there"
        assert after.registration == before.registration, f"{what}: an update changed the registration"
        if after.status is not before.status:
            if before.status in SEED_ENDS:
                assert after.status in SEED_ENDS[before.status], (
                    f"{what}: a {before.status.value} record moved to {after.status.value}"
                )
            assert after.status in LEGAL_TRANSITIONS[before.status], (
                f"{what}: {before.status.value} -> {after.status.value} is not a legal transition"
            )
        before_ids = {h.id for h in before.undelivered}
        after_ids = {h.id for h in after.undelivered}
        for new in after.handoffs:
            if new.id not in {h.id for h in before.handoffs}:
                self.undelivered[new.id] = new.parent_session_id or ""
        for gone in before_ids - after_ids:
            self.undelivered.pop(gone, None)
        self.generation = after.generation

    def attempt(
        self,
        what: str,
        change: Callable[[Entry], Entry | None],
        *,
        registration: str | None = None,
        expected: str | None = None,
    ) -> Entry | None:
        """``store.update`` as a real caller makes it, with every fence outcome checked."""
        before_raw = self.raw()
        before = self.current()
        # The model's verdict, from its own bookkeeping (not from the store's check).
        stale = (
            registration is not None and (registration != self.registration or self.generation is None)
        ) or (expected is not None and expected != self.generation)
        try:
            after = self.store.update(KEY, change, registration=registration, expected=expected)
        except Conflict:
            assert self.raw() == before_raw, f"{what}: a refused write changed the file"
            assert stale, f"{what}: refused although its fence was current"
            return None
        except (IllegalTransition, NotFound, AdoptionRefused):
            assert self.raw() == before_raw, f"{what}: a refused write changed the file"
            return None
        assert not stale, (
            f"{what}: a write fenced by a superseded token was applied ({registration=}, {expected=})"
        )
        if after.generation == (before.generation if before else None):
            assert self.raw() == before_raw, f"{what}: wrote although change() returned None"
            return after
        self.check_change(before, after, what)
        return after

    # -- the host's side ----------------------------------------------------------------------------
    @rule(owner=st.sampled_from(OWNERS), carry_child=st.booleans())
    def register(self, owner: str, carry_child: bool) -> None:
        """A (newer) process generation registers: the relaunched host, or a same-session restart."""
        self.pids += 1
        parent = ProcessIdentity(self.pids + 50_000, self.pids, BOOT)
        entry = lifecycle.new_entry(
            role=Role.WORKER,
            identity=IDENTITY,
            process=ProcessIdentity(self.pids, self.pids, BOOT),
            now=self.tick(),
            parent=parent,
            parent_session_id=owner,
            task_ref="goal-1",
        )
        if carry_child:
            entry = lifecycle.with_child(entry, ProcessIdentity(self.pids + 90_000, self.pids, BOOT))
        before = self.current()
        after = self.store.register(entry)
        assert after.registration == after.generation
        assert after.registration not in self.tokens, "a registration token repeated"
        self.tokens.add(after.registration)
        assert after.status is Status.RUNNING
        if before is not None:
            carried = {h.id for h in after.undelivered}
            assert {h.id for h in before.undelivered} <= carried, "re-registration dropped a handoff"
        self.registrations.append(after.registration)
        self.generation = after.generation

    @precondition(lambda self: self.registrations)
    @rule()
    def heartbeat(self) -> None:
        self.attempt("heartbeat", host_step("heartbeat", self.tick()), registration=self.registration)

    @precondition(lambda self: self.registrations)
    @rule()
    def parent_death(self) -> None:
        """``WorkerSide.parent_lost``: winding_down, then resumable with the payload (two writes)."""
        now = self.tick()
        self.attempt("wind_down", host_step("wind_down", now), registration=self.registration)
        written = self.generation
        after = self.attempt(
            "make_resumable", host_step("make_resumable", now), registration=self.registration
        )
        if after is not None and self.generation != written:
            assert after.status is Status.RESUMABLE and after.reason == "parent_lost"
            assert after.resumable is not None
            assert after.resumable.identity == after.identity
            assert after.resumable.task_ref == after.task_ref

    @precondition(lambda self: self.registrations)
    @rule()
    def accept_adoption(self) -> None:
        """``WorkerSide.check_entry`` -> ``_accept_adoption``: re-parent to the grant's master."""
        written = self.generation
        after = self.attempt("accept", host_step("accept", self.tick()), registration=self.registration)
        if after is not None and self.generation != written:
            assert after.parent_pid == MASTER.pid and after.directive is None

    @precondition(lambda self: self.registrations)
    @rule()
    def host_applies_cleanup(self) -> None:
        """The host saw a cleanup request; its child stopped; ``_record_end`` closes the record."""
        self.attempt("close", host_step("close", self.tick()), registration=self.registration)

    @precondition(lambda self: self.registrations)
    @rule()
    def grace_expires(self) -> None:
        self.attempt("grace_expired", host_step("grace_expired", self.tick()), registration=self.registration)

    @precondition(lambda self: self.registrations)
    @rule()
    def child_ends(self) -> None:
        """Stop or a natural end: the terminal record with one undelivered handoff."""
        written = self.generation
        after = self.attempt(
            "record_terminal", host_step("record_terminal", self.tick()), registration=self.registration
        )
        if after is not None and self.generation != written:
            assert after.status is Status.TERMINAL
            assert after.handoffs[-1].generation == after.registration

    @precondition(lambda self: len(self.registrations) >= 2)
    @rule(data=st.data(), step=st.sampled_from(HOST_STEPS))
    def stale_host_tick(self, data: st.DataObject, step: str) -> None:
        """An older generation's in-flight watcher tick, heartbeat or exit hook lands late."""
        old = data.draw(st.sampled_from(self.registrations[:-1]), label="old registration")
        self.attempt(f"stale {step}", host_step(step, self.tick()), registration=old)

    # -- the masters' side ------------------------------------------------------------------------------
    @rule(target=snapshots)
    def observe(self) -> object:
        """A master lists the matrix; it may act on this snapshot much later."""
        entry = self.current()
        return multiple() if entry is None else entry

    # A master acts either on what it just read (``now``) or on a snapshot it took earlier
    # (``late``: the entry may have moved on since, and the write must then be refused).
    def _grant(self, snapshot: Entry, owner: str) -> None:
        now = self.tick()
        written = self.generation
        before = self.current()
        standing = None if before is None else lifecycle.standing_grant(before)
        after = self.attempt(
            "grant_adoption",
            lambda e: lifecycle.grant_adoption(e, MASTER, owner, now),
            expected=snapshot.generation,
        )
        if after is not None and self.generation != written:
            assert after.status is Status.ADOPTED and after.directive is not None
            # One grant wins: the machine's masters all live, so no standing grant is void.
            assert standing is None, f"a grant to {owner} overwrote {standing}"
        if after is not None and standing is not None and standing.parent_session_id == owner:
            assert self.generation == written, "the same grant again wrote the entry"

    @rule(owner=st.sampled_from(OWNERS))
    def grant_adoption_now(self, owner: str) -> None:
        entry = self.current()
        if entry is not None:
            self._grant(entry, owner)

    @rule(snapshot=snapshots, owner=st.sampled_from(OWNERS))
    def grant_adoption_late(self, snapshot: Entry, owner: str) -> None:
        self._grant(snapshot, owner)

    def _cleanup(self, snapshot: Entry, owner: str) -> None:
        now = self.tick()
        self.attempt(
            "request_cleanup",
            lambda e: lifecycle.request_cleanup(e, owner, now),
            expected=snapshot.generation,
        )

    @rule(owner=st.sampled_from(OWNERS))
    def request_cleanup_now(self, owner: str) -> None:
        entry = self.current()
        if entry is not None:
            self._cleanup(entry, owner)

    @rule(snapshot=snapshots, owner=st.sampled_from(OWNERS))
    def request_cleanup_late(self, snapshot: Entry, owner: str) -> None:
        self._cleanup(snapshot, owner)

    def _publish_relaunch(self, snapshot: Entry) -> None:
        """A relauncher (``recovery.relaunch``, ``DetachedHostRelauncher``): claim by CAS before
        starting anything, then publish the new host's pid fenced by the claim's token."""
        if snapshot.status is not Status.RESUMABLE:
            return  # check_resumable refuses anything else
        claimed = self.attempt("relaunch claim", lifecycle.claim_launch, expected=snapshot.generation)
        if claimed is None:
            return  # the claim lost: nothing is started
        self.pids += 1
        host = ProcessIdentity(self.pids, self.pids, BOOT)
        self.attempt("relaunch publish", lambda e: lifecycle.launched(e, host), expected=claimed.generation)

    @rule()
    def relaunch_publishes_now(self) -> None:
        entry = self.current()
        if entry is not None:
            self._publish_relaunch(entry)

    @rule(snapshot=snapshots)
    def relaunch_publishes_late(self, snapshot: Entry) -> None:
        self._publish_relaunch(snapshot)

    @rule(owner=st.sampled_from(OWNERS))
    def deliver(self, owner: str) -> None:
        """``Master.deliver_handoffs`` -> ``_acknowledge`` for every handoff of ``owner``."""
        entry = self.current()
        if entry is None:
            return
        for handoff in entry.undelivered:
            if handoff.parent_session_id != owner:
                continue
            now = self.tick()

            def mark(e: Entry, handoff_id: str = handoff.id, now: int = now) -> Entry | None:
                if not any(h.id == handoff_id for h in e.undelivered):
                    return None
                return lifecycle.mark_delivered(e, handoff_id, now)

            after = self.attempt("mark_delivered", mark)
            assert after is not None
            assert handoff.id not in {h.id for h in after.undelivered}
            if entry.status is Status.TERMINAL and not after.undelivered:
                assert after.status is Status.CLOSED

    @rule(host_alive=st.booleans(), child_alive=st.booleans())
    def reconcile_now(self, host_alive: bool, child_alive: bool) -> None:
        entry = self.current()
        if entry is not None:
            self._reconcile(entry, host_alive, child_alive)

    @rule(snapshot=snapshots, host_alive=st.booleans(), child_alive=st.booleans())
    def reconcile_late(self, snapshot: Entry, host_alive: bool, child_alive: bool) -> None:
        self._reconcile(snapshot, host_alive, child_alive)

    def _reconcile(self, snapshot: Entry, host_alive: bool, child_alive: bool) -> None:
        """A master activation's pure pass, planned from a (possibly old) snapshot, applied by CAS."""
        facts = Facts(
            now_ms=self.tick(),
            alive={KEY: host_alive},
            child_alive={KEY: child_alive},
            parent_alive={KEY: False},
        )
        plan = reconcile([snapshot], facts)
        before_raw = self.raw()
        before = self.current()
        stale = snapshot.generation != self.generation
        done = apply_plan(self.store, plan)
        (action,) = plan.actions
        if action.kind is ActionKind.KEEP:
            assert self.raw() == before_raw
            return
        ((_, outcome, _),) = done
        if stale:
            assert outcome == "skipped", f"reconcile from an old snapshot was applied: {done}"
            assert self.raw() == before_raw
            return
        assert outcome == action.kind.value, done
        if action.kind is ActionKind.REMOVE:
            assert self.raw() is None
            assert before is not None
            if before.undelivered:
                lost = {h.id for h in before.undelivered}
                raise AssertionError(
                    f"reconcile removed a {before.status.value} record with undelivered handoffs {lost}"
                )
            self.generation = None
        else:
            after = self.current()
            assert after is not None
            self.check_change(before, after, "reconcile mark_resumable")

    # -- invariants --------------------------------------------------------------------------------------
    @invariant()
    def disk_matches_the_model(self) -> None:
        entry = self.current()
        if entry is None:
            assert self.generation is None
            assert not self.undelivered, f"undelivered handoffs lost: {sorted(self.undelivered)}"
            return
        assert entry.generation == self.generation
        assert entry.registration == self.registration
        on_disk = {h.id: h.parent_session_id for h in entry.undelivered}
        for handoff_id, owner in self.undelivered.items():
            assert on_disk.get(handoff_id) == owner, f"undelivered handoff {handoff_id} lost"


LifecycleMachine.TestCase.settings = settings(
    max_examples=int(os.environ.get("PI_MATRIX_MACHINE_EXAMPLES", "200")),
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


class TestLifecycleMachine(LifecycleMachine.TestCase):  # type: ignore[misc]
    """Collected by pytest."""


def test_the_machine_can_see_a_stale_write_win() -> None:
    """The fence check is not vacuous: a write under an old registration is refused by the store."""
    with tempfile.TemporaryDirectory() as tmp:
        store = MatrixStore(Path(tmp) / "pm")
        first = store.register(make_entry(SESSION, parent_session_id="boss"))
        second = store.register(make_entry(SESSION, parent_session_id="boss"))
        with pytest.raises(Conflict):
            store.update(KEY, host_step("heartbeat", now_ms()), registration=first.registration)
        assert store.get(KEY) == second
