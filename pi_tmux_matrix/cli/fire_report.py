"""What ``fire`` prints, and ``fire --wait-ready``: the launch, then each agent's readiness.

A fire's ``launched`` means every agent's pane and host were made (their start is not waited
for); with ``--confirm-start`` every agent's process started too; with ``--wait-ready`` also
every pi agent has loaded (its bridge reported in: the entry's ``readyAt``), and an agent that
does not get there in time, or ends first, is named in the error (exit 1) after the launch lines.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ..errors import EXIT_OK, ContractError, DispatchError

if TYPE_CHECKING:
    from ..dispatch.manager import FireResult
    from ..dispatch.ready import Readiness
    from ..matrix.store import MatrixStore
    from .base import Io

__all__ = ["check_wait_ready", "report_fire"]


def check_wait_ready(seconds: float | None, *, enabled: bool) -> None:
    """``--wait-ready SECONDS`` checked before anything is launched."""
    if seconds is None:
        return
    if not seconds > 0:
        raise ContractError("--wait-ready", f"{seconds:g} seconds", "give a positive number of seconds")
    if not enabled:
        raise ContractError(
            "--wait-ready",
            "needs the matrix (readiness is recorded in the agent's entry)",
            "turn processMatrix.enabled on, or fire without --wait-ready",
        )


def report_fire(io: Io, args: argparse.Namespace, store: MatrixStore, result: FireResult) -> int:
    """Print the launch (text or ``--json``), waiting first for readiness when asked."""
    from ..dispatch.ready import wait_ready

    ready = None
    if args.wait_ready is not None and not result.dry_run:
        ready = wait_ready(store, result.job.agents, args.wait_ready)
    if args.json:
        shown = result.to_json()
        if ready is not None:
            shown["ready"] = {r.agent.agent_id: {"readyAt": r.ready_at, "problem": r.problem} for r in ready}
        io.out.write(json.dumps(shown, indent=2) + "\n")  # as dispatch.dump_json
    else:
        _fire_text(io, result, ready)
    failed = [r for r in ready or () if r.problem is not None]
    if failed:
        reasons = "; ".join(f"{r.agent.agent_id} ({r.agent.key}): {r.problem}" for r in failed)
        raise DispatchError(
            f"fire --wait-ready: job {result.job.id}: {len(failed)} agent(s) not ready: {reasons}"
        )
    return EXIT_OK


def _fire_text(io: Io, result: FireResult, ready: list[Readiness] | None) -> None:
    verb = "would launch" if result.dry_run else "launched"
    task = result.job.task_ref or "no task ref"
    io.out.write(f"job {result.job.id} ({task}): {verb} {len(result.job.agents)} agent(s)\n")
    for planned, agent in zip(result.planned, result.job.agents, strict=True):
        where = agent.where
        io.out.write(f"  {agent.agent_id}  {agent.key}  {agent.profile}  lane {agent.lane or '-'}  {where}\n")
        if result.dry_run:
            io.out.write(f"    cwd  {planned.cwd}\n    argv {json.dumps(list(planned.argv))}\n")
    for answer in ready or ():
        if answer.problem is None:
            # Another CLI has no bridge to say more than that its process runs.
            when = "running (no bridge to report more)" if answer.ready_at is None else "pi loaded"
            io.out.write(f"  ready  {answer.agent.agent_id}: {when}\n")
