"""A job as ``jobs``/``job`` show it: typed views of jobs, their agents and their results.

Every view is a frozen value whose ``to_json()`` is the stable JSON the CLI prints and scripts and
the master tool read (camelCase keys; results as :func:`result_json`). The views of 0.1 were those
dicts: ``view["agents"]`` still reads the JSON form, for callers written against them.

Liveness here is process identity (``hostAlive``); ``tmux`` is a tri-state from
:mod:`~pi_tmux_matrix.dispatch.reconcile_tmux` that proves nothing about the agent by itself.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Literal, TypeAlias

import attrs

from .. import procs
from ..errors import CorruptEntry
from ..matrix.model import Entry, Status, bounded
from ..matrix.store import MatrixStore
from .hostless import UNSUPERVISED, Supervision, supervision
from .model import AgentResult, Job, JobAgent

log = logging.getLogger(__name__)

__all__ = [
    "AgentView",
    "CorruptJobView",
    "JobState",
    "JobView",
    "ListedJob",
    "PaneInfo",
    "TmuxState",
    "UntrackedJobView",
    "UntrackedPane",
    "job_view",
    "result_json",
]

# ``unreachable``: no tmux answer (proves nothing); ``gone``: the server answers, the pane is not
# there; ``ours``: the pane's process is the job's host; ``foreign``: that pane id runs something
# else; ``n/a``: not a tmux agent; ``unknown``: not asked.
TmuxState = Literal["unreachable", "gone", "ours", "foreign", "n/a", "unknown"]
JobState = Literal["running", "finished", "stopped", "dismissed", "orphaned"]


class _Subscriptable:
    """``view[key]`` is ``view.to_json()[key]``: the views of 0.1 were those dicts."""

    __slots__ = ()

    def to_json(self) -> dict[str, object]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> object:
        return self.to_json()[key]


def result_json(result: AgentResult) -> dict[str, object]:
    return {
        "round": result.round,
        "kind": result.kind.value,
        "at": result.at,
        "detail": result.detail,
        "exitCode": result.exit_code,
        "exitKind": result.exit_kind,
        # The worker's own claim, advisory; null when it claimed nothing (never made-up zeros).
        "usage": None if result.usage is None else result.usage.to_json(),
    }


@attrs.frozen
class PaneInfo(_Subscriptable):
    """Where a launched agent's host runs, as ``on_launched`` hands it to plugins."""

    pane_id: str | None
    host_pid: int | None
    target: str | None

    @classmethod
    def of(cls, agent: JobAgent) -> PaneInfo:
        return cls(agent.pane_id, agent.host_pid, agent.target)

    def to_json(self) -> dict[str, object]:
        return {"paneId": self.pane_id, "panePid": self.host_pid, "target": self.target, "pid": self.host_pid}


@attrs.frozen
class AgentView(_Subscriptable):
    """One agent of a job: its record, its host's liveness, matrix status, tmux state, results."""

    agent: JobAgent
    host_alive: bool
    status: Status | None  # None: the matrix is off, or the host never registered
    tmux: TmuxState
    result: AgentResult | None  # the current round's
    results: tuple[AgentResult, ...]  # every round's, oldest first
    ready_at: int | None = None  # the entry's readyAt: when its pi bridge reported in
    readiness: str | None = None  # the entry's: "ready", "loading", None (ended, or no bridge)
    # The round is open, its host is dead and its agent runs on: "unsupervised: host gone"; None
    # otherwise. Never finished: its result comes when the agent ends (hostless.py,
    # docs/decisions.md#a-hostless-round-stays-open-until-its-agent-ends).
    unsupervised: str | None = None

    def to_json(self) -> dict[str, object]:
        agent = self.agent
        return {
            "agentId": agent.agent_id,
            "key": agent.key,
            "profile": agent.profile,
            "lane": agent.lane,
            "round": agent.round,
            "socket": agent.tmux_socket,
            "target": agent.target,
            "paneId": agent.pane_id,
            "hostPid": agent.host_pid,
            "hostAlive": self.host_alive,
            "unsupervised": self.unsupervised,
            "status": self.status.value if self.status is not None else None,
            "readyAt": self.ready_at,
            "tmux": self.tmux,
            "result": None if self.result is None else result_json(self.result),
            "results": [result_json(r) for r in self.results],
            "deadlineAt": agent.deadline_at or None,  # 0: a workspace agent has none
        }


@attrs.frozen
class JobView(_Subscriptable):
    job: Job
    state: JobState
    agents: tuple[AgentView, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "jobId": self.job.id,
            "state": self.state,
            "createdAt": self.job.created_at,
            "profile": self.job.profile,
            "team": self.job.team,
            "lane": self.job.lane,
            "taskRef": self.job.task_ref,
            "task": bounded(self.job.task, 200),
            "parentPid": self.job.parent_pid,
            "parentSession": self.job.parent_session_id,
            "backend": self.job.backend,
            "watched": self.job.watched,  # false: a workspace (no watcher, no deadline, no marker)
            "agents": [agent.to_json() for agent in self.agents],
        }

    @property
    def job_id(self) -> str:
        return self.job.id

    def unsettled(self) -> list[JobAgent]:
        """Agents with no result for their round whose host is dead: whether each ever started
        is for :func:`~pi_tmux_matrix.dispatch.confirm.settle_starts` to say (no fire waits)."""
        return [
            a.agent for a in self.agents if a.result is None and not a.host_alive and a.agent.host is not None
        ]


@attrs.frozen
class CorruptJobView(_Subscriptable):
    """A job record that cannot be read (it is listed, never guessed at)."""

    job_id: str
    problem: str
    path: str
    state: Literal["corrupt"] = "corrupt"

    def to_json(self) -> dict[str, object]:
        return {"jobId": self.job_id, "state": self.state, "problem": self.problem, "path": self.path}


@attrs.frozen
class UntrackedPane(_Subscriptable):
    """A pane tagged by a dispatcher whose job record is not in this state dir."""

    job_id: str
    key: str | None
    socket: str
    pane_id: str
    target: str
    host_pid: int
    host_alive: bool

    def to_json(self) -> dict[str, object]:
        return {
            "jobId": self.job_id,
            "key": self.key,
            "socket": self.socket,
            "paneId": self.pane_id,
            "target": self.target,
            "hostPid": self.host_pid,
            "hostAlive": self.host_alive,
        }


@attrs.frozen
class UntrackedJobView(_Subscriptable):
    pane: UntrackedPane
    state: Literal["untracked"] = "untracked"

    @property
    def job_id(self) -> str:
        return self.pane.job_id

    def to_json(self) -> dict[str, object]:
        return {"jobId": self.job_id, "state": self.state, "agents": [self.pane.to_json()]}


# One row of ``jobs``: a job, an unreadable record, or panes of a job this state dir never had.
ListedJob: TypeAlias = JobView | CorruptJobView | UntrackedJobView


def _job_state(job: Job, finished: int) -> JobState:
    if job.dismissed_at is not None:
        return "dismissed"
    if job.stopped_at is not None:
        return "stopped"
    if finished == len(job.agents):
        return "finished"
    if job.orphaned_at is not None:
        return "orphaned"
    return "running"


def _entry_of(entries: MatrixStore, key: str) -> Entry | None:
    """The agent's entry, None when absent or unreadable: one corrupt entry must not cost the
    job's whole view (every reader lists what it can read and warns about the rest)."""
    try:
        return entries.find(key)
    except CorruptEntry as exc:
        log.warning("%s (the entry of %s; its job is shown without its status)", exc, key)
        return None


def job_view(
    job: Job,
    results: Mapping[str, Sequence[AgentResult]],
    *,
    entries: MatrixStore | None,
    tmux_state: Mapping[str, TmuxState] | None = None,
) -> JobView:
    """``job`` with each agent's ``results`` (by agent id), its host's liveness, its matrix status
    (from ``entries``; None with the matrix off) and its tmux state (``unknown`` if not given)."""
    agents: list[AgentView] = []
    for agent in job.agents:
        rounds = tuple(results.get(agent.agent_id, ()))
        entry = _entry_of(entries, agent.key) if entries is not None else None
        result = next((r for r in rounds if r.round == agent.round), None)
        hostless = result is None and supervision(agent, entry) is Supervision.UNSUPERVISED
        agents.append(
            AgentView(
                agent=agent,
                host_alive=procs.is_alive(agent.host),
                status=entry.status if entry is not None else None,
                tmux=(tmux_state or {}).get(agent.agent_id, "unknown" if agent.in_tmux else "n/a"),
                result=result,
                results=rounds,
                ready_at=entry.ready_at if entry is not None else None,
                readiness=entry.readiness if entry is not None else None,
                unsupervised=UNSUPERVISED if hostless else None,
            )
        )
    finished = sum(1 for view in agents if view.result is not None)
    return JobView(job, _job_state(job, finished), tuple(agents))
