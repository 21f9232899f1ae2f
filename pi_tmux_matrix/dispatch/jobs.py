"""Jobs and results on disk: ``<state dir>/jobs/<id>.json`` and ``results/<job>.<agent>.<round>.json``.

Both go through :class:`~pi_tmux_matrix.matrix.records.Records` (locks, durable atomic writes,
strict reads, the one converter). A result is an exclusive create: whoever sees an agent's end
first (its marker, its host's exit, the deadline, the owner's stop) writes it, and every later
writer learns it lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable
from typing import Final

import attrs

from ..errors import CorruptEntry, JobNotFound
from ..identity import validate_id
from ..matrix.model import bounded
from ..matrix.records import Records
from ..matrix.statedir import Problem
from ..matrix.store import MatrixStore
from ..matrix.tokens import now_ms
from .model import JOB_SCHEMA_VERSION, AgentResult, Job, JobAgent, ResultKind
from .usage import CLAIM_SUFFIX, read_claim

__all__ = ["JOB_WAIT_S", "JobStore", "new_job_id", "new_nonce"]

log = logging.getLogger(__name__)
# A fire writes its job record beside its tmux calls, so a host may start before the record is
# there (docs/decisions.md#a-fire-fsyncs-only-what-a-crash-needs). The write takes milliseconds
# and the fire returns only once it is done: this bound is for a disk that stalls. Past it the
# fire has failed or died, and the host starts nothing.
JOB_WAIT_S: Final = 30.0


def new_job_id() -> str:
    """``job-<UTC yyyymmdd-HHMMSS>-<6 hex>``: sortable by time, unique without coordination."""
    return f"job-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.urandom(3).hex()}"


def new_nonce() -> str:
    return os.urandom(6).hex()


class JobStore:
    """Typed access to job and result records."""

    def __init__(self, store: MatrixStore) -> None:
        self.store = store
        self.jobs = Records(
            store, "jobs", Job, newest=JOB_SCHEMA_VERSION, own_name=lambda job: job.id, missing=JobNotFound
        )
        # Only ever read with find: an absent result is an answer, not an error.
        self.results = Records(store, "results", AgentResult)

    # -- jobs -------------------------------------------------------------------------------------
    def create(self, job: Job, *, sync_dir: bool = True) -> Job:
        """Write a new job record (``sync_dir=False``: whole and visible, not yet durable)."""
        validate_id(job.id, "job id")
        # Before the job is seen: its hosts wait for it before their agents start, and an agent's
        # usage claim goes beside its results (claim_path).
        self.store.side_dir("results")
        if not self.jobs.put(job.id, job, exclusive=True, sync_dir=sync_dir):
            raise CorruptEntry(self.jobs.path(job.id), "a job with this id already exists")
        return job

    def get(self, job_id: str) -> Job:
        validate_id(job_id, "job id")
        return self.jobs.get(job_id)

    def get_when_written(self, job_id: str) -> Job:
        """The job's record, waited for while its fire still writes it (JobNotFound past
        :data:`JOB_WAIT_S`). Polled: the wait is almost always none, and a host holds no inotify
        instance for it."""
        give_up = time.monotonic() + JOB_WAIT_S
        pause = 0.005
        while True:
            try:
                return self.get(job_id)
            except JobNotFound:
                if time.monotonic() >= give_up:
                    raise
            time.sleep(pause)
            pause = min(pause * 2, 0.2)

    def update(self, job_id: str, change: Callable[[Job], Job | None], *, sync_dir: bool = True) -> Job:
        """Change a job under its lock (``change`` returning None writes nothing). ``sync_dir=False``:
        whole and visible, but a crash may undo it (only a fire's record of its panes asks so)."""
        validate_id(job_id, "job id")
        return self.jobs.update(job_id, change, sync_dir=sync_dir)

    def list_jobs(self) -> tuple[list[Job], list[Problem]]:
        return self.jobs.list()

    def agent_of(self, key: str) -> JobAgent | None:
        """The job agent the entry ``key`` is, in the newest job that has it (a resumed worker
        may be in a later one), or None (a host started by hand)."""
        found: tuple[int, JobAgent] | None = None
        for job in self.list_jobs()[0]:
            for agent in job.agents:
                if agent.key == key and (found is None or job.created_at >= found[0]):
                    found = (job.created_at, agent)
        return found[1] if found is not None else None

    def archive(self, job: Job) -> str:
        """Move ``job``'s record and results aside (``fire --launch-key K --force``): under
        ``archived-jobs/<name>`` and ``archived-results/<name>.<n>``, each result carrying its
        own job, agent and round. Nothing is deleted before its copy is written; returns ``name``."""
        name = f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{os.urandom(3).hex()}"
        jobs = Records(self.store, "archived-jobs", Job, newest=JOB_SCHEMA_VERSION)
        results = Records(self.store, "archived-results", AgentResult)
        kept = [r for rounds in self.results_of(job).values() for r in rounds]
        for index, result in enumerate(kept, 1):
            results.put(f"{name}.{index}", result, exclusive=True)
        jobs.put(name, job, exclusive=True)
        for result in kept:
            self.results.delete(f"{result.job_id}.{result.agent_id}.{result.round}")
        # The claims go too (each kept result holds its own): the next job of this launch key has
        # the same result names, and must never be shown the old job's usage as its own.
        for agent in job.agents:
            for round_ in range(1, agent.round + 1):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.claim_path(agent.result_name(job.id, round_)))
        self.jobs.delete(job.id)
        return name

    def follow(self, key: str, move: Callable[[JobAgent], JobAgent]) -> list[Job]:
        """The agent ``key`` runs somewhere new (resumed, relaunched, rehosted): it stays the same
        agent of its job, so every live job holding it gets ``move`` applied to that agent (its
        host, pane or log), and ``jobs``, ``followup`` and ``stop JOB`` reach it again."""
        moved: list[Job] = []
        jobs, _problems = self.list_jobs()
        for job in jobs:
            if job.dismissed_at is not None or job.stopped_at is not None:
                continue
            if not any(a.key == key for a in job.agents):
                continue
            moved.append(
                self.update(
                    job.id,
                    lambda j: attrs.evolve(
                        j, agents=tuple(move(a) if a.key == key else a for a in j.agents), orphaned_at=None
                    ),
                )
            )
        return moved

    # -- results ----------------------------------------------------------------------------------
    def put_result(self, result: AgentResult) -> AgentResult | None:
        """Write ``result`` unless this agent's round already has one (None then); returns it as
        written: the round's usage claim, if the worker left one, is read now and kept in it
        (advisory, ``usage``)."""
        name = f"{result.job_id}.{result.agent_id}.{result.round}"
        usage = read_claim(self.claim_path(name))
        if usage is not None and usage.claimed is None:
            log.warning("%s: usage: invalid claim (%s)", self.claim_path(name), usage.invalid)
        result = attrs.evolve(result, detail=bounded(result.detail, 2000), usage=usage)
        return result if self.results.put(name, result, exclusive=True) else None

    def claim_path(self, name: str) -> str:
        """Where the worker of result ``name`` (``<job>.<agent>.<round>``) may claim its usage."""
        return self.results.path(name)[: -len(".json")] + CLAIM_SUFFIX

    def result(self, job_id: str, agent_id: str, round_: int) -> AgentResult | None:
        return self.results.find(f"{job_id}.{agent_id}.{round_}")

    def results_of(self, job: Job) -> dict[str, list[AgentResult]]:
        """Every result of every agent of ``job``, by agent id, oldest round first."""
        found: dict[str, list[AgentResult]] = {}
        for agent in job.agents:
            rounds = []
            for round_ in range(1, agent.round + 1):
                try:
                    result = self.result(job.id, agent.agent_id, round_)
                except CorruptEntry as exc:  # shown without it, never the whole job lost
                    log.warning("%s (a result of job %s)", exc, job.id)
                    result = None
                if result is not None:
                    rounds.append(result)
            found[agent.agent_id] = rounds
        return found


def result_now(
    job: Job,
    agent_id: str,
    key: str,
    round_: int,
    kind: ResultKind,
    *,
    detail: str = "",
    exit_code: int | None = None,
    exit_kind: str | None = None,
) -> AgentResult:
    """An :class:`AgentResult` stamped now."""
    return AgentResult(
        job_id=job.id,
        agent_id=agent_id,
        key=key,
        round=round_,
        kind=kind,
        at=now_ms(),
        detail=detail,
        exit_code=exit_code,
        exit_kind=exit_kind,
    )
