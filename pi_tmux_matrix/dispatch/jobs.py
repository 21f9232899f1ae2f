"""Jobs and results on disk: ``<state dir>/jobs/<id>.json`` and ``results/<job>.<agent>.<round>.json``.

Both go through :class:`~pi_tmux_matrix.matrix.store.RecordStore` (locks, durable atomic writes,
strict reads) and the one converter. A result is an exclusive create: whoever sees an agent's end
first (its marker, its host's exit, the deadline, the owner's stop) writes it, and every later
writer learns it lost.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import attrs

from ..errors import CorruptEntry, JobNotFound
from ..identity import validate_id
from ..matrix.codec import DecodeError, converter, structure
from ..matrix.model import bounded
from ..matrix.store import MatrixStore, Problem, RecordStore, now_ms
from .model import JOB_SCHEMA_VERSION, AgentResult, Job

__all__ = ["JobStore", "new_job_id", "new_nonce"]


def new_job_id() -> str:
    """``job-<UTC yyyymmdd-HHMMSS>-<6 hex>``: sortable by time, unique without coordination."""
    return f"job-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-{secrets.token_hex(3)}"


def new_nonce() -> str:
    return secrets.token_hex(6)


class JobStore:
    """Typed access to job and result records."""

    def __init__(self, store: MatrixStore) -> None:
        self.store = store
        self.jobs = RecordStore(store, "jobs")
        self.results = RecordStore(store, "results")

    # -- jobs -------------------------------------------------------------------------------------
    def _job(self, raw: dict[str, Any], name: str) -> Job:
        version = raw.get("schemaVersion")
        if type(version) is int and version > JOB_SCHEMA_VERSION:
            raise CorruptEntry(
                str(self.jobs.root / f"{name}.json"),
                f"written by a newer pi-matrix (schemaVersion {version}); upgrade to read it",
            )
        try:
            job = structure(raw, Job)
        except DecodeError as exc:
            raise CorruptEntry(str(self.jobs.root / f"{name}.json"), exc.reason) from None
        if job.id != name:
            raise CorruptEntry(
                str(self.jobs.root / f"{name}.json"), f"inner id {job.id!r} differs from the name"
            )
        return job

    def create(self, job: Job) -> Job:
        validate_id(job.id, "job id")
        if not self.jobs.put(job.id, converter.unstructure(job), exclusive=True):
            raise CorruptEntry(str(self.jobs.root / f"{job.id}.json"), "a job with this id already exists")
        return job

    def get(self, job_id: str) -> Job:
        validate_id(job_id, "job id")
        raw = self.jobs.get(job_id)
        if raw is None:
            raise JobNotFound(job_id)
        return self._job(raw, job_id)

    def update(self, job_id: str, change: Callable[[Job], Job | None]) -> Job:
        """Change a job under its lock (``change`` returning None writes nothing)."""
        validate_id(job_id, "job id")
        seen: list[Job] = []

        def apply(raw: dict[str, Any] | None) -> dict[str, Any] | None:
            if raw is None:
                raise JobNotFound(job_id)
            job = self._job(raw, job_id)
            changed = change(job)
            seen.append(changed or job)
            return None if changed is None else converter.unstructure(changed)

        self.jobs.update(job_id, apply)
        return seen[-1]

    def list_jobs(self) -> tuple[list[Job], list[Problem]]:
        records, problems = self.jobs.list()
        jobs: list[Job] = []
        for name, raw in records:
            try:
                jobs.append(self._job(raw, name))
            except CorruptEntry as exc:
                problems.append(Problem(str(self.jobs.root / f"{name}.json"), exc.reason, "corrupt"))
        return jobs, problems

    # -- results ----------------------------------------------------------------------------------
    def put_result(self, result: AgentResult) -> bool:
        """Write ``result`` unless this agent's round already has one (False then)."""
        name = f"{result.job_id}.{result.agent_id}.{result.round}"
        result = attrs.evolve(result, detail=bounded(result.detail, 2000))
        return self.results.put(name, converter.unstructure(result), exclusive=True)

    def result(self, job_id: str, agent_id: str, round_: int) -> AgentResult | None:
        name = f"{job_id}.{agent_id}.{round_}"
        raw = self.results.get(name)
        if raw is None:
            return None
        try:
            return structure(raw, AgentResult)
        except DecodeError as exc:
            raise CorruptEntry(str(self.results.root / f"{name}.json"), exc.reason) from None

    def results_of(self, job: Job) -> dict[str, list[AgentResult]]:
        """Every result of every agent of ``job``, by agent id, oldest round first."""
        found: dict[str, list[AgentResult]] = {}
        for agent in job.agents:
            rounds = []
            for round_ in range(1, agent.round + 1):
                try:
                    result = self.result(job.id, agent.agent_id, round_)
                except CorruptEntry:
                    result = None
                if result is not None:
                    rounds.append(result)
            found[agent.agent_id] = rounds
        return found


def result_now(job: Job, agent_id: str, key: str, round_: int, kind: Any, **fields: Any) -> AgentResult:
    """An :class:`AgentResult` stamped now."""
    return AgentResult(
        job_id=job.id, agent_id=agent_id, key=key, round=round_, kind=kind, at=now_ms(), **fields
    )
