"""The host loop's own clocks: the parent poll and directive check (``watcherPollMs``), the
heartbeat (``heartbeatMs``), the inbox poll when inotify is not there, and the run's deadline.

Monotonic seconds throughout; the loop sleeps in ``select`` until the earliest one is due.
"""

from __future__ import annotations

from typing import Final

import attrs

from ..settings import MatrixSettings

__all__ = ["INBOX_POLL_S", "Every", "Timers"]

# With inotify the inbox wakes the host at once; without it, this is how often it looks.
INBOX_POLL_S: Final = 1.0


@attrs.define
class Every:
    """A periodic timer: due once its time has come, then again a period after it was seen due."""

    period: float
    next: float

    @classmethod
    def starting(cls, period: float, now: float) -> Every:
        return cls(period, now + period)

    def due(self, now: float, early: float = 0.0) -> bool:
        """Due now; or, with ``early``, due within that long (then taken now, never later)."""
        if now < self.next - early:
            return False
        self.next = now + self.period
        return True


@attrs.define
class Timers:
    """The loop's periodic timers and its deadline."""

    poll: Every
    beat: Every
    inbox: Every
    deadline: float | None  # the run's time limit (``--deadline``), None without one

    @classmethod
    def start(cls, settings: MatrixSettings, deadline_s: float | None, now: float) -> Timers:
        return cls(
            poll=Every.starting(settings.watcher_poll_ms / 1000, now),
            beat=Every.starting(settings.heartbeat_ms / 1000, now),
            inbox=Every.starting(INBOX_POLL_S, now),
            deadline=now + deadline_s if deadline_s else None,
        )

    def timeout(self, now: float, *, inbox: bool, deadline: bool, others: tuple[float | None, ...]) -> float:
        """How long the loop may wait for its fds: until the earliest due time among the periodic
        timers (the inbox poll only when ``inbox``), the deadline (only when ``deadline``: it
        still counts) and ``others``."""
        due = [self.poll.next, self.beat.next]
        if inbox:
            due.append(self.inbox.next)
        if deadline and self.deadline is not None:
            due.append(self.deadline)
        due.extend(at for at in others if at is not None)
        return max(0.0, min(due) - now)

    def beat_due(self, now: float, *, polled: bool) -> bool:
        """The heartbeat: due, or, on a poll's wake, due before the next poll: it rides that wake,
        early, rather than waking the loop again (never late). With the default 25 s poll and
        30 s beat an idle host wakes once per poll, not twice per 30 s: each wake of a sleeping
        process costs more than its work (docs/decisions.md#an-idle-fleet-is-quiet)."""
        return self.beat.due(now, self.poll.period if polled else 0.0)

    def deadline_passed(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline
