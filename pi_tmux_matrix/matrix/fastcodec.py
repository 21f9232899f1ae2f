"""The readers' fast path from an entry file to its frozen values: one hand-written pass.

:func:`.codec.decode_entry` is the reference: every field goes through the one cattrs
converter's strict hooks, which costs more than parsing the JSON does, for every entry of every
listing. :func:`read_entry` parses the same way (:func:`.codec.entry_document`: the size cap,
strict JSON, the ``schemaVersion`` and the inner key are checked by the same code) and then
checks each field's JSON type here, with no hook per field, and builds the values with their
own attrs ``__init__``, so every validator of the model (what an id, a path or a key is) is
still the one door it always was.

Whatever this pass is not sure of (a type, a missing or unknown field, an enum value, a value
a validator refuses) it does not word: it hands the document to the strict path, which refuses
with its explained message (or accepts, were this pass stricter than it needs to be). So every
refusal is the strict one, word for word, and the only way to be wrong would be to accept what
the strict path refuses or to build another value: tests/test_fastcodec.py holds it to neither,
on valid and on hostile files. The field names are spelled out here, not derived from the
model, so a field added to the model is unknown here (the strict path reads it) until it is
handled, and a test fails until then.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Final, TypeVar

from ..identity import AgentIdentityContract, Mode, Role
from .codec import entry_document, structure
from .model import (
    OUTCOME_ALIASES,
    SCHEMA_VERSION,
    Directive,
    DirectiveKind,
    Entry,
    ExitKind,
    ExitRecord,
    Handoff,
    Outcome,
    ResumablePayload,
    Status,
)

__all__ = ["FIELDS", "entry_of", "read_entry"]

E = TypeVar("E", bound=Enum)

FIELDS: Final[dict[type[Any], frozenset[str]]] = {
    Entry: frozenset(
        {
            "key", "role", "status", "identity", "createdAt", "updatedAt", "schemaVersion",
            "reason", "generation", "registration", "pid", "procStart", "bootId", "parentPid",
            "parentSessionId", "parentProcStart", "taskRef", "taskSummary", "childPid",
            "childProcStart", "heartbeatAt", "directive", "resumable", "handoffs", "exit",
            "agentVersion", "readyAt",
        }
    ),
    AgentIdentityContract: frozenset(
        {
            "agentId", "sessionId", "sessionFile", "cwd", "worktree", "lane", "profile",
            "provider", "mode", "resourcePointers",
        }
    ),
    Directive: frozenset({"kind", "at", "parentPid", "parentSessionId", "parentProcStart"}),
    ResumablePayload: frozenset({"identity", "reason", "at", "taskRef", "taskSummary", "checkpoint"}),
    ExitRecord: frozenset({"kind", "at", "code", "signal"}),
    Handoff: frozenset(
        {
            "id", "generation", "parentSessionId", "outcome", "createdAt", "code", "signal",
            "summary", "resultPointer", "deliveredAt", "usage",
        }
    ),
}  # fmt: skip
_ENTRY, _IDENTITY = FIELDS[Entry], FIELDS[AgentIdentityContract]
_DIRECTIVE, _PAYLOAD = FIELDS[Directive], FIELDS[ResumablePayload]
_EXIT, _HANDOFF = FIELDS[ExitRecord], FIELDS[Handoff]

# The JSON types a field may hold, as sets of Python types: `set(map(type, values)) <= STR` checks
# a whole group of fields in C. Exact types: bool is an int subclass and `true` is not 1.
_STR: Final[frozenset[type]] = frozenset({str})
_INT: Final[frozenset[type]] = frozenset({int})
_STR_OR_NULL: Final[frozenset[type]] = frozenset({str, type(None)})
_INT_OR_NULL: Final[frozenset[type]] = frozenset({int, type(None)})


class _Unsure(Exception):
    """This pass will not decide: the strict path words the refusal (or accepts)."""


def _members(enum: type[E], aliases: dict[str, E] | None = None) -> dict[str, E]:
    # Keyed by the value strings only: a number, null or array never finds a member.
    return {**{member.value: member for member in enum}, **(aliases or {})}


_ROLES: Final = _members(Role)
_STATUSES: Final = _members(Status)
_MODES: Final = _members(Mode)
_DIRECTIVE_KINDS: Final = _members(DirectiveKind)
_EXIT_KINDS: Final = _members(ExitKind)
_OUTCOMES: Final = _members(Outcome, OUTCOME_ALIASES)


def _typed(values: tuple[Any, ...] | list[Any], allowed: frozenset[type]) -> None:
    if not set(map(type, values)) <= allowed:
        raise _Unsure


def _object(doc: Any, fields: frozenset[str]) -> dict[str, Any]:
    if type(doc) is not dict or not doc.keys() <= fields:
        raise _Unsure  # not an object, or an unknown field
    return doc


def _identity(doc: Any) -> AgentIdentityContract:
    get = _object(doc, _IDENTITY).get
    strings = (doc["agentId"], doc["sessionId"])
    optional = (get("sessionFile"), get("cwd"), get("worktree"), get("lane"), get("profile"), get("provider"))
    pointers = get("resourcePointers", [])
    mode = get("mode")
    _typed(strings, _STR)
    _typed(optional, _STR_OR_NULL)
    if type(pointers) is not list:
        raise _Unsure
    _typed(pointers, _STR)
    session_file, cwd, worktree, lane, profile, provider = optional
    return AgentIdentityContract(
        agent_id=strings[0], session_id=strings[1], session_file=session_file, cwd=cwd,
        worktree=worktree, lane=lane, profile=profile, provider=provider,
        mode=None if mode is None else _MODES[mode], resource_pointers=pointers,
    )  # fmt: skip


def _directive(doc: Any) -> Directive:
    get = _object(doc, _DIRECTIVE).get
    numbers = (get("parentPid"), get("parentProcStart"))
    _typed((doc["at"],), _INT)
    _typed(numbers, _INT_OR_NULL)
    _typed((get("parentSessionId"),), _STR_OR_NULL)
    return Directive(
        kind=_DIRECTIVE_KINDS[doc["kind"]], at=doc["at"], parent_pid=numbers[0],
        parent_session_id=doc.get("parentSessionId"), parent_proc_start=numbers[1],
    )  # fmt: skip


def _payload(doc: Any) -> ResumablePayload:
    get = _object(doc, _PAYLOAD).get
    strings = (doc["reason"], get("taskSummary", ""))
    optional = (get("taskRef"), get("checkpoint"))
    _typed(strings, _STR)
    _typed(optional, _STR_OR_NULL)
    _typed((doc["at"],), _INT)
    return ResumablePayload(
        identity=_identity(doc["identity"]), reason=strings[0], at=doc["at"], task_ref=optional[0],
        task_summary=strings[1], checkpoint=optional[1],
    )  # fmt: skip


def _exit(doc: Any) -> ExitRecord:
    get = _object(doc, _EXIT).get
    _typed((doc["at"],), _INT)
    _typed((get("code"), get("signal")), _INT_OR_NULL)
    return ExitRecord(kind=_EXIT_KINDS[doc["kind"]], at=doc["at"], code=get("code"), signal=get("signal"))


def _handoff(doc: Any) -> Handoff:
    get = _object(doc, _HANDOFF).get
    strings = (doc["id"], doc["generation"], get("summary", ""))
    optional = (doc["parentSessionId"], get("resultPointer"), get("usage"))
    numbers = (get("code"), get("signal"), get("deliveredAt"))
    _typed(strings, _STR)
    _typed(optional, _STR_OR_NULL)
    _typed(numbers, _INT_OR_NULL)
    _typed((doc["createdAt"],), _INT)
    return Handoff(
        id=strings[0], generation=strings[1], parent_session_id=optional[0],
        outcome=_OUTCOMES[doc["outcome"]], created_at=doc["createdAt"], code=numbers[0],
        signal=numbers[1], summary=strings[2], result_pointer=optional[1], delivered_at=numbers[2],
        usage=optional[2],
    )  # fmt: skip


def _entry(doc: dict[str, Any]) -> Entry:
    get = _object(doc, _ENTRY).get
    strings = (doc["key"], get("generation", ""), get("registration", ""), get("taskSummary", ""))
    numbers = (doc["createdAt"], doc["updatedAt"], get("schemaVersion", SCHEMA_VERSION))
    optional_strings = (
        get("reason"), get("bootId"), get("parentSessionId"), get("taskRef"), get("agentVersion"),
    )  # fmt: skip
    optional_numbers = (
        get("pid"), get("procStart"), get("parentPid"), get("parentProcStart"), get("childPid"),
        get("childProcStart"), get("heartbeatAt"), get("readyAt"),
    )  # fmt: skip
    _typed(strings, _STR)
    _typed(numbers, _INT)
    _typed(optional_strings, _STR_OR_NULL)
    _typed(optional_numbers, _INT_OR_NULL)
    handoffs = get("handoffs", [])
    if type(handoffs) is not list:
        raise _Unsure
    directive, resumable, ended = get("directive"), get("resumable"), get("exit")
    key, generation, registration, task_summary = strings
    reason, boot_id, parent_session_id, task_ref, agent_version = optional_strings
    (
        pid, proc_start, parent_pid, parent_proc_start, child_pid, child_proc_start, heartbeat_at,
        ready_at,
    ) = optional_numbers  # fmt: skip
    return Entry(
        key=key, role=_ROLES[doc["role"]], status=_STATUSES[doc["status"]],
        identity=_identity(doc["identity"]), created_at=numbers[0], updated_at=numbers[1],
        schema_version=numbers[2], reason=reason, generation=generation,
        registration=registration, pid=pid, proc_start=proc_start, boot_id=boot_id,
        parent_pid=parent_pid, parent_session_id=parent_session_id,
        parent_proc_start=parent_proc_start, task_ref=task_ref, task_summary=task_summary,
        child_pid=child_pid, child_proc_start=child_proc_start, heartbeat_at=heartbeat_at,
        directive=None if directive is None else _directive(directive),
        resumable=None if resumable is None else _payload(resumable),
        handoffs=[_handoff(h) for h in handoffs],
        exit=None if ended is None else _exit(ended), agent_version=agent_version,
        ready_at=ready_at,
    )  # fmt: skip


def entry_of(doc: dict[str, Any]) -> Entry | None:
    """``doc`` (an entry's camelCase mapping) as an :class:`Entry` when it certainly is a valid
    one; None when the strict path must decide (and word the refusal)."""
    try:
        return _entry(doc)
    except Exception:  # noqa: BLE001 - hostile input can fail anywhere: the strict path explains
        return None


def read_entry(data: bytes, expected_key: str) -> tuple[Entry, dict[str, Any]]:
    """:func:`.codec.decode_entry`'s contract (the entry and its raw mapping, or
    :class:`.codec.DecodeError` with the same reason), in one pass over the fields."""
    raw = entry_document(data, expected_key)
    entry = entry_of(raw)
    return (structure(raw, Entry) if entry is None else entry), raw
