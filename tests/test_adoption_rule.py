"""One adoption grant wins (issue 30.7): the lifecycle rule, the owner's side that says who won,
and the host that re-parents to the grant it wrote, never to one it read before the lock.

The race itself, with real hosts and masters, is ``tests/test_adoption_race.py``.
"""

from __future__ import annotations

import io
from typing import Any, Final, cast

import attrs
import pytest
from helpers import Reaper, make_identity, read_events, spawn_registered_parent

from pi_tmux_matrix import procs
from pi_tmux_matrix.cli import main
from pi_tmux_matrix.cli.app import Io
from pi_tmux_matrix.errors import AdoptionRefused, Conflict
from pi_tmux_matrix.identity import ProcessIdentity, Role
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import Directive, DirectiveKind, Entry, Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
from pi_tmux_matrix.supervise.master import Decision, Master, grant
from pi_tmux_matrix.supervise.record import OwnRecord
from pi_tmux_matrix.supervise.worker import Phase, WorkerSide

BOOT: Final = "boot-1"
OLD: Final = ProcessIdentity(100, 1, BOOT)  # the parent that died
A: Final = ProcessIdentity(200, 2, BOOT)
B: Final = ProcessIdentity(300, 3, BOOT)


def orphan(status: Status = Status.RESUMABLE, **changes: Any) -> Entry:
    entry = lifecycle.new_entry(
        role=Role.WORKER, identity=make_identity("w1"), process=ProcessIdentity(50, 5, BOOT), now=now_ms(),
        parent=OLD, parent_session_id="boss",
    )  # fmt: skip
    return attrs.evolve(entry, status=status, **changes)


def granted(entry: Entry, master: ProcessIdentity, session: str) -> Entry:
    made = lifecycle.grant_adoption(entry, master, session, now_ms(), alive=lambda _p: False)
    assert made is not None
    return made


def lives(*alive: ProcessIdentity) -> Any:
    return lambda p: p in alive


# --- the lifecycle rule ----------------------------------------------------------------------------
def test_a_grant_over_another_live_masters_standing_grant_is_refused_naming_it() -> None:
    held = granted(orphan(), A, "sa")
    with pytest.raises(AdoptionRefused) as refused:
        lifecycle.grant_adoption(held, B, "sb", now_ms(), alive=lives(A, B))
    lost = refused.value
    assert (lost.how, lost.winner_pid, lost.winner_session) == ("granted", 200, "sa")
    assert "worker-w1: adoption refused: already granted to master pid 200 session sa" in str(refused.value)


def test_without_a_look_at_processes_every_standing_grant_counts_as_live() -> None:
    """The pure default refuses: refusing is safe, overwriting a live grant is the race."""
    with pytest.raises(AdoptionRefused):
        lifecycle.grant_adoption(granted(orphan(), A, "sa"), B, "sb", now_ms())


def test_a_grant_whose_master_died_before_it_was_accepted_is_void_and_replaced() -> None:
    held = granted(orphan(), A, "sa")
    replaced = lifecycle.grant_adoption(held, B, "sb", now_ms(), alive=lives(B))
    assert replaced is not None and replaced.status is Status.ADOPTED
    assert replaced.directive is not None
    assert (replaced.directive.parent_pid, replaced.directive.parent_session_id) == (300, "sb")


def test_a_grant_naming_no_process_is_void() -> None:
    nobody = Directive(kind=DirectiveKind.ADOPT, at=1, parent_session_id="x")
    nameless = orphan(Status.ADOPTED, directive=nobody)
    assert lifecycle.grant_adoption(nameless, B, "sb", now_ms(), alive=lives(A, B)) is not None


def test_the_same_grant_again_writes_nothing_and_another_session_of_its_process_is_refused() -> None:
    held = granted(orphan(), A, "sa")
    assert lifecycle.grant_adoption(held, A, "sa", now_ms(), alive=lives(A)) is None
    with pytest.raises(AdoptionRefused):
        lifecycle.grant_adoption(held, A, "other", now_ms(), alive=lives(A))


def test_a_worker_re_parented_since_the_grant_was_decided_refuses_it_naming_its_parent() -> None:
    seen = orphan()
    adopted = lifecycle.accept_adoption(granted(seen, A, "sa"), now_ms())
    with pytest.raises(AdoptionRefused) as refused:
        lifecycle.refuse_adoption(adopted, B, "sb", seen=seen, alive=lives(A, B))
    assert (refused.value.how, refused.value.winner_pid) == ("adopted", 200)
    assert "already adopted by master pid 200 session sa" in str(refused.value)
    # Its own adoption is no loss; an unchanged parent refuses nothing.
    lifecycle.refuse_adoption(adopted, A, "sa", seen=seen, alive=lives(A, B))
    lifecycle.refuse_adoption(seen, B, "sb", seen=seen, alive=lives(A, B))


def test_accepting_takes_the_parent_from_the_grant_of_the_version_given() -> None:
    accepted = lifecycle.accept_adoption(granted(granted(orphan(), A, "sa"), B, "sb"), now_ms())
    assert (accepted.status, accepted.reason, accepted.directive) == (Status.RUNNING, "adopted", None)
    assert (accepted.parent_pid, accepted.parent_proc_start, accepted.parent_session_id) == (300, 3, "sb")


# --- the owner's side: the loser is told -----------------------------------------------------------
@pytest.fixture
def worker(store: MatrixStore) -> Entry:
    """A resumable orphan whose host is this test process (a live registration)."""
    me = procs.current()
    entry = attrs.evolve(orphan(), pid=me.pid, proc_start=me.start_ticks, boot_id=me.boot_id)
    return store.register(attrs.evolve(entry, status=Status.RESUMABLE, reason=lifecycle.PARENT_LOST))


def live_masters(reaper: Reaper, store: MatrixStore, *sessions: str) -> list[ProcessIdentity]:
    found = []
    for session in sessions:
        popen = reaper.popen(spawn_registered_parent(store.root, session))
        identity = procs.identify(popen.pid)
        assert identity is not None
        found.append(identity)
    return found


def test_two_grants_decided_on_one_version_one_wins_and_the_loser_is_told_and_logged(
    reaper: Reaper, store: MatrixStore, worker: Entry
) -> None:
    a, b = live_masters(reaper, store, "sa", "sb")
    grant(store, worker, a, "sa", "master-sa")
    before = store.get(worker.key)
    with pytest.raises(AdoptionRefused) as refused:
        grant(store, worker, b, "sb", "master-sb")  # the owner of sb answered y to the same question
    assert refused.value.winner_pid == a.pid
    assert store.get(worker.key) == before  # nothing written
    (event,) = read_events(store.root, worker.key, "adoption_refused")
    assert (event["by_pid"], event["by_session"], event["winner_pid"], event["winner_session"]) == (
        b.pid, "sb", a.pid, "sa",
    )  # fmt: skip
    assert event["how"] == "granted"


def test_a_grant_to_a_master_that_died_is_replaced_by_the_next(
    reaper: Reaper, store: MatrixStore, worker: Entry
) -> None:
    a, b = live_masters(reaper, store, "sa", "sb")
    grant(store, worker, a, "sa", "master-sa")
    dead = reaper.popens[0]
    assert dead.pid == a.pid
    dead.kill()
    dead.wait(timeout=10)
    written = grant(store, store.get(worker.key), b, "sb", "master-sb")
    assert written.directive is not None and written.directive.parent_pid == b.pid


def test_other_changes_are_still_a_conflict(reaper: Reaper, store: MatrixStore, worker: Entry) -> None:
    """The rule adds a refusal that names the winner; every other change since the owner decided
    stays a Conflict (re-read and ask again)."""
    (a,) = live_masters(reaper, store, "sa")
    store.update(worker.key, lambda e: lifecycle.request_cleanup(e, "sc", now_ms()))
    with pytest.raises(Conflict):
        grant(store, worker, a, "sa", "master-sa")


def test_a_master_that_lost_reports_refused_naming_the_winner(
    reaper: Reaper, store: MatrixStore, worker: Entry
) -> None:
    a, b = live_masters(reaper, store, "sa", "sb")
    grant(store, worker, a, "sa", "master-sa")
    master = Master(store, "sb", b, relauncher=cast(Any, None))
    asked = Decision(worker.key, "agent-w1", None, False, True, "reported")
    decision = master._adopt(worker, asked, "adopted")
    assert decision.action == "refused"
    assert f"already granted to master pid {a.pid} session sa" in decision.detail


def test_pi_matrix_adopt_that_lost_exits_1_naming_the_winner(
    reaper: Reaper, store: MatrixStore, worker: Entry
) -> None:
    a, b = live_masters(reaper, store, "sa", "sb")
    grant(store, worker, a, "sa", "master-sa")
    out, err = io.StringIO(), io.StringIO()
    args = ["adopt", worker.key, "--parent-pid", str(b.pid), "--parent-session", "sb"]
    assert main(["--state-dir", str(store.root), *args], io=Io(out, err)) == 1
    assert f"adoption refused: already granted to master pid {a.pid} session sa" in err.getvalue()
    assert out.getvalue() == ""


# --- the host: it watches the parent of the grant it wrote -----------------------------------------
class Agent:
    """The host's agent, as far as an adoption touches it."""

    def steer(self, text: str, *, notice: bool = False) -> None:
        pass


@attrs.define(eq=False)
class LateRecord(OwnRecord):
    """The host's own record, with a write landing between its lock-free read and its lock."""

    between: Any = None

    def read(self) -> Entry | None:
        current = super().read()
        if self.between is not None:
            self.store.update(self.key, self.between)
            self.between = None
        return current


def host_side(store: MatrixStore, worker: Entry, between: Any) -> WorkerSide:
    record = LateRecord(store, worker.key, worker.registration, worker, between=between)
    side = WorkerSide(record, cast(Any, Agent()), Role.WORKER, procs.current(), 5.0)
    side.phase = Phase.GRACE
    return side


def test_the_host_watches_the_grant_it_wrote_not_the_one_it_read_before_the_lock(
    reaper: Reaper, store: MatrixStore, worker: Entry
) -> None:
    a, b = live_masters(reaper, store, "sa", "sb")
    store.update(worker.key, lambda e: lifecycle.grant_adoption(e, a, "sa", now_ms()))
    # Between the host's read and its lock, the grant becomes b's (a void grant's replacement,
    # or any writer that broke the rule): the host must follow what it writes.
    side = host_side(store, worker, lambda e: lifecycle.grant_adoption(e, b, "sb", now_ms(), alive=lives()))
    side.check_entry()
    after = store.get(worker.key)
    assert (after.status, after.parent_pid, after.parent_session_id) == (Status.RUNNING, b.pid, "sb")
    assert side.parent == b, f"the host watches {side.parent}, its entry names pid {after.parent_pid}"
    assert side.phase is Phase.RUNNING
    (adopted,) = read_events(store.root, worker.key, "adopted")
    watched = (adopted["parent_pid"], adopted["parent_start"], adopted["parent_session"])
    assert watched == (b.pid, b.start_ticks, "sb")


def test_a_grant_gone_before_the_lock_re_parents_nothing(
    reaper: Reaper, store: MatrixStore, worker: Entry
) -> None:
    (a,) = live_masters(reaper, store, "sa")
    store.update(worker.key, lambda e: lifecycle.grant_adoption(e, a, "sa", now_ms()))

    def voided(e: Entry) -> Entry:
        return lifecycle.make_resumable(attrs.evolve(e, directive=None), now_ms())

    side = host_side(store, worker, voided)
    side.check_entry()
    after = store.get(worker.key)
    assert (after.status, after.parent_pid) == (Status.RESUMABLE, OLD.pid)
    assert side.parent is None and side.phase is Phase.GRACE
    assert read_events(store.root, worker.key, "adopted") == []
