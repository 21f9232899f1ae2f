"""What ``status``, ``setup-help`` and ``guard`` say (the origin's actions of those names): is tmux
here (its binary and version), does the dispatcher's server answer and with which sessions, is the
caller inside tmux and in which session, and a summary of the matrix and its jobs.

Diagnostic only: nothing here starts a tmux server or refuses anything; tmux itself is asked
through :class:`.tmux.TmuxServer` (the one place that runs it).
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final

import attrs

from .. import procs
from ..errors import ContractError
from ..identity import Role
from .tmux import TmuxServer

if TYPE_CHECKING:
    from .manager import Dispatcher

__all__ = ["TmuxStatus", "detect", "guard_text", "matrix_summary", "setup_help"]

INSTALL: Final = (
    "- Debian/Ubuntu/WSL: sudo apt-get install tmux",
    "- Fedora: sudo dnf install tmux",
    "- Arch: sudo pacman -S tmux",
    "- macOS: brew install tmux",
)


@attrs.frozen
class TmuxStatus:
    binary: str | None  # tmux on PATH
    version: str | None  # tmux -V
    socket: str  # the dispatcher's server (tmux -L)
    sessions: tuple[str, ...] | None  # its sessions; None: no server answers there
    inside_tmux: bool  # the caller runs in tmux ($TMUX)
    current_session: str | None  # the caller's session

    @property
    def available(self) -> bool:
        return self.binary is not None and self.version is not None

    def to_json(self) -> dict[str, object]:
        return {
            "available": self.available,
            "binary": self.binary,
            "version": self.version,
            "socket": self.socket,
            "serverRunning": self.sessions is not None,
            "sessions": list(self.sessions or ()),
            "insideTmux": self.inside_tmux,
            "currentSession": self.current_session,
        }

    def lines(self) -> list[str]:
        tmux = f"available ({self.binary}, {self.version})" if self.available else "missing (not on PATH)"
        if self.sessions is None:
            server = "not running (the first fire starts it)"
        else:
            server = f"running, {len(self.sessions)} session(s)" + (
                f": {', '.join(self.sessions)}" if self.sessions else ""
            )
        inside = f"yes, session {self.current_session or '?'}" if self.inside_tmux else "no"
        return [f"tmux: {tmux}", f"server: socket {self.socket}: {server}", f"inside tmux: {inside}"]


def detect(socket: str, env: Mapping[str, str]) -> TmuxStatus:
    """What tmux is here; asks the dispatcher's server and the caller's, starts neither."""
    binary = shutil.which("tmux", path=env.get("PATH"))
    version, sessions, _ = TmuxServer(socket, timeout=5.0).probe() if binary else (None, None, None)
    client, pane = env.get("TMUX", ""), env.get("TMUX_PANE", "")
    current = None
    if binary and client and pane:
        try:
            _, _, current = TmuxServer.of_client(client, timeout=5.0).probe(pane)
        except ContractError:
            current = None  # a $TMUX or $TMUX_PANE this tmux would not take: not known
    return TmuxStatus(
        binary, version, socket, None if sessions is None else tuple(sessions), bool(client), current
    )


def matrix_summary(dispatcher: Dispatcher) -> dict[str, object]:
    """Live masters and workers (by process identity) and the jobs by state."""
    entries = dispatcher.store.list().entries
    live = [e for e in entries if procs.is_alive(e.process)]
    jobs, problems = dispatcher.jobs.list_jobs()
    states = Counter(dispatcher.view(job).state for job in jobs)
    return {
        "liveMasters": sum(e.role is Role.MASTER for e in live),
        "liveWorkers": sum(e.role is Role.WORKER for e in live),
        "entries": len(entries),
        "jobs": dict(sorted(states.items())),
        "unreadableJobs": len(problems),
    }


def setup_help(status: TmuxStatus) -> str:
    """What to do next: how to use the tmux route when it is there, how to get it when it is not."""
    if status.available:
        return "\n".join(
            (
                f"tmux is available ({status.version}, {status.binary}).",
                (
                    "Use tmux_agent_manager (pi-matrix fire) when a task benefits from agents in their "
                    "own panes; ordinary subagent work needs none of it."
                ),
                (
                    'Suggested next call: tmux_agent_manager({ action: "fire_task", teamTemplate: '
                    '"builder-validator", task: "<objective>" }); list_templates and list_profiles show '
                    "what can run; dryRun: true previews."
                ),
                (
                    "Each agent ends with a marker; its result comes back to this master as a handoff, "
                    "so never wait, poll or peek at panes."
                ),
                f"Watch them: tmux -L {status.socket} attach",
            )
        )
    return "\n".join(
        (
            "tmux is not installed (not on PATH).",
            (
                "Ordinary subagent work does not need it. Without it, pi-matrix fire --backend "
                "subprocess runs the same agents detached (their output in <state dir>/logs/)."
            ),
            "Install tmux only if agents in panes are wanted, then restart pi:",
            *INSTALL,
        )
    )


def guard_text(status: TmuxStatus) -> str:
    """The origin's ``guard``: whether the tmux route is open (diagnostic only; it blocks nothing)."""
    if status.available:
        return f"tmux available for tmux-managed agents ({status.version}). guard is diagnostic only."
    return f"{setup_help(status)}\n\nThe tmux route is unavailable; fire --backend subprocess still works."
