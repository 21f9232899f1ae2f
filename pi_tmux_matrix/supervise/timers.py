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

    def due(self, now: float) -> bool:
        if now < self.next:
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

    def deadline_passed(self, now: float) -> bool:
        return self.deadline is not None and now >= self.deadline
