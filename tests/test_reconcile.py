"""The pure reconciliation pass: examples from seed 000, then properties over any input."""

from __future__ import annotations

from typing import Any

from helpers import make_entry, make_identity
from hypothesis import given, settings
from hypothesis import strategies as st

from pi_tmux_matrix.identity import Role
from pi_tmux_matrix.matrix.model import Handoff, Outcome, Status
from pi_tmux_matrix.matrix.reconcile import MAX_AGE_MS, ActionKind, Facts, reconcile
from pi_tmux_matrix.matrix.store import now_ms

NOW = now_ms()
DAY = 24 * 3600 * 1000


def handoff(delivered: bool) -> Handoff:
    return Handoff(
        id="h1",
        generation="g-1",
        parent_session_id="m1",
        outcome=Outcome.EXITED,
        created_at=NOW - 1000,
        code=0,
        delivered_at=NOW if delivered else None,
    )


def complete(session: str) -> Any:
    return make_identity(session, session_file=f"/s/{session}.jsonl", cwd="/work")


def decide(entry: Any, **facts: Any) -> Any:
    plan = reconcile([entry], Facts(now_ms=NOW, **facts))
    (action,) = plan.actions
    return action


def test_closed_is_removed() -> None:
    assert decide(make_entry("a", status=Status.CLOSED)).kind is ActionKind.REMOVE


def test_live_process_or_live_child_is_kept() -> None:
    entry = make_entry("a", generation="g-1")
    assert decide(entry, alive={entry.key: True}).kind is ActionKind.KEEP
    assert decide(entry, child_alive={entry.key: True}).kind is ActionKind.KEEP


def test_dead_pi_worker_with_complete_identity_is_repaired_to_resumable() -> None:
    entry = make_entry("a", identity=complete("a"), generation="g-7", task_ref="goal:1")
    action = decide(entry)
    assert action.kind is ActionKind.MARK_RESUMABLE
    assert action.generation == "g-7"
    assert action.entry.status is Status.RESUMABLE
    payload = action.entry.resumable
    assert payload.identity == entry.identity  # one clone of the identity, not parallel fields
    assert payload.task_ref == "goal:1"
    assert payload.reason == "interrupted"


def test_dead_worker_without_pi_context_is_removed() -> None:
    assert decide(make_entry("a")).kind is ActionKind.REMOVE
    foreign = make_entry("b", identity=make_identity("b", provider="claude", session_file="/s", cwd="/w"))
    assert decide(foreign).kind is ActionKind.REMOVE


def test_undelivered_handoffs_are_retained_delivered_ones_close() -> None:
    pending = make_entry("a", status=Status.TERMINAL, handoffs=[handoff(False)])
    assert decide(pending).kind is ActionKind.KEEP
    done = make_entry("a", status=Status.TERMINAL, handoffs=[handoff(True)])
    assert decide(done).kind is ActionKind.REMOVE


def test_recoverable_records_expire_after_30_days() -> None:
    for status in (Status.RESUMABLE, Status.ADOPTED, Status.TERMINAL):
        fresh = make_entry("a", status=status, updated_at=NOW - 29 * DAY, handoffs=[handoff(False)])
        old = make_entry("a", status=status, updated_at=NOW - 31 * DAY, handoffs=[handoff(False)])
        assert decide(fresh).kind is not ActionKind.REMOVE
        assert decide(old).kind is ActionKind.REMOVE
        assert decide(old, alive={old.key: True}).kind is ActionKind.REMOVE


def test_dead_master_is_removed_and_orphans_are_found() -> None:
    master = make_entry("m1", role=Role.MASTER)
    worker = make_entry("w1", parent_pid=4242, parent_session_id="m1")
    plan = reconcile([master, worker], Facts(now_ms=NOW, alive={worker.key: True}))
    kinds = {a.key: a.kind for a in plan.actions}
    assert kinds == {"master-m1": ActionKind.REMOVE, "worker-w1": ActionKind.KEEP}
    assert plan.orphans == ("worker-w1",)
    live_parent = reconcile(
        [worker], Facts(now_ms=NOW, alive={worker.key: True}, parent_alive={worker.key: True})
    )
    assert live_parent.orphans == ()


statuses = st.sampled_from(list(Status))
roles = st.sampled_from(list(Role))


@st.composite
def entries(draw: st.DrawFn) -> Any:
    session = draw(st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True))
    identity = complete(session) if draw(st.booleans()) else make_identity(session)
    return make_entry(
        session,
        role=draw(roles),
        status=draw(statuses),
        identity=identity,
        generation=f"g-{draw(st.integers(0, 99))}",
        updated_at=NOW - draw(st.integers(0, 40)) * DAY,
        parent_pid=draw(st.none() | st.integers(1, 10**6)),
        handoffs=draw(st.lists(st.builds(handoff, st.booleans()), max_size=2)),
    )


@settings(max_examples=400, deadline=None)
@given(
    st.lists(entries(), max_size=8, unique_by=lambda e: e.key),
    st.data(),
)
def test_plan_properties(items: list[Any], data: st.DataObject) -> None:
    keys = [e.key for e in items]
    alive = {k: data.draw(st.booleans()) for k in keys}
    child = {k: data.draw(st.booleans()) for k in keys}
    parent = {k: data.draw(st.booleans()) for k in keys}
    facts = Facts(now_ms=NOW, alive=alive, child_alive=child, parent_alive=parent)
    plan = reconcile(items, facts)
    by_key = {e.key: e for e in items}
    assert sorted(a.key for a in plan.actions) == sorted(keys)
    for action in plan.actions:
        entry = by_key[action.key]
        assert action.generation == entry.generation  # every action is CAS-fenced
        expired = (
            entry.status in (Status.RESUMABLE, Status.ADOPTED, Status.TERMINAL)
            and NOW - entry.updated_at > MAX_AGE_MS
        )
        # Nothing live, nothing undelivered and nothing resumable is removed unless expired.
        if action.kind is ActionKind.REMOVE and not expired and entry.status is not Status.CLOSED:
            assert not alive[entry.key] and not child[entry.key]
            assert not entry.undelivered
            assert entry.status is not Status.RESUMABLE
        if action.kind is ActionKind.MARK_RESUMABLE:
            assert entry.role is Role.WORKER and entry.identity.resume_complete
            assert not alive[entry.key] and not child[entry.key]
            assert action.entry.status is Status.RESUMABLE
            assert action.entry.resumable.identity == entry.identity
    removed = {a.key for a in plan.of(ActionKind.REMOVE)}
    for key in plan.orphans:
        entry = by_key[key]
        assert key not in removed and entry.role is Role.WORKER and not parent[key]
    # The pass is pure: same input, same plan.
    assert reconcile(list(reversed(items)), facts) == plan
