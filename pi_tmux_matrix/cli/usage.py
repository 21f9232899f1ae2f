"""What workers claimed they used, as ``job`` and ``jobs --usage`` show it: advisory, summed only
from claims (:mod:`~pi_tmux_matrix.dispatch.usage`), never made up for a worker that claimed
nothing, and an invalid claim said to be one, never counted."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..dispatch.usage import ClaimedUsage, UsageTotal
from ..dispatch.views import JobView, ListedJob
from ..safetext import printable

if TYPE_CHECKING:
    from ..dispatch.jobs import JobStore
    from ..dispatch.model import Job
    from .base import Io

__all__ = ["claimed_by_key", "job_usage_lines", "spend_cell", "usage_report", "write_usage"]


def job_usage_lines(io: Io, view: JobView) -> list[str]:
    """One line per round whose worker claimed usage (an invalid claim also warned about)."""
    lines = []
    for shown in view.agents:
        for result in shown.results:
            if result.usage is None:
                continue
            line = printable(result.usage.line())
            lines.append(f"{shown.agent.agent_id} round {result.round}: {line}")
            if result.usage.claimed is None:
                io.err.write(
                    f"pi-matrix: warning: {view.job.id} {shown.agent.agent_id} round {result.round}: {line}\n"
                )
    return lines


def spend_cell(total: UsageTotal | None) -> str:
    """A table's SPEND cell: the claimed dollars, else the claimed tokens, else ``-`` (advisory:
    what the workers claimed, checked against nothing)."""
    if total is None or not total.claimed_by:
        return "-"
    if total.priced:
        return f"${total.dollars:.2f}" if total.dollars >= 0.01 else f"${total.dollars:.4f}"
    return f"{total.tokens / 1000:.1f}k tok" if total.tokens >= 1000 else f"{total.tokens} tok"


def claimed_by_key(jobs: JobStore, listed: Sequence[Job]) -> dict[str, UsageTotal]:
    """What each agent (by matrix key) claimed over all its rounds in ``listed`` jobs."""
    found: dict[str, list[ClaimedUsage | None]] = {}
    for job in listed:
        results = jobs.results_of(job)
        for agent in job.agents:
            found.setdefault(agent.key, []).extend(r.usage for r in results.get(agent.agent_id, []))
    return {key: UsageTotal.of([rounds]) for key, rounds in found.items()}


def _total(view: JobView) -> UsageTotal:
    return UsageTotal.of([r.usage for r in shown.results] for shown in view.agents)


def _totals(
    views: Sequence[ListedJob],
) -> tuple[list[tuple[JobView, UsageTotal]], dict[str, tuple[int, UsageTotal]]]:
    """The claimed totals per job, and per master session (the session that fired the jobs)."""
    per_job = [(view, _total(view)) for view in views if isinstance(view, JobView)]
    masters: dict[str, tuple[int, UsageTotal]] = {}
    for view, total in per_job:
        count, sofar = masters.get(view.job.parent_session_id, (0, UsageTotal()))
        masters[view.job.parent_session_id] = (count + 1, sofar + total)
    return per_job, dict(sorted(masters.items()))


def usage_report(views: Sequence[ListedJob]) -> dict[str, object]:
    """``jobs --usage --json``: each job's and each master's claimed total."""
    per_job, masters = _totals(views)
    return {
        "advisory": True,
        "jobs": [
            {"jobId": view.job.id, "parentSession": view.job.parent_session_id, **total.to_json()}
            for view, total in per_job
        ],
        "masters": [
            {"parentSession": session, "jobs": count, **total.to_json()}
            for session, (count, total) in masters.items()
        ],
    }


def write_usage(io: Io, views: Sequence[ListedJob], *, as_json: bool) -> None:
    if as_json:
        io.out.write(json.dumps(usage_report(views), indent=2) + "\n")
        return
    per_job, masters = _totals(views)
    if not per_job:
        io.out.write("no jobs\n")
        return
    io.out.write("usage claimed by the workers (advisory: checked against nothing)\n")
    for view, total in per_job:
        io.out.write(f"job {view.job.id}: {total.line()}\n")
    for session, (count, total) in masters.items():
        io.out.write(f"master {printable(session)} ({count} job(s)): {total.line()}\n")
