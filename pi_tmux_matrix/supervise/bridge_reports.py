"""What the pi bridge reports from inside the agent's session, and what the host keeps of it:
pi's real session id and file, the latest result artifact, the handoffs pi took, the tool calls
(or the whole session) the worker's envelope refused, and whether the bridge reported at all.

These come through the host's inbox under ``BRIDGE_KINDS``. They are never an owner's command:
they only tell the host about its agent (a different session id is the one thing the host acts
on, as a session switch).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Any, Final

import attrs

from .. import strictjson
from ..errors import PiMatrixError
from ..identity import validate_id
from ..matrix.artifacts import Answer, final_text, marked_answer
from ..matrix.mailbox import MAX_MESSAGE_BYTES, EventLog

__all__ = [
    "BRIDGE_KINDS",
    "BRIDGE_REPORT_S",
    "ENVELOPE_TEXT_CHARS",
    "BridgeReports",
    "SessionReport",
    "bridge_silent",
]

log = logging.getLogger(__name__)
BRIDGE_REPORT_S: Final = 20  # how long a pi child with the bridge gets to report in
ENVELOPE_TEXT_CHARS: Final = 1000  # of a tool_blocked report's tool, path or reason
# What the pi bridge reports from inside the session (never an owner's command).
BRIDGE_KINDS: Final = ("identity", "result", "bridge")
_RUN_NAME: Final = re.compile(r"run-[0-9]{1,12}\.json")
# Events that show the bridge (or a new host) spoke after a ``bridge_silent``: the bridge is heard.
_HEARD: Final = frozenset(
    {"registered", "bridge_ready", "agent_result", "notice_taken", "handoff_accepted", "bridge"}
)
SILENCE_LOOKBACK: Final = 2000  # events read back for the host's last word on its bridge


def bridge_silent(events: EventLog) -> bool:
    """Whether the host's last word on its agent's bridge is ``bridge_silent`` (it never reported
    in time, and has not since): nothing reads the agent's mailbox, so a message would only sit
    there. Read from the host's events, by a process other than the host (``pi-matrix send``)."""
    for event in reversed(events.tail(SILENCE_LOOKBACK)):
        name = event.get("event")
        if name == "bridge_silent":
            return True
        if name in _HEARD:
            return False
    return False


@attrs.frozen
class SessionReport:
    """pi's own session, as its bridge reported it (the id checked, the file a string or None)."""

    session_id: str
    session_file: str | None


@attrs.define
class BridgeReports:
    """What the host knows from its agent's bridge."""

    # Where result artifacts live (``<state dir>/artifacts``): a result report naming any other
    # file is recorded, never read (its text would reach the master's conversation as the round's).
    artifacts: str | None = None
    expected_by: float | None = None  # monotonic time by which a bridged pi should have reported
    seen: bool = False  # the bridge has reported at least once
    result_pointer: str | None = None  # the bridge's latest result artifact
    handoffs_accepted: set[str] = attrs.field(factory=set)  # handoff ids pi took into the session
    fork_results_accepted: set[str] = attrs.field(factory=set)  # runs whose result pi took

    def expect(self, argv: tuple[str, ...], now: float) -> None:
        # A pi child loaded with the bridge reports in within seconds; one that does not is still
        # supervised here (parent watch, stop, exit), only without pi's own identity and notices.
        self.expected_by = now + BRIDGE_REPORT_S if "-e" in argv else None

    def check_silent(self, now: float, events: EventLog, key: str) -> None:
        """Say once (an event and a warning) that an expected bridge has not reported in time."""
        expected = self.expected_by
        if expected is None or self.seen or now <= expected:
            return
        self.expected_by = None
        events.write("bridge_silent", after_s=BRIDGE_REPORT_S)
        log.warning(
            "%s: the pi bridge has not reported in %ds; the agent is supervised without pi's session "
            "identity, mailbox notices or result artifacts (check the -e path and pi's output)",
            key,
            BRIDGE_REPORT_S,
        )

    def last_text(self) -> str:
        """The final assistant text of the latest result artifact ("" without one): what the
        worker answered, for its handoff's excerpt (only the rpc pipe told the host otherwise)."""
        # The pointer is the bridge's word: a FIFO, a symlink or a huge file there is no artifact
        # (never a host hung on a read, never a file followed out of the state dir).
        return "" if self.result_pointer is None else final_text(self.result_pointer)

    def answer_to(self, marker: str) -> Answer | None:
        """The answer holding a round's ``marker`` in the agent's newest runs (None: the run that
        printed it has not reported yet). Read only beside a pointer this host accepted."""
        if self.result_pointer is None:
            return None
        return marked_answer(os.path.dirname(self.result_pointer), marker)

    def _artifact(self, pointer: object) -> bool:
        """A result artifact's path as the bridge writes it: ``<artifacts>/<key>/run-NNNN.json``."""
        if not isinstance(pointer, str) or not os.path.isabs(pointer) or self.artifacts is None:
            return False
        folder, name = os.path.split(os.path.normpath(pointer))
        return (
            os.path.dirname(folder) == os.path.normpath(self.artifacts)
            and _RUN_NAME.fullmatch(name) is not None
        )

    def receive(self, kind: str, text: str, events: EventLog) -> SessionReport | None:
        """Take one report into ``events``; an identity report comes back for the host to follow."""
        try:
            # Strict and bounded: a report nested 10,000 deep is garbled, not a host's RecursionError.
            report = strictjson.loads(text, max_bytes=MAX_MESSAGE_BYTES)
            if not isinstance(report, dict):
                raise TypeError("not an object")
        except (ValueError, TypeError) as exc:
            events.write("bridge_garbled", kind=kind, error=str(exc)[:200])
            return None
        self.seen = True
        if kind == "identity":
            return _identity(report, events)
        if kind == "result":
            pointer = report.get("path")
            if self._artifact(pointer):
                self.result_pointer = pointer
            elif pointer is not None:
                events.write("bridge_pointer_refused", path=str(pointer)[:ENVELOPE_TEXT_CHARS])
            events.write(
                "agent_result", path=pointer, run=report.get("run"), stop_reason=report.get("stopReason")
            )
        elif report.get("event") == "handoff_accepted" and isinstance(report.get("id"), str):
            # pi took the message: only now may the master mark the handoff delivered.
            self.handoffs_accepted.add(report["id"])
            events.write("handoff_accepted", id=report["id"][:200])
        elif report.get("event") == "notice_taken" and isinstance(report.get("id"), str):
            # An owner's prompt or steer is in pi's conversation: delivered, not only posted.
            taken_kind = report.get("kind")
            if taken_kind == "fork_result" and isinstance(report.get("runId"), str):
                # A background fork's result is in the session: the run is marked delivered.
                self.fork_results_accepted.add(report["runId"][:200])
            events.write(
                "notice_taken",
                id=report["id"][:64],
                kind=taken_kind[:32] if isinstance(taken_kind, str) else None,
            )
        elif report.get("event") in ("tool_blocked", "envelope_refused"):
            _envelope_report(report, events)
        elif report.get("event") in ("search_filtered", "search_withheld"):
            _search_report(report, events)
        else:
            what = report.get("event")
            events.write("bridge", what=what if isinstance(what, str) else None)
        return None


def _search_report(report: dict[str, Any], events: EventLog) -> None:
    """The envelope left lines out of a search, or withheld it whole: recorded with the tool and
    the count (or the reason), bounded, so ``show`` and the events tell what the model did not see."""
    tool, removed, reason = report.get("tool"), report.get("removed"), report.get("reason")
    events.write(
        str(report["event"]),
        tool=tool[:32] if isinstance(tool, str) else None,
        removed=removed if type(removed) is int and 0 <= removed < 10**9 else None,
        reason=reason[:ENVELOPE_TEXT_CHARS] if isinstance(reason, str) else None,
    )


def _envelope_report(report: dict[str, Any], events: EventLog) -> None:
    """The worker's envelope refused a tool call (or the whole session): recorded in its own
    events, bounded, for ``pi-matrix show`` to list."""

    def text(name: str) -> str | None:
        value = report.get(name)
        return value[:ENVELOPE_TEXT_CHARS] if isinstance(value, str) else None

    if report.get("event") == "envelope_refused":
        events.write("envelope_refused", reason=text("reason"))
        return
    events.write("tool_blocked", tool=text("tool"), path=text("path"), reason=text("reason"))


def _identity(report: dict[str, Any], events: EventLog) -> SessionReport | None:
    """pi's real session id and file, when they are well-formed (what the host does with them:
    complete the entry's identity, or follow a different id as a session switch)."""
    session_id, session_file = report.get("sessionId"), report.get("sessionFile")
    events.write("bridge_ready", session_id=session_id, session_file=session_file)
    if not isinstance(session_id, str):
        return None
    if session_file is not None and not isinstance(session_file, str):
        return None
    try:
        validate_id(session_id, "pi session id")
    except PiMatrixError as exc:
        events.write("bridge_identity_refused", error=str(exc)[:200])
        return None
    return SessionReport(session_id, session_file)
