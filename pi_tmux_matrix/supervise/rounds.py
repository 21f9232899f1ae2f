"""A worker's marker rounds as its host sees them: a round ends with the agent's marker, and the
host hands off for it at that moment, not when the agent's process ends
(docs/decisions.md#a-round-hands-off-at-its-marker).

The job's watcher finds ``DONE:<nonce>``/``BLOCKED:<nonce>`` in the agent's output, writes the
job's result and tells the host through its inbox (a ``round`` message,
:func:`~..matrix.mailbox.round_message`);
the host, which owns writes to its entry, appends the handoff (``done``/``blocked``). The
excerpt of a bridged pi is the final text of the bridge's result artifact for the run that
printed the marker (it may land a moment after the marker is seen, so the host waits for it up
to :data:`ARTIFACT_WAIT_S`); any other agent's is what the watcher saw the round print.

Once a round handed off, nothing is open until the owner asks for more (a prompt or a steer):
an agent that ends then (a stop of an idle finished worker) only records its end, never a
second, contradicting handoff for the same round.
"""

from __future__ import annotations

from typing import Final

import attrs

from ..matrix import lifecycle
from ..matrix.mailbox import EventLog, RoundEnd, parse_round
from ..matrix.model import bounded
from ..matrix.store import now_ms
from .bridge_reports import BridgeReports
from .record import OwnRecord

__all__ = ["ARTIFACT_WAIT_S", "Rounds"]

ARTIFACT_WAIT_S: Final = 5.0  # how long a round's handoff waits for the pi bridge's artifact


def _without_marker(text: str, marker: str) -> str:
    """The answer without the marker's own line (the owner needs the answer, not the nonce)."""
    kept = [line for line in text.split("\n") if not line.strip().startswith(marker)]
    return "\n".join(kept).strip()


@attrs.define
class Rounds:
    """The host's view of its agent's rounds: whether one is open, and one waiting for its text."""

    record: OwnRecord
    reports: BridgeReports
    events: EventLog
    open: bool = True  # the agent was given work not yet handed off (its launch task, first)
    pending: RoundEnd | None = None
    pending_until: float | None = None
    _seen: set[tuple[str, int]] = attrs.field(factory=set)

    @property
    def handed_off(self) -> bool:
        """The last round handed off and nothing was asked since: the agent's end is no result."""
        return not self.open and self.pending is None

    def awaited(self, stopped: bool) -> bool:
        """Whether the watcher's word on the open round is still to come, for an agent that ended
        by itself (a stopped one's round ends with the owner's stop, not with a marker)."""
        return self.open and self.pending is None and not stopped

    def asked(self) -> None:
        """The owner asked for more (a prompt or a steer): a round is open again."""
        self.open = True

    def ended(self, text: str, now: float) -> None:
        """A watcher's ``round`` message: hand off now, or once the artifact is in."""
        end = parse_round(text)
        if end is None:
            self.events.write("round_refused", text=text[:200])
            return
        if (end.job, end.round) in self._seen:
            return  # one handoff per round, whoever reported it twice
        self._seen.add((end.job, end.round))
        if self.pending is not None:
            self.settle(now, final=True)
        # The round is over now; a prompt that comes while its text is awaited opens the next one.
        self.open = False
        self.pending, self.pending_until = end, now + ARTIFACT_WAIT_S
        self.settle(now)

    def next_at(self) -> float | None:
        return self.pending_until

    def settle(self, now: float, *, final: bool = False) -> None:
        """Write the pending round's handoff once its text is known (or waited for enough)."""
        end = self.pending
        if end is None:
            return
        # The answer holding the marker, in whichever of the newest runs it is: a worker that took
        # notices as steers while it thought (re-adopted) answers them after it
        # (docs/decisions.md#the-rounds-answer-is-the-one-that-holds-the-marker).
        answer = self.reports.answer_to(end.marker)
        from_artifact = answer is not None
        bridged = self.reports.seen or self.reports.expected_by is not None
        due = self.pending_until is None or now >= self.pending_until
        if bridged and answer is None and not (final or due):
            return
        pointer: str | None = end.path if answer is None else answer.path
        summary = _without_marker(end.text if answer is None else answer.text, end.marker)
        if end.reason:
            summary = f"{summary}\nblocked: {end.reason}".strip()
        self.pending = self.pending_until = None
        written = self.record.write(
            lambda e: lifecycle.record_round(
                e,
                end.outcome,
                now_ms(),
                summary=bounded(summary),
                result_pointer=pointer,
                usage=end.usage or None,
            )
        )
        self.events.write(
            "round_handoff",
            job=end.job,
            round=end.round,
            outcome=end.outcome.value,
            written=written is not None,
            from_artifact=from_artifact,
        )
