"""``fire --wait-ready``: wait until each launched agent is ready, not only started.

``running`` is written when the host starts the agent process, a second or so before pi has
loaded; a pi agent is ready when its bridge reports in (pi's ``session_start``), which the host
records as the entry's ``readyAt``. An agent with no bridge (another CLI) has nothing to report:
it is ready once running, which ``fire --wait-ready`` confirms first. Agents are waited for together,
each entry read lock-free, so twenty agents cost one wait.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

import attrs

from .. import procs
from ..errors import PiMatrixError
from ..matrix.model import Entry, Status
from ..matrix.store import MatrixStore

if TYPE_CHECKING:
    from .model import JobAgent

__all__ = ["READY_S", "Readiness", "wait_ready"]

READY_S: Final = 30.0  # --wait-ready without SECONDS: pi 1.6 on node 22 loads in about a second
_POLL_S: Final = 0.05


@attrs.frozen
class Readiness:
    """One agent's answer: ready (``ready_at`` Unix ms, None for an agent with no bridge to
    report it), or why not (``problem``)."""

    agent: JobAgent
    ready_at: int | None = None
    problem: str | None = None


def wait_ready(store: MatrixStore, agents: Sequence[JobAgent], timeout_s: float = READY_S) -> list[Readiness]:
    """Wait (at most ``timeout_s``) until every agent in ``agents`` is ready, or cannot become
    ready (its agent ended, its host is gone); each agent's answer, in order."""
    answers: dict[str, Readiness] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        for agent in agents:
            if agent.agent_id not in answers:
                answer = _verdict(store, agent)
                if answer is not None:
                    answers[agent.agent_id] = answer
        if len(answers) == len(agents) or time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    waited = f"{timeout_s:g}s"
    return [
        answers.get(
            a.agent_id,
            Readiness(
                a, problem=f"not ready after {waited} (pi still loading?); see 'pi-matrix show {a.key}'"
            ),
        )
        for a in agents
    ]


def _verdict(store: MatrixStore, agent: JobAgent) -> Readiness | None:
    """Ready, a reason it never will be, or None while it may still be."""
    try:
        entry: Entry | None = store.find(agent.key)
    except PiMatrixError:
        entry = None  # being rewritten, or unreadable: asked again at the next poll
    if agent.provider != "pi":
        # No bridge, no report: ready when running (the fire confirmed its start first).
        return Readiness(agent)
    if entry is not None and entry.ready_at is not None:
        return Readiness(agent, entry.ready_at)
    if entry is not None and entry.reason == "session_switched":
        # pi went on in a session of its own (its bridge reported another id): the agent runs
        # under a new key, and the report that moved it was its readiness.
        return Readiness(agent, entry.updated_at)
    if entry is not None and entry.status in (Status.TERMINAL, Status.CLOSED):
        how = f" ({entry.exit.kind.value}, code {entry.exit.code})" if entry.exit is not None else ""
        return Readiness(agent, problem=f"ended before it was ready{how}; see 'pi-matrix show {agent.key}'")
    host = agent.host
    if host is not None and not procs.is_alive(host):
        # Read once more: the host may have recorded readiness (or the end) just before it left.
        return _last_word(store, agent)
    return None


def _last_word(store: MatrixStore, agent: JobAgent) -> Readiness:
    try:
        entry = store.find(agent.key)
    except PiMatrixError:
        entry = None
    if entry is not None and entry.ready_at is not None:
        return Readiness(agent, entry.ready_at)
    return Readiness(
        agent, problem=f"its host ended before the agent was ready; see 'pi-matrix show {agent.key}'"
    )
