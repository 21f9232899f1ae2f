"""Pure lifecycle steps, as functions from an entry to its next version
(docs/decisions.md#lifecycle-steps-are-pure-and-fenced). No I/O.

The host (the worker's side) and the master (the owner's side) apply these through the store
under the entry's lock, so every step sees the latest version and is fenced: the owner's own
steps by its ``registration`` (its process generation), a master's handshakes by the exact
``generation`` it observed.

One grant wins (docs/decisions.md#one-adoption-grant-wins): an adoption grant is never written
over another master's standing grant whose master lives, nor over a worker that re-parented since
the grant was decided; the loser gets :class:`~pi_tmux_matrix.errors.AdoptionRefused` naming the
winner. Liveness is the caller's (``alive``): these functions stay pure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..errors import AdoptionRefused
from ..identity import AgentIdentityContract, ProcessIdentity, Role
from .model import (
    MAX_HANDOFFS,
    MAX_REASON,
    Directive,
    DirectiveKind,
    Entry,
    ExitRecord,
    Handoff,
    Outcome,
    ResumablePayload,
    Status,
    bounded,
)

__all__ = [
    "accept_adoption",
    "claim_launch",
    "claimed_by",
    "close",
    "grant_adoption",
    "heartbeat",
    "launched",
    "make_resumable",
    "mark_delivered",
    "new_entry",
    "ready",
    "record_round",
    "record_terminal",
    "refuse_adoption",
    "release_launch",
    "request_cleanup",
    "standing_grant",
    "wind_down",
    "with_child",
    "with_identity",
]

PARENT_LOST = "parent_lost"
RELAUNCH = "relaunch"
RELAUNCH_FAILED = "relaunch_failed"
TMUX_LOST = "tmux_lost"  # the agent's terminal (its tmux pane or server) went away under it


def new_entry(
    *,
    role: Role,
    identity: AgentIdentityContract,
    process: ProcessIdentity,
    now: int,
    parent: ProcessIdentity | None = None,
    parent_pid: int | None = None,
    parent_session_id: str | None = None,
    task_ref: str | None = None,
    task_summary: str = "",
    status: Status = Status.RUNNING,
    agent_version: str | None = None,
) -> Entry:
    """The entry a process writes when it registers (the store stamps the tokens)."""
    declared_pid = parent.pid if parent is not None else parent_pid
    return Entry(
        key=identity.key(role),
        role=role,
        status=status,
        identity=identity,
        created_at=now,
        updated_at=now,
        heartbeat_at=now,
        pid=process.pid,
        proc_start=process.start_ticks,
        boot_id=process.boot_id,
        parent_pid=declared_pid if role is Role.WORKER else None,
        parent_session_id=parent_session_id if role is Role.WORKER else None,
        parent_proc_start=parent.start_ticks if parent is not None and role is Role.WORKER else None,
        task_ref=task_ref,
        task_summary=bounded(task_summary),
        agent_version=agent_version,
    )


def claim_launch(entry: Entry) -> Entry:
    """A launcher's claim on a resumable worker, taken by CAS before it starts anything: the one
    transition that publishes ``launching`` for an existing entry. Of two launchers racing for one
    worker only the one whose claim lands starts a process; no pid yet (none was started)."""
    return entry.moved(
        Status.LAUNCHING, reason=RELAUNCH, child_pid=None, child_proc_start=None, directive=None
    )


def claimed_by(entry: Entry | None) -> str:
    """Who won a claim a launcher lost, as its refusal says it: the entry as it is now (its status,
    the winner's host, and the master it runs under once that host has registered)."""
    if entry is None:
        return "the entry is gone from the matrix"
    said = f"it is {entry.status.value}" + (f" ({entry.reason})" if entry.reason else "")
    if entry.pid is not None:
        said += f", host pid {entry.pid}"
    if entry.status in (Status.RUNNING, Status.ADOPTED) and entry.parent_pid is not None:
        said += f", under master pid {entry.parent_pid} session {entry.parent_session_id or '-'}"
    return said


def launched(entry: Entry, host: ProcessIdentity) -> Entry | None:
    """The claimed launch's new host, published before the host registers
    (docs/decisions.md#the-launcher-publishes-the-pid-before-the-host-registers); None (no write)
    once the host has registered itself, whose own record wins."""
    if entry.status is not Status.LAUNCHING:
        return None
    return attrs.evolve(entry, pid=host.pid, proc_start=host.start_ticks, boot_id=host.boot_id)


def release_launch(entry: Entry) -> Entry:
    """Nothing was started after all: the worker is resumable again for the next launcher."""
    return entry.moved(Status.RESUMABLE, reason=RELAUNCH_FAILED)


def with_child(entry: Entry, child: ProcessIdentity, ready_at: int | None = None) -> Entry:
    """Name the agent process, so a dead host never leaves a live child unknown (and, after a
    session switch, when that same agent was ready: it is still loaded)."""
    ready_at = entry.ready_at if ready_at is None else ready_at
    return attrs.evolve(entry, child_pid=child.pid, child_proc_start=child.start_ticks, ready_at=ready_at)


def with_identity(entry: Entry, **changes: Any) -> Entry:
    """Complete the identity (e.g. pi's real session file reported by the bridge).

    A payload written before (the report can land while the worker is winding down or already
    resumable) moves with it: it must describe the entry it sits in, and a resume from it must
    use the session file pi really writes."""
    identity = attrs.evolve(entry.identity, **changes)
    payload = entry.resumable
    if payload is not None:
        payload = attrs.evolve(payload, identity=identity)
    return attrs.evolve(entry, identity=identity, resumable=payload)


def ready(entry: Entry, now: int, session_file: str | None = None) -> Entry | None:
    """The bridge reported in (pi's session_start): the agent is ready, recorded once, with pi's
    session file when it completes the identity. None (no write) when there is nothing new: a
    second report (pi's /new, /resume, /fork and a reload report again) keeps the first time, and
    an ended agent is not made ready by a report that arrived after its end."""
    changed = entry
    if session_file and session_file != entry.identity.session_file:
        changed = with_identity(changed, session_file=session_file)
    if entry.ready_at is None and entry.status not in (Status.TERMINAL, Status.CLOSED):
        changed = attrs.evolve(changed, ready_at=now)
    return None if changed is entry else changed


def heartbeat(entry: Entry, now: int) -> Entry:
    """Only the time moves."""
    return attrs.evolve(entry, heartbeat_at=now)


def wind_down(entry: Entry, now: int) -> Entry:
    """Step 1a: the parent is gone."""
    return entry.moved(Status.WINDING_DOWN, reason=PARENT_LOST, heartbeat_at=now)


def make_resumable(entry: Entry, now: int, reason: str = PARENT_LOST, checkpoint: str | None = None) -> Entry:
    """Step 1b: one clone of the identity, the task ref and a bounded summary."""
    payload = ResumablePayload(
        identity=entry.identity,
        reason=reason,
        at=now,
        task_ref=entry.task_ref,
        task_summary=entry.task_summary,
        checkpoint=checkpoint,
    )
    return entry.moved(Status.RESUMABLE, reason=reason, resumable=payload, heartbeat_at=now)


def standing_grant(entry: Entry) -> Directive | None:
    """The adoption grant the entry carries that its host has not yet accepted, if any."""
    d = entry.directive
    if entry.status is Status.ADOPTED and d is not None and d.kind is DirectiveKind.ADOPT:
        return d
    return None


def _every_grant_stands(_master: ProcessIdentity) -> bool:
    # Without a way to look at processes, a standing grant is taken as live: refusing a grant is
    # safe (the owner re-reads and asks again), overwriting a live one is the race
    # (docs/decisions.md#one-adoption-grant-wins).
    return True


def _parent_is(
    fields: tuple[int | None, int | None, str | None], master: ProcessIdentity, master_session: str
) -> bool:
    """``(pid, proc start, session)`` name exactly this master in this session."""
    return fields == (master.pid, master.start_ticks, master_session)


def _granted_to(d: Directive) -> tuple[int | None, int | None, str | None]:
    return d.parent_pid, d.parent_proc_start, d.parent_session_id


def _parent_of(entry: Entry) -> tuple[int | None, int | None, str | None]:
    return entry.parent_pid, entry.parent_proc_start, entry.parent_session_id


def refuse_adoption(
    entry: Entry,
    master: ProcessIdentity,
    master_session: str,
    *,
    seen: Entry | None = None,
    alive: Callable[[ProcessIdentity], bool] = _every_grant_stands,
) -> None:
    """Raise :class:`AdoptionRefused` when a grant to ``master`` may not be written over
    ``entry`` (the version under the lock): one grant wins.

    * A standing grant to another master that is ``alive`` won: two grants that both pass the
      handshake's fence (each decided on the same version) must not overwrite each other, or the
      first master is told it adopted a worker the second one gets. A grant to a master that died
      before the worker accepted it is void (no host accepts it) and may be replaced.
    * ``seen``, the version the grant was decided on: a worker whose parent changed since then
      was adopted by whoever won meanwhile (only an accepted grant re-parents under the same
      process generation).

    Nothing is refused that names ``master`` and ``master_session`` themselves: that grant already
    stands, or that master already is the parent.
    """
    standing = standing_grant(entry)
    if standing is not None and not _parent_is(_granted_to(standing), master, master_session):
        pid, start, session = _granted_to(standing)
        # A grant naming no process is void too: no host can accept it.
        boot = entry.boot_id or master.boot_id
        if pid is not None and start is not None and alive(ProcessIdentity(pid, start, boot)):
            raise AdoptionRefused(entry.key, "granted", pid, session)
    if seen is None:
        return
    parent = _parent_of(entry)
    if parent != _parent_of(seen) and not _parent_is(parent, master, master_session):
        raise AdoptionRefused(entry.key, "adopted", entry.parent_pid, entry.parent_session_id)


def grant_adoption(
    entry: Entry,
    master: ProcessIdentity,
    master_session: str,
    now: int,
    *,
    alive: Callable[[ProcessIdentity], bool] = _every_grant_stands,
) -> Entry | None:
    """A master's owner-approved (or exact-session) adoption grant, written into the worker's
    entry; None (nothing to write) when this very grant already stands. Refused
    (:class:`AdoptionRefused`) over another master's live grant: see :func:`refuse_adoption`."""
    refuse_adoption(entry, master, master_session, alive=alive)
    standing = standing_grant(entry)
    if standing is not None and _parent_is(_granted_to(standing), master, master_session):
        return None
    directive = Directive(
        kind=DirectiveKind.ADOPT,
        at=now,
        parent_pid=master.pid,
        parent_session_id=master_session,
        parent_proc_start=master.start_ticks,
    )
    return entry.moved(Status.ADOPTED, reason="adoption_granted", directive=directive)


def request_cleanup(entry: Entry, master_session: str | None, now: int) -> Entry:
    """A master's owner-approved cooperative wind-down request; the worker applies it itself."""
    directive = Directive(kind=DirectiveKind.CLEANUP, at=now, parent_session_id=master_session)
    return attrs.evolve(entry, directive=directive)


def accept_adoption(entry: Entry, now: int) -> Entry:
    """The worker re-parents to the grant's master and watches it from now on: the grant of
    ``entry``, the version under the lock, so the parent the host watches is the one it wrote."""
    directive = entry.directive
    if directive is None or directive.kind is not DirectiveKind.ADOPT:
        raise ValueError(f"{entry.key}: no adoption grant to accept")
    return entry.moved(
        Status.RUNNING,
        reason="adopted",
        parent_pid=directive.parent_pid,
        parent_session_id=directive.parent_session_id,
        parent_proc_start=directive.parent_proc_start,
        directive=None,
        resumable=None,
        heartbeat_at=now,
    )


def _handoff(entry: Entry, outcome: Outcome, now: int, summary: str, result_pointer: str | None) -> Handoff:
    # Here, not at the top: secrets brings hmac and hashlib (OpenSSL, ~3.7 MiB of every host,
    # docs/decisions.md#a-host-loads-only-what-it-uses), and only a host that hands off needs it.
    import secrets

    return Handoff(
        id=secrets.token_hex(6),
        generation=entry.registration,
        parent_session_id=entry.parent_session_id,
        outcome=outcome,
        created_at=now,
        summary=bounded(summary),
        result_pointer=result_pointer,
    )


def _with_handoff(entry: Entry, handoff: Handoff) -> tuple[Handoff, ...]:
    """``handoff`` appended; over the bound, delivered ones go first, oldest first (an agent
    with many rounds never pushes out one its owner has not had)."""
    handoffs = [*entry.handoffs, handoff]
    while len(handoffs) > MAX_HANDOFFS:
        done = next((h for h in handoffs if h.delivered_at is not None), handoffs[0])
        handoffs.remove(done)
    return tuple(handoffs)


def record_round(
    entry: Entry,
    outcome: Outcome,
    now: int,
    *,
    summary: str = "",
    result_pointer: str | None = None,
    usage: str | None = None,
) -> Entry | None:
    """A worker's round ended with its marker (``done``/``blocked``) while its agent lives on:
    a handoff for its owner at once, the status unchanged. None (no write) for an entry with no
    owner to hand off to, or one whose agent already ended."""
    if entry.role is Role.MASTER or entry.parent_session_id is None:
        return None
    if entry.status in (Status.TERMINAL, Status.CLOSED):
        return None
    handoff = attrs.evolve(_handoff(entry, outcome, now, summary, result_pointer), usage=usage)
    return attrs.evolve(entry, handoffs=_with_handoff(entry, handoff), heartbeat_at=now)


def record_terminal(
    entry: Entry,
    exit_record: ExitRecord,
    now: int,
    *,
    summary: str = "",
    result_pointer: str | None = None,
    handoff: bool = True,
) -> Entry:
    """The agent ended. A worker keeps an undelivered handoff for its owner; a master closes.

    ``handoff=False``: the round already handed off (its marker) and nothing was asked of the
    agent since, so its end is only recorded: a stop of an idle finished worker never reads as a
    second, contradicting result. The record closes unless an earlier handoff is undelivered."""
    if entry.role is Role.MASTER or entry.parent_session_id is None:
        return entry.moved(Status.CLOSED, reason=exit_record.kind.value, exit=exit_record, heartbeat_at=now)
    handoffs = entry.handoffs
    if handoff:
        made = _handoff(entry, Outcome.of_exit(exit_record), now, summary, result_pointer)
        made = attrs.evolve(made, code=exit_record.code, signal=exit_record.signal)
        handoffs = _with_handoff(entry, made)
    elif not entry.undelivered:
        return entry.moved(Status.CLOSED, reason=exit_record.kind.value, exit=exit_record, heartbeat_at=now)
    return entry.moved(
        Status.TERMINAL,
        reason=exit_record.kind.value,
        exit=exit_record,
        handoffs=handoffs,
        heartbeat_at=now,
    )


def mark_delivered(entry: Entry, handoff_id: str, now: int) -> Entry:
    """The owner accepted the handoff; once all are delivered the record is closed, its reason
    still saying how the agent ended (``killed, delivered``): one act reads the same whether
    its handoff was still owed or not (docs/decisions.md#a-closed-record-says-how-its-agent-ended)."""
    handoffs = tuple(
        attrs.evolve(h, delivered_at=now) if h.id == handoff_id and h.delivered_at is None else h
        for h in entry.handoffs
    )
    changed = attrs.evolve(entry, handoffs=handoffs)
    if entry.status is Status.TERMINAL and not changed.undelivered:
        ended = entry.reason or (entry.exit.kind.value if entry.exit is not None else None)
        reason = f"{ended}, delivered" if ended else "delivered"
        return changed.moved(Status.CLOSED, reason=reason[:MAX_REASON])
    return changed


def close(entry: Entry, reason: str, now: int) -> Entry:
    """Nothing more will happen to this record."""
    return entry.moved(Status.CLOSED, reason=reason, directive=None, heartbeat_at=now)
