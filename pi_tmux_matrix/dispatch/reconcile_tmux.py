"""The job records held against what tmux shows: each agent's pane tri-state, records completed from
pane tags, orphaned jobs marked, and tagged panes no record knows listed.

Nothing here kills or starts anything, and nothing here judges an agent dead: an unreachable tmux
server is reported as ``unreachable``, and a job is orphaned only when the server answers without
its panes *and* its hosts are gone by process identity.
"""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from pathlib import Path

import attrs

from .. import procs
from ..errors import TmuxUnavailable
from ..matrix.store import MatrixStore, now_ms
from .backends import started_in
from .confirm import settle_starts
from .hostless import of_an_ended_boot, settle
from .jobs import JobStore
from .model import Job, JobAgent
from .tmux import TmuxServer
from .tmux_model import JOB_TAG, KEY_TAG, Pane
from .views import CorruptJobView, JobView, ListedJob, TmuxState, UntrackedJobView, UntrackedPane, job_view

__all__ = ["PaneCache", "rebuild_from_tags", "reconcile", "tmux_states", "untracked"]

# Panes of a job started by `pi-matrix resume`: tagged, though no job record is ever written.
_RESUME_JOB = "resume"


class PaneCache:
    """The panes on each socket, asked once per command: none when no server is there at all (its
    panes are gone), None when a server is there but does not answer (that proves nothing)."""

    def __init__(self) -> None:
        self._panes: dict[str, list[Pane] | None] = {}
        self._absent: set[str] = set()

    def panes(self, socket: str) -> list[Pane] | None:
        if socket not in self._panes:
            server = TmuxServer(socket)
            try:
                self._panes[socket] = server.panes()
            except TmuxUnavailable:
                present = server.server_present()
                self._panes[socket] = None if present else []
                if not present:
                    self._absent.add(socket)
        return self._panes[socket]

    def absent(self, socket: str) -> bool:
        """No server listens on ``socket`` (asked by :meth:`panes`)."""
        return socket in self._absent


def tmux_states(job: Job, cache: PaneCache | None = None) -> dict[str, TmuxState]:
    """Tri-state per agent: ``unreachable`` (a server that does not answer: proves nothing),
    ``gone`` (no server any more, or one that answers without the pane), ``ours`` (the pane's
    process is the job's host), ``foreign`` (a pane with that id runs something else); ``n/a``
    outside tmux."""
    cache = PaneCache() if cache is None else cache
    return {agent.agent_id: _state(agent, cache) for agent in job.agents}


def _state(agent: JobAgent, cache: PaneCache) -> TmuxState:
    socket = agent.tmux_socket
    if socket is None:
        return "n/a"
    panes = cache.panes(socket)
    if panes is None:
        return "unreachable"
    pane = next((p for p in panes if p.pane_id == agent.pane_id), None)
    if pane is None:
        if cache.absent(socket) and procs.is_alive(agent.host):
            # No server at the socket's path, yet the host that runs in one of its panes lives:
            # the server is there under another path (a moved socket), not gone.
            return "unreachable"
        return "gone"
    return "ours" if pane.pane_pid == agent.host_pid else "foreign"


def rebuild_from_tags(jobs: JobStore, job: Job, cache: PaneCache) -> Job:
    """A dispatcher that died between starting a pane and recording it: the pane's tags
    (``@pi_matrix_job``/``@pi_matrix_key``) say which agent it is, so the record is completed."""
    found: dict[str, JobAgent] = {}
    for agent in job.agents:
        socket = agent.tmux_socket
        if not socket or agent.pane_id is not None:
            continue
        for pane in cache.panes(socket) or []:
            if pane.tag(JOB_TAG) == job.id and pane.tag(KEY_TAG) == agent.key:
                found[agent.agent_id] = started_in(pane).recorded(agent)
    if not found:
        return job
    return jobs.update(
        job.id,
        lambda j: attrs.evolve(
            j, agents=tuple(found.get(a.agent_id, a) if a.pane_id is None else a for a in j.agents)
        ),
    )


def untracked(sockets: AbstractSet[str], known: AbstractSet[str], cache: PaneCache) -> list[UntrackedPane]:
    """Panes tagged by a dispatcher whose job record is gone (a wiped or other state dir)."""
    rows: list[UntrackedPane] = []
    for socket in sorted(sockets):
        for pane in cache.panes(socket) or []:
            job_id = pane.tag(JOB_TAG)
            if job_id and job_id not in known:
                rows.append(
                    UntrackedPane(
                        job_id=job_id,
                        key=pane.tag(KEY_TAG),
                        socket=socket,
                        pane_id=pane.pane_id,
                        target=pane.target,
                        host_pid=pane.pane_pid,
                        host_alive=procs.identify(pane.pane_pid) is not None,
                    )
                )
    return rows


def _orphaned(view: JobView, states: dict[str, TmuxState]) -> bool:
    """Unfinished, every pane recorded, and every unfinished agent's pane gone and host dead (an
    agent running on unsupervised is not lost: its job is running)."""
    unfinished = [a for a in view.agents if a.result is None]
    # A fire still launching has no panes yet: not orphaned (unless it was launched in a boot
    # that has ended, whose crash undid the record of its panes).
    recorded = all(a.pane_id is not None or of_an_ended_boot(a) for a in view.job.agents if a.in_tmux)
    return (
        view.state == "running"
        and bool(unfinished)
        and recorded
        and all(
            states.get(a.agent.agent_id) == "gone" and not a.host_alive and a.unsupervised is None
            for a in unfinished
        )
    )


def reconcile(
    jobs: JobStore, entries: MatrixStore | None, *, sockets: AbstractSet[str] | None = None
) -> list[ListedJob]:
    """On dispatcher start (``jobs``): complete records from pane tags, write the result of
    each round whose host and agent ended unseen (:func:`~.hostless.settle`), mark unfinished jobs
    whose panes all vanished as orphaned (never killing anything), report every job's
    tri-state; panes tagged with an unknown job are listed as ``untracked``. ``entries`` gives
    each agent's matrix status (None with the matrix off)."""
    records, problems = jobs.list_jobs()
    cache = PaneCache()
    views: list[ListedJob] = [
        CorruptJobView(job_id=Path(bad.path).stem, problem=bad.reason, path=bad.path) for bad in problems
    ]
    for job in records:
        current = rebuild_from_tags(jobs, job, cache)
        states = tmux_states(current, cache)
        view = job_view(current, jobs.results_of(current), entries=entries, tmux_state=states)
        # A start no fire waited for, whose host died before starting its agent: the job's
        # result says so, and its launching entry is closed (first: the next rule would write a
        # vaguer result and leave the entry for a master to relaunch).
        settled = entries is not None and settle_starts(entries, jobs, current, view.unsettled())
        # A round whose host and agent both ended unseen gets its result now
        # (docs/decisions.md#a-hostless-round-stays-open-until-its-agent-ends).
        if settle(jobs, entries, current) or settled:
            view = job_view(current, jobs.results_of(current), entries=entries, tmux_state=states)
        if _orphaned(view, states):
            current = jobs.update(
                job.id, lambda j: attrs.evolve(j, orphaned_at=now_ms()) if j.orphaned_at is None else None
            )
            view = job_view(current, jobs.results_of(current), entries=entries, tmux_state=states)
        views.append(view)
    if sockets:
        known = {job.id for job in records} | {_RESUME_JOB}
        views.extend(UntrackedJobView(pane) for pane in untracked(sockets, known, cache))
    return views
