"""A job agent whose host is gone: what its round is, and who ends it
(docs/decisions.md#a-hostless-round-stays-open-until-its-agent-ends).

Since the host watches its own rounds (docs/decisions.md#the-agents-host-watches-its-own-rounds),
a host killed -9 writes nothing: its round stays open. That is the truth while its agent runs on
unsupervised (``ls`` says so too), and the job view says ``working (unsupervised: host gone)``,
never ``finished``. Once that agent ends with no host, nobody is left to see it end but a reader:
a reconcile (``pi-matrix reconcile``, ``jobs``, ``job ID``) writes the round's ``exited`` result,
how it ended if the entry knows it. A result is an exclusive create
(:meth:`~.jobs.JobStore.put_result`), so of two readers who notice at once exactly one writes it.
An exact master that rehosts the agent first gives the round a new host, which watches it again
and ends it by the agent's marker.
"""

from __future__ import annotations

import enum
import logging

from .. import procs
from ..errors import PiMatrixError
from ..matrix.fsio import opened_dir, remove_regular
from ..matrix.layout import PIPES, pipe_name
from ..matrix.model import Entry, ExitRecord
from ..matrix.store import MatrixStore
from .confirm import spawn_failure
from .jobs import JobStore, result_now
from .model import AgentResult, Job, JobAgent, ResultKind

__all__ = [
    "UNSUPERVISED",
    "Supervision",
    "exit_words",
    "of_an_ended_boot",
    "settle",
    "settle_all",
    "supervision",
]

log = logging.getLogger(__name__)

# What a view says of an open round whose agent runs on after its host died.
UNSUPERVISED = "unsupervised: host gone"
# The words of a round whose agent ended while no host watched it, when nothing recorded how.
ENDED_UNSUPERVISED = "agent ended while unsupervised (its host was gone; how it ended is unknown)"
# No entry (the matrix is off), or the host died before its agent started: nothing is known of an
# agent, so the round says only that its host ended.
HOST_ENDED = "the host ended without recording an exit"


class Supervision(enum.Enum):
    """Who watches an open round's agent now."""

    HOST = "host"  # a live host (the job's, or a new one the job is about to follow)
    UNKNOWN = "unknown"  # no host recorded yet (the fire is launching): nothing to judge
    UNSUPERVISED = "unsupervised"  # the host is dead, its agent runs on
    ENDED = "ended"  # the host is dead and so is its agent: the round's end is ours to write


def of_an_ended_boot(agent: JobAgent) -> bool:
    """No host recorded, launched in a boot that has ended: the crash that ended it undid the
    fire's record of the host (docs/decisions.md#a-fire-fsyncs-only-what-a-crash-needs), and
    ended that host and its agent too."""
    return agent.host is None and agent.boot_id is not None and agent.boot_id != procs.boot_id()


def supervision(agent: JobAgent, entry: Entry | None) -> Supervision:
    """Judged by process identity only (never by tmux, which proves nothing about the agent)."""
    if agent.host is None:
        return Supervision.ENDED if of_an_ended_boot(agent) else Supervision.UNKNOWN
    if procs.is_alive(agent.host):
        return Supervision.HOST
    if entry is None:
        return Supervision.ENDED
    # A new host registered for the entry (a rehost or a resume) before the job followed it.
    if entry.pid != agent.host_pid and procs.is_alive(entry.process):
        return Supervision.HOST
    if procs.is_alive(entry.child_process):
        return Supervision.UNSUPERVISED
    return Supervision.ENDED


def exit_words(store: MatrixStore, key: str, record: ExitRecord) -> tuple[str, int | None, str]:
    """A recorded exit as a result says it: (detail, exit code, exit kind). A program that could
    not start has the fire's words (whoever writes first, the result reads the same)."""
    failed = spawn_failure(store, key) if record.code == 127 else None
    if failed is not None:
        return failed, 127, record.kind.value
    detail = f"agent {record.kind.value}"
    if record.code is not None:
        detail += f" with code {record.code}"
    if record.signal is not None:
        detail += f" by signal {record.signal}"
    return detail, record.code, record.kind.value


def settle(jobs: JobStore, entries: MatrixStore | None, job: Job) -> list[AgentResult]:
    """Each open round of ``job`` whose host and agent are both gone gets its ``exited`` result;
    returns those this call wrote. ``entries`` None: the matrix is off."""
    if job.dismissed_at is not None or job.stopped_at is not None or not job.watched:
        return []  # a stop wrote its own results; a workspace has no rounds
    written: list[AgentResult] = []
    for agent in job.agents:
        try:
            if jobs.result(job.id, agent.agent_id, agent.round) is not None:
                continue
            entry = entries.find(agent.key) if entries is not None else None
        except PiMatrixError as exc:  # unreadable: shown as it is, judged by the next reader
            log.warning("job %s: %s's round is left open: %s", job.id, agent.agent_id, exc)
            continue
        if supervision(agent, entry) is not Supervision.ENDED:
            continue
        detail, code, kind = _how_it_ended(jobs.store, agent, entry)
        result = result_now(
            job,
            agent.agent_id,
            agent.key,
            agent.round,
            ResultKind.EXITED,
            detail=detail,
            exit_code=code,
            exit_kind=kind,
        )
        try:
            stored = jobs.put_result(result)
        except PiMatrixError as exc:
            log.warning("job %s: the end of %s's round is not recorded: %s", job.id, agent.agent_id, exc)
            continue
        if stored is not None:
            written.append(stored)
            _drop_pipe(jobs.store, job, agent)
    return written


def _drop_pipe(store: MatrixStore, job: Job, agent: JobAgent) -> None:
    """The round's host and agent are gone: the pane pipe its host left (a tmux agent's FIFO) is
    removed, and a writer blocked in opening it let go (fsio), so no ``cat`` waits for good."""
    if agent.host is None:
        return  # no host was recorded: none made a FIFO the record could name (the sweep's)
    try:
        with opened_dir(store.root / PIPES, create=False) as fd:
            if fd is not None:
                remove_regular(fd, pipe_name(job.id, agent.agent_id, agent.host.pid), fifo=True)
    except (PiMatrixError, OSError) as exc:  # the sweep removes it later
        log.warning("job %s: %s's pane pipe is left for the sweep: %s", job.id, agent.agent_id, exc)


def _how_it_ended(
    store: MatrixStore, agent: JobAgent, entry: Entry | None
) -> tuple[str, int | None, str | None]:
    if entry is None:
        return HOST_ENDED, None, None
    if entry.exit is not None and entry.pid == agent.host_pid:
        return exit_words(store, agent.key, entry.exit)  # its host (or a stop) recorded it
    if entry.child_pid is None:
        return HOST_ENDED, None, None  # it died before its agent started
    return ENDED_UNSUPERVISED, None, None


def settle_all(store: MatrixStore) -> list[AgentResult]:
    """:func:`settle` over every job of the state dir (``pi-matrix reconcile``)."""
    jobs = JobStore(store)
    records, _problems = jobs.list_jobs()  # an unreadable record is ``jobs``' to report
    return [result for job in records for result in settle(jobs, store, job)]
