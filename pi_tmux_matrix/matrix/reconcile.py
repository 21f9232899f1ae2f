"""The pure reconciliation pass: entries and liveness facts in, a plan out. No I/O.

The rule (docs/decisions.md#correctness-never-waits-for-a-heartbeat): "Correctness never depends on
a heartbeat or watcher tick arriving. Each master activation runs the pure reconciliation pass once:
a Pi worker interrupted before its own resumable write is repaired from its durable logical-agent
identity, closed and unrecoverable records are removed, undelivered terminal handoffs are retained,
and resumable/adopted/pending-terminal records remain recoverable for at most 30 days before
expiry."

Every action carries the generation it was planned from, so applying it is a CAS: an entry that
changed since the facts were gathered is left for the next pass, never clobbered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Final

import attrs

from ..identity import Role
from .model import Entry, ResumablePayload, Status

__all__ = ["MAX_AGE_MS", "Action", "ActionKind", "Facts", "Plan", "reconcile"]

MAX_AGE_MS: Final = 30 * 24 * 3600 * 1000
_EXPIRING: Final = frozenset({Status.RESUMABLE, Status.ADOPTED, Status.TERMINAL, Status.CLOSED})
_INTERRUPTIBLE: Final = frozenset({Status.LAUNCHING, Status.RUNNING, Status.WINDING_DOWN, Status.ADOPTED})


class ActionKind(str, Enum):
    """What the pass decided for one entry."""

    KEEP = "keep"
    MARK_RESUMABLE = "mark_resumable"
    REMOVE = "remove"


@attrs.frozen
class Facts:
    """What the impure edge observed: liveness by key, and the clock.

    ``alive``: the registered process (host) is alive. ``child_alive``: the agent CLI the host
    ran is alive (a dead host with a live child is not dead: nothing live is left unknown).
    ``parent_alive``: a worker's recorded parent identity is alive.
    """

    now_ms: int
    alive: Mapping[str, bool] = attrs.field(factory=dict)
    child_alive: Mapping[str, bool] = attrs.field(factory=dict)
    parent_alive: Mapping[str, bool] = attrs.field(factory=dict)
    max_age_ms: int = MAX_AGE_MS


@attrs.frozen
class Action:
    """One decision, fenced by the generation it was made from."""

    kind: ActionKind
    key: str
    generation: str
    reason: str
    entry: Entry | None = None  # the replacement, for MARK_RESUMABLE


@attrs.frozen
class Plan:
    """The decisions of one pass, plus the orphans found (workers whose parent is dead)."""

    actions: tuple[Action, ...]
    orphans: tuple[str, ...]

    def of(self, kind: ActionKind) -> tuple[Action, ...]:
        """The actions of one kind."""
        return tuple(a for a in self.actions if a.kind is kind)


def _decide(entry: Entry, facts: Facts) -> Action:
    def act(kind: ActionKind, reason: str, replacement: Entry | None = None) -> Action:
        return Action(kind, entry.key, entry.generation, reason, replacement)

    age = facts.now_ms - entry.updated_at
    if entry.status in _EXPIRING and age > facts.max_age_ms:
        return act(ActionKind.REMOVE, f"expired: {entry.status.value} for more than 30 days")
    if entry.status is Status.CLOSED:
        # A record closed by cleanup or a session switch may still carry a handoff it inherited
        # at registration; it waits for its owner like any pending terminal record.
        if entry.undelivered:
            return act(ActionKind.KEEP, "closed, undelivered terminal handoff retained")
        return act(ActionKind.REMOVE, "closed")
    if facts.alive.get(entry.key, False):
        return act(ActionKind.KEEP, "process alive")
    if facts.child_alive.get(entry.key, False):
        return act(ActionKind.KEEP, "host gone but its agent process is alive")
    if entry.status is Status.TERMINAL:
        if entry.undelivered:
            return act(ActionKind.KEEP, "undelivered terminal handoff retained")
        return act(ActionKind.REMOVE, "terminal and delivered")
    if entry.status is Status.RESUMABLE:
        return act(ActionKind.KEEP, "resumable")
    # Any pi worker is repaired from its logical identity, even one that died before pi wrote a
    # session file: it is relaunched as the same agent into a fresh file (the origin's rule).
    if entry.role is Role.WORKER and entry.status in _INTERRUPTIBLE and entry.identity.relaunchable:
        payload = ResumablePayload(
            identity=entry.identity,
            reason="interrupted",
            at=facts.now_ms,
            task_ref=entry.task_ref,
            task_summary=entry.resumable.task_summary if entry.resumable else entry.task_summary,
            checkpoint=entry.resumable.checkpoint if entry.resumable else None,
        )
        replacement = entry.moved(Status.RESUMABLE, reason="interrupted", resumable=payload)
        return act(ActionKind.MARK_RESUMABLE, "worker died before its resumable write", replacement)
    if entry.undelivered:
        return act(ActionKind.KEEP, "undelivered terminal handoff retained")
    return act(ActionKind.REMOVE, "process gone and nothing to resume")


def _is_orphan(entry: Entry, facts: Facts) -> bool:
    return (
        entry.role is Role.WORKER
        and entry.status not in (Status.CLOSED, Status.TERMINAL)
        and entry.parent_pid is not None
        and not facts.parent_alive.get(entry.key, False)
    )


def reconcile(entries: Iterable[Entry], facts: Facts) -> Plan:
    """Decide, for every entry, whether to keep, repair to ``resumable``, or remove it."""
    ordered = sorted(entries, key=lambda e: e.key)
    actions = tuple(_decide(e, facts) for e in ordered)
    removed = {a.key for a in actions if a.kind is ActionKind.REMOVE}
    orphans = tuple(e.key for e in ordered if e.key not in removed and _is_orphan(e, facts))
    return Plan(actions, orphans)
