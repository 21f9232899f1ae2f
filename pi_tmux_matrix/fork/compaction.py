"""Virtual compaction of a fork's snapshot: a long session is handed to its fork already
compacted from its observational memory, with no LLM call; the parent's file is never touched,
only the run's copy is (docs/decisions.md#a-fork-runs-from-a-snapshot-beside-its-caller).

The memory is pi-observational-memory's (release 3.0.4; read here from the entries it writes,
never imported): custom entries ``om.observations.recorded`` (``data.observations``),
``om.reflections.recorded`` (``data.reflections``) and ``om.observations.dropped``
(``data.observationIds``), each with ``data.coversUpToId``, the last session entry it covers; and
a compaction it made carries ``details`` of type ``om.folded`` (version 1, ``fullFold``, its
``observations`` and ``reflections``). On the branch pi continues:

1. the latest compaction has populated ``om.folded`` details: nothing to do;
2. the latest compaction has none (empty ``om.folded`` details, or another compactor's): it is
   patched in the copy: its ``summary`` and ``details`` made from the memory of the whole branch,
   its cut (``firstKeptEntryId``) kept;
3. no compaction: a cut is found as pi finds one (keep about 20k tokens of recent messages, at
   the start of a turn), and a compaction made from the memory covering what the cut discards is
   appended as the new leaf, as pi appends its own.

A session without those entries (or with nothing to discard) is copied unchanged.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterable
from typing import Any, Final

from .. import pisession

__all__ = ["OM_FOLDED", "compact_snapshot"]

OM_OBSERVATIONS_RECORDED: Final = "om.observations.recorded"
OM_REFLECTIONS_RECORDED: Final = "om.reflections.recorded"
OM_OBSERVATIONS_DROPPED: Final = "om.observations.dropped"
OM_FOLDED: Final = "om.folded"
KEEP_RECENT_TOKENS: Final = 20_000  # pi's compaction.keepRecentTokens default
_MEMORY_ID: Final = re.compile(r"[a-f0-9]{12}")
# The memory's own preamble for its summaries, so a fork reads them as the parent would.
_PREAMBLE: Final = (
    "These are condensed memories from earlier in this session.\n\n"
    "- Reflections: stable, long-lived facts about the user, project, decisions, and constraints.\n"
    "- Observations: timestamped events from the conversation history, in chronological order.\n\n"
    "Treat these as past records. When entries conflict, the most recent observation reflects the latest "
    "known state. Work that prior observations describe as completed should not be redone unless the user "
    "explicitly asks to revisit it."
)
_CUTTABLE_ROLES: Final = frozenset(
    {"user", "assistant", "custom", "bashExecution", "branchSummary", "compactionSummary"}
)

Memory = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # (observations, reflections)


def _reflection(value: Any) -> bool:
    return (
        isinstance(value, dict)
        and isinstance(value.get("id"), str)
        and _MEMORY_ID.fullmatch(value["id"]) is not None
        and isinstance(value.get("content"), str)
        and bool(value["content"])
    )


def _observation(value: Any) -> bool:
    """A reflection's fields, and the time and relevance an observation adds."""
    return (
        _reflection(value)
        and isinstance(value.get("timestamp"), str)
        and value.get("relevance") in ("low", "medium", "high", "critical")
    )


def _data(entry: dict[str, Any], custom_type: str) -> dict[str, Any] | None:
    if entry.get("type") != "custom" or entry.get("customType") != custom_type:
        return None
    data = entry.get("data")
    if not isinstance(data, dict) or not isinstance(data.get("coversUpToId"), str):
        return None
    return data


def _items(data: dict[str, Any], name: str) -> list[Any]:
    """``data[name]`` when it is a list, else nothing: a malformed entry never breaks a launch."""
    value = data.get(name)
    return value if isinstance(value, list) else []


def _folded(details: Any) -> bool:
    return isinstance(details, dict) and details.get("type") == OM_FOLDED and details.get("version") == 1


def _populated(details: Any) -> bool:
    return _folded(details) and bool(details.get("observations") or details.get("reflections"))


def _memory(branch: list[dict[str, Any]], boundary: int) -> Memory:
    """The memory whose coverage ends at or before ``branch[boundary]``: first record of an id
    wins, dropped observations left out (the memory's own fold)."""
    index = {e["id"]: i for i, e in enumerate(branch)}
    observations: dict[str, dict[str, Any]] = {}
    reflections: dict[str, dict[str, Any]] = {}
    dropped: set[str] = set()

    def covered(data: dict[str, Any]) -> bool:
        at = index.get(data["coversUpToId"], -1)
        return 0 <= at <= boundary

    for entry in branch:
        if (data := _data(entry, OM_OBSERVATIONS_RECORDED)) is not None and covered(data):
            for item in _items(data, "observations"):
                if _observation(item):
                    observations.setdefault(item["id"], item)
        elif (data := _data(entry, OM_REFLECTIONS_RECORDED)) is not None and covered(data):
            for item in _items(data, "reflections"):
                if _reflection(item):
                    reflections.setdefault(item["id"], item)
        elif (data := _data(entry, OM_OBSERVATIONS_DROPPED)) is not None and covered(data):
            dropped.update(i for i in _items(data, "observationIds") if isinstance(i, str))
    kept = [o for o in observations.values() if o["id"] not in dropped]
    return kept, list(reflections.values())


def _summary(memory: Memory) -> str:
    observations, reflections = memory
    parts = [_PREAMBLE]
    if reflections:
        parts.append("## Reflections\n" + "\n".join(f"[{r['id']}] {r['content']}" for r in reflections))
    if observations:
        lines = (f"[{o['id']}] {o['timestamp']} [{o['relevance']}] {o['content']}" for o in observations)
        parts.append("## Observations\n" + "\n".join(lines))
    return "\n\n".join(parts)


def _details(memory: Memory, *, full_fold: bool) -> dict[str, Any]:
    observations, reflections = memory
    return {
        "type": OM_FOLDED,
        "version": 1,
        "fullFold": full_fold,
        "observations": observations,
        "reflections": reflections,
    }


def _cut(branch: list[dict[str, Any]], keep_tokens: int) -> int | None:
    """Where pi would cut the branch (the first kept entry's index), moved back to the user
    message that starts its turn (no turn is split); None when nothing would be discarded."""
    messages = [i for i, e in enumerate(branch) if e.get("type") == "message"]
    cuttable = [
        i
        for i in messages
        if isinstance(branch[i].get("message"), dict) and branch[i]["message"].get("role") in _CUTTABLE_ROLES
    ]
    if not cuttable:
        return None
    kept = 0
    cut = None
    for i in reversed(messages):
        kept += pisession.estimate_tokens(branch[i].get("message"))
        if kept >= keep_tokens:
            cut = next((c for c in cuttable if c >= i), None)
            break
    if cut is None:
        return None
    while cut > 0 and not _is_user(branch[cut]):
        cut -= 1
    return cut if cut > cuttable[0] else None


def _is_user(entry: dict[str, Any]) -> bool:
    message = entry.get("message")
    return entry.get("type") == "message" and isinstance(message, dict) and message.get("role") == "user"


def _tokens(branch: Iterable[dict[str, Any]]) -> int:
    return sum(pisession.estimate_tokens(e.get("message")) for e in branch if e.get("type") == "message")


def _new_id(taken: set[str]) -> str:
    while (candidate := secrets.token_hex(4)) in taken:
        pass
    return candidate


def compact_snapshot(data: bytes, *, keep_tokens: int = KEEP_RECENT_TOKENS) -> bytes:
    """The snapshot to hand the fork: ``data`` (a session file's whole lines) with its branch
    compacted from its observational memory per the three cases above, else ``data`` itself."""
    lines = pisession.session_lines(data)
    entries = [line.entry for line in lines if line.entry is not None]
    branch = pisession.branch_of(entries)
    if not any(
        _data(e, t) is not None for e in branch for t in (OM_OBSERVATIONS_RECORDED, OM_REFLECTIONS_RECORDED)
    ):
        return data  # no observational memory: untouched
    compactions = [i for i, e in enumerate(branch) if e.get("type") == "compaction"]
    if compactions:
        latest = branch[compactions[-1]]
        if _populated(latest.get("details")):
            return data  # case 1
        memory = _memory(branch, len(branch) - 1)
        if not (memory[0] or memory[1]):
            return data
        patched = {**latest, "summary": _summary(memory), "details": _details(memory, full_fold=True)}
        # case 2: that one line rewritten in the copy, everything else byte for byte
        return b"".join(
            pisession.encode_entry(patched) if line.entry is latest else line.raw for line in lines
        )
    cut = _cut(branch, keep_tokens)
    if cut is None:
        return data
    memory = _memory(branch, cut)
    if not (memory[0] or memory[1]):
        return data
    compaction = {
        "type": "compaction",
        "id": _new_id({str(e.get("id")) for e in entries}),
        "parentId": branch[-1]["id"],
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        "summary": _summary(memory),
        "firstKeptEntryId": branch[cut]["id"],
        "tokensBefore": _tokens(branch),
        "details": _details(memory, full_fold=False),
        "fromHook": True,
    }
    return data + pisession.encode_entry(compaction)  # case 3: the new leaf, as pi appends its own
