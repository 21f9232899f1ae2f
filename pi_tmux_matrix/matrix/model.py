"""The matrix's data model: frozen values and the lifecycle's legal moves. No I/O here.

Names follow docs/concepts.md; the rules are in
docs/decisions.md#lifecycle-steps-are-pure-and-fenced. An :class:`Entry` is one registered process;
its ``identity`` is the one :class:`AgentIdentityContract` of the agent, embedded whole.
``generation`` is the token of the last write (fresh for every write, assigned by the store);
``registration`` is the token of the write that registered the current process generation, so an
owner can tell "someone wrote a directive into my entry" (same registration) from "a newer process
owns it now" (different).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, Final

import attrs

from ..errors import IllegalTransition, InvalidId
from ..identity import AgentIdentityContract, ProcessIdentity, Role, validate_task_ref

__all__ = [
    "ENUM_ALIASES",
    "LEGAL_TRANSITIONS",
    "MAX_HANDOFFS",
    "MAX_TEXT",
    "SCHEMA_VERSION",
    "Directive",
    "DirectiveKind",
    "Entry",
    "ExitKind",
    "ExitRecord",
    "Handoff",
    "Outcome",
    "ResumablePayload",
    "Status",
    "bounded",
    "to_camel",
]

SCHEMA_VERSION: Final = 1
MAX_TEXT: Final = 4096
MAX_REASON: Final = 200
MAX_HANDOFFS: Final = 16


class Status(str, Enum):
    """The lifecycle of an entry (docs/concepts.md#statuses;
    docs/decisions.md#lifecycle-steps-are-pure-and-fenced)."""

    LAUNCHING = "launching"  # a launcher published the pid before the process registered
    RUNNING = "running"
    WINDING_DOWN = "winding_down"  # parent lost, payload not yet written
    RESUMABLE = "resumable"  # payload written; waiting for adopt / cleanup / expiry / resume
    ADOPTED = "adopted"  # a new master granted adoption; the worker has not yet re-parented
    TERMINAL = "terminal"  # the agent ended; a terminal handoff is not yet delivered
    CLOSED = "closed"  # finished and delivered; removable


_S = Status
LEGAL_TRANSITIONS: Final[dict[Status, frozenset[Status]]] = {
    _S.LAUNCHING: frozenset({_S.LAUNCHING, _S.RUNNING, _S.RESUMABLE, _S.TERMINAL, _S.CLOSED}),
    _S.RUNNING: frozenset({_S.RUNNING, _S.WINDING_DOWN, _S.RESUMABLE, _S.ADOPTED, _S.TERMINAL, _S.CLOSED}),
    _S.WINDING_DOWN: frozenset(
        {_S.WINDING_DOWN, _S.RESUMABLE, _S.RUNNING, _S.ADOPTED, _S.TERMINAL, _S.CLOSED}
    ),
    _S.RESUMABLE: frozenset({_S.RESUMABLE, _S.ADOPTED, _S.RUNNING, _S.LAUNCHING, _S.TERMINAL, _S.CLOSED}),
    _S.ADOPTED: frozenset({_S.ADOPTED, _S.RUNNING, _S.WINDING_DOWN, _S.RESUMABLE, _S.TERMINAL, _S.CLOSED}),
    # A terminal entry only gains delivery marks until every handoff is delivered.
    _S.TERMINAL: frozenset({_S.TERMINAL, _S.CLOSED}),
    _S.CLOSED: frozenset(),
}


class DirectiveKind(str, Enum):
    """What a master asked of an orphaned worker: one of two handshakes
    (docs/decisions.md#lifecycle-steps-are-pure-and-fenced)."""

    ADOPT = "adopt"
    CLEANUP = "cleanup"


class ExitKind(str, Enum):
    """How an agent's process ended (docs/decisions.md#how-an-agent-ended-is-classified)."""

    EXITED = "exited"  # it exited by itself with a code
    KILLED = "killed"  # its owner stopped it
    TIMED_OUT = "timed_out"  # its deadline passed
    CRASHED = "crashed"  # a signal its owner did not send


class Outcome(str, Enum):
    """How a worker's round ended, as its handoff says it (docs/decisions.md#a-round-hands-off-at-its-marker).

    ``done``/``blocked``: the agent printed its marker (the round ended, the agent may live on);
    otherwise how its process ended: ``exited`` by itself with code 0, ``killed`` by its owner,
    ``timed_out`` at its deadline, ``failed`` (a non-zero code, a signal nobody sent, no start).
    """

    DONE = "done"
    BLOCKED = "blocked"
    EXITED = "exited"
    KILLED = "killed"
    TIMED_OUT = "timed_out"
    FAILED = "failed"

    @classmethod
    def of_exit(cls, record: ExitRecord) -> Outcome:
        """The outcome of a round that ended with its process."""
        if record.kind is ExitKind.KILLED:
            return cls.KILLED
        if record.kind is ExitKind.TIMED_OUT:
            return cls.TIMED_OUT
        if record.kind is ExitKind.EXITED and record.code == 0:
            return cls.EXITED
        return cls.FAILED


# Old spellings of enum values, read (by both decoders: the converter and the plain pass) and
# never written. Handoffs stored before outcomes were widened said ``crashed`` (an ExitKind).
ENUM_ALIASES: Final[dict[type[Enum], dict[str, Enum]]] = {Outcome: {"crashed": Outcome.FAILED}}


_Validator = Callable[[Any, Any, Any], None]
_CAMEL: Final = re.compile(r"_([a-z0-9])")


def to_camel(name: str) -> str:
    """``parent_session_id`` -> ``parentSessionId`` (the on-disk spelling of a field)."""
    return _CAMEL.sub(lambda m: m.group(1).upper(), name)


def bounded(text: str, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters with a marker, so records stay small."""
    if len(text) <= limit:
        return text
    marker = "…[truncated]"
    return text[: limit - len(marker)] + marker


def _max_len(field: str, limit: int) -> _Validator:
    def check(_inst: object, _attr: object, value: str | None) -> None:
        if value is not None and len(value) > limit:
            raise InvalidId(field, f"{len(value)} characters", f"keep it within {limit}")

    return check


def _optional_task_ref(_inst: object, _attr: object, value: str | None) -> None:
    if value is not None:
        validate_task_ref(value)


@attrs.frozen(kw_only=True)
class Directive:
    """An owner-approved request written into a worker's entry by a master."""

    kind: DirectiveKind
    at: int
    parent_pid: int | None = None
    parent_session_id: str | None = None
    parent_proc_start: int | None = None


@attrs.frozen(kw_only=True)
class ResumablePayload:
    """Everything needed to resume the same logical agent: one clone of its identity."""

    identity: AgentIdentityContract
    reason: str = attrs.field(validator=_max_len("reason", MAX_REASON))
    at: int
    task_ref: str | None = attrs.field(default=None, validator=_optional_task_ref)
    task_summary: str = attrs.field(default="", validator=_max_len("taskSummary", MAX_TEXT))
    checkpoint: str | None = attrs.field(default=None, validator=_max_len("checkpoint", MAX_TEXT))


@attrs.frozen(kw_only=True)
class ExitRecord:
    """How the agent's child process ended."""

    kind: ExitKind
    at: int
    code: int | None = None
    signal: int | None = None


@attrs.frozen(kw_only=True)
class Handoff:
    """A bounded event for the owning parent session, delivered exactly once: a round that ended
    (its marker, or its agent's end). ``summary`` is the excerpt of the worker's last answer and
    ``result_pointer`` the full result (the pi bridge's artifact, else the host's events log)."""

    id: str
    generation: str
    parent_session_id: str | None
    outcome: Outcome
    created_at: int
    code: int | None = None
    signal: int | None = None
    summary: str = attrs.field(default="", validator=_max_len("summary", MAX_TEXT))
    result_pointer: str | None = None
    delivered_at: int | None = None
    # The round's usage as its worker claimed it, one line marked advisory (None: no claim).
    usage: str | None = attrs.field(default=None, validator=_max_len("usage", MAX_REASON))


def _to_handoffs(value: Iterable[Handoff]) -> tuple[Handoff, ...]:
    return tuple(value)


def _check_handoffs(_inst: object, _attr: object, value: tuple[Handoff, ...]) -> None:
    if len(value) > MAX_HANDOFFS:
        raise InvalidId("handoffs", f"{len(value)} handoffs", f"keep at most {MAX_HANDOFFS}")


@attrs.frozen(kw_only=True)
class Entry:
    """One registered process in the matrix, stored as ``<key>.json``."""

    key: str
    role: Role
    status: Status
    identity: AgentIdentityContract
    created_at: int
    updated_at: int
    schema_version: int = SCHEMA_VERSION
    reason: str | None = attrs.field(default=None, validator=_max_len("reason", MAX_REASON))
    generation: str = ""
    registration: str = ""
    pid: int | None = None
    proc_start: int | None = None
    boot_id: str | None = None
    parent_pid: int | None = None
    parent_session_id: str | None = None
    parent_proc_start: int | None = None
    task_ref: str | None = attrs.field(default=None, validator=_optional_task_ref)
    task_summary: str = attrs.field(default="", validator=_max_len("taskSummary", MAX_TEXT))
    child_pid: int | None = None
    child_proc_start: int | None = None
    heartbeat_at: int | None = None
    directive: Directive | None = None
    resumable: ResumablePayload | None = None
    handoffs: tuple[Handoff, ...] = attrs.field(default=(), converter=_to_handoffs, validator=_check_handoffs)
    exit: ExitRecord | None = None
    # The agent CLI's version when known at launch (pi's, from its package.json): which pi ran.
    agent_version: str | None = attrs.field(default=None, validator=_max_len("agentVersion", MAX_REASON))
    # When the agent was ready (Unix ms): its pi bridge reported in at pi's session_start, so pi
    # has loaded and reads its mailbox. None until then, and always for an agent with no bridge
    # (another CLI, a pi without -e): only the bridge knows; "running" is only the process started.
    ready_at: int | None = None

    def __attrs_post_init__(self) -> None:
        # The key is derived from the identity; a record whose key disagrees with it is a
        # record of some other agent and must never be trusted as this one.
        expected = self.identity.key(self.role)
        if self.key != expected:
            raise InvalidId(
                "key", f"{self.key!r} does not match role and sessionId", f"expected {expected!r}"
            )
        # A payload is what a resume relaunches from: one that names another agent (or another
        # session file, cwd, lane...) would resume something this entry never was.
        if self.resumable is not None and self.resumable.identity != self.identity:
            differing = [
                to_camel(f.name)
                for f in attrs.fields(AgentIdentityContract)
                if getattr(self.resumable.identity, f.name) != getattr(self.identity, f.name)
            ]
            raise InvalidId(
                "resumable.identity",
                f"differs from the entry's identity in {', '.join(differing)}",
                "a resumable payload must describe the entry it sits in",
            )

    @property
    def process(self) -> ProcessIdentity | None:
        """The registered process, if its identity is recorded."""
        if self.pid is None or self.proc_start is None or self.boot_id is None:
            return None
        return ProcessIdentity(self.pid, self.proc_start, self.boot_id)

    @property
    def parent_process(self) -> ProcessIdentity | None:
        """The declared parent (same boot as the entry), if its identity is recorded."""
        if self.parent_pid is None or self.parent_proc_start is None or self.boot_id is None:
            return None
        return ProcessIdentity(self.parent_pid, self.parent_proc_start, self.boot_id)

    @property
    def child_process(self) -> ProcessIdentity | None:
        """The agent CLI the host runs, so a dead host never leaves a live child unknown."""
        if self.child_pid is None or self.child_proc_start is None or self.boot_id is None:
            return None
        return ProcessIdentity(self.child_pid, self.child_proc_start, self.boot_id)

    @property
    def readiness(self) -> str | None:
        """What the views add to a live pi agent's status: ``ready`` once its bridge reported in,
        ``loading`` until then; None for an ended agent and for one with no bridge (another CLI,
        which is ready once running)."""
        if not self.identity.is_pi or self.status not in (Status.LAUNCHING, Status.RUNNING):
            return None
        return "loading" if self.ready_at is None else "ready"

    @property
    def status_text(self) -> str:
        """The status as ``ls`` and ``top`` show it: ``running (ready)``, ``terminal (reason)``."""
        notes = [note for note in (self.reason, self.readiness) if note]
        return self.status.value + (f" ({', '.join(notes)})" if notes else "")

    @property
    def undelivered(self) -> tuple[Handoff, ...]:
        """Terminal handoffs not yet delivered to their owner."""
        return tuple(h for h in self.handoffs if h.delivered_at is None)

    def can_move_to(self, target: Status) -> bool:
        """Whether the lifecycle allows ``status -> target``."""
        return target in LEGAL_TRANSITIONS[self.status]

    def moved(self, target: Status, *, reason: str | None = None, **changes: Any) -> Entry:
        """A copy in ``target`` status; raises :class:`IllegalTransition` if not allowed."""
        if not self.can_move_to(target):
            raise IllegalTransition(self.key, self.status.value, target.value)
        return attrs.evolve(self, status=target, reason=reason, **changes)
