"""What an activation did for each orphan, as it happened
(docs/decisions.md#a-grant-is-not-an-adoption-until-the-worker-accepts-it).

A grant is not an adoption: it is a request written into the worker's entry, and only the
worker's host makes it one (it accepts: the entry's parent becomes the master). A master that
printed ``re-adopted`` on writing the grant said more than it knew; over 100 orphans some hosts
take longer than the report. So the report waits, bounded (:data:`ACCEPT_WAIT_S` for all of
them together), for the hosts to accept, and says ``re-adopted`` only of those it saw accept;
the rest are ``granted, not yet accepted`` (the grant stands, and the host takes it when it
next looks at its entry, or ignores it if this master has ended by then).

A worker another launcher is resuming (``launching``) is nobody's to adopt: it is reported as
such and never attempted (a grant cannot be written over ``launching``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Final

import attrs

from ..errors import PiMatrixError
from ..identity import ProcessIdentity
from ..matrix.model import Entry, Status
from ..matrix.store import MatrixStore

__all__ = [
    "ACCEPT_WAIT_S",
    "GRANTED",
    "Decision",
    "accepted",
    "await_acceptance",
    "launching_note",
    "told_one_shot",
]

# How long one activation waits, for all its grants together, to see them accepted: a host takes
# a grant when its inbox wakes it (at once) or at its poll; past this the report says so instead.
ACCEPT_WAIT_S: Final = 2.0
GRANTED: Final = "granted, not yet accepted"
_GRANT_ACTIONS: Final = frozenset({"re-adopted", "re-claimed", "adopted"})
_LOOK_EVERY_S: Final = 0.05
_WAITING: Final = (
    f"adoption granted (waiting for the worker's host to accept; not seen in {ACCEPT_WAIT_S:g}s)"
)


@attrs.frozen
class Decision:
    """What activation did (or, headless, would leave to the owner) for one orphan."""

    key: str
    agent_id: str
    lane: str | None
    exact: bool
    alive: bool
    # re-adopted | re-claimed | rehosted | relaunched | adopted | cleanup_requested | resumed | left
    # | reported | refused (another master's grant won: the detail names it) | failed
    # | granted, not yet accepted | skipped (another launcher resumes it)
    action: str
    detail: str = ""


def launching_note(entry: Entry, alive: Callable[[ProcessIdentity | None], bool]) -> str | None:
    """What the report says of a worker another launcher is resuming, None for any other."""
    if entry.status is not Status.LAUNCHING:
        return None
    # Its pid is the new host's once the launcher published it; before, the dead old host's.
    host = f"pid {entry.pid}" if alive(entry.process) else "its new host not yet started"
    return f"being launched by another launcher ({host})"


def accepted(entry: Entry | None, master: ProcessIdentity, session: str) -> bool:
    """The worker's host took the grant: its entry names this master as its parent."""
    if entry is None or entry.status is Status.ADOPTED:  # ADOPTED: the grant still waits
        return False
    named = (entry.parent_pid, entry.parent_proc_start, entry.parent_session_id)
    return named == (master.pid, master.start_ticks, session)


def await_acceptance(
    store: MatrixStore,
    decisions: Sequence[Decision],
    master: ProcessIdentity,
    session: str,
    *,
    wait_s: float = ACCEPT_WAIT_S,
) -> list[Decision]:
    """``decisions`` with each grant told as it stands: kept if its host accepted within
    ``wait_s`` (all together), else ``granted, not yet accepted``."""
    waiting = {d.key for d in decisions if d.action in _GRANT_ACTIONS}
    deadline = time.monotonic() + wait_s
    while waiting:
        for key in sorted(waiting):
            try:
                entry = store.find(key)
            except PiMatrixError:
                entry = None  # unreadable now: not seen to accept
            if accepted(entry, master, session):
                waiting.discard(key)
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(_LOOK_EVERY_S)
    return [attrs.evolve(d, action=GRANTED, detail=_WAITING) if d.key in waiting else d for d in decisions]


def told_one_shot(decision: Decision) -> Decision:
    """``master --once`` ends right after its report: a worker that accepted its grant then sees
    its parent die, counts it lost again and waits ``resumable`` (so 85 of 100 ``re-adopted``
    workers were ``resumable`` 5 s later); a grant not yet taken is void. Said so
    (docs/decisions.md#a-grant-is-not-an-adoption-until-the-worker-accepts-it)."""
    if decision.action not in (*_GRANT_ACTIONS, GRANTED):
        return decision
    note = (
        "this one-shot master ends now, so the worker counts its parent lost again and waits "
        "resumable; run 'pi-matrix master' without --once to keep it"
    )
    return attrs.evolve(decision, detail=f"{decision.detail}; {note}" if decision.detail else note)
