"""``fire`` confirms the start: the agent's program is found before a pane is made, and each host's
``started`` (its agent process named in its entry) or its failure is waited for, bounded.

A fire that says ``launched`` has seen every agent running; one whose agent could not start
exits 1 with the reason, and the job (an ``exited`` result) and ``show`` (the entry and its
events) carry it. Hosts are waited for together, so twenty agents cost one wait, not twenty.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from .. import procs
from ..errors import DispatchError, PiMatrixError
from ..matrix.mailbox import EventLog
from ..matrix.model import Status
from ..matrix.store import MatrixStore
from ..programs import agent_argv_of
from .model import JobAgent, PlannedAgent

__all__ = ["CONFIRM_S", "StartFailure", "check_programs", "confirm_starts", "spawn_failure"]

CONFIRM_S: Final = 5.0


def check_programs(planned: Sequence[PlannedAgent], env: Mapping[str, str]) -> None:
    """Every agent's program (its argv[0]) is found where its pane will look, before anything is
    made: ``pi`` missing from PATH is a clear error, not a pane that dies at once."""
    for plan in planned:
        argv = agent_argv_of(plan.argv)
        if not argv:
            continue
        program = argv[0]
        path = plan.env.get("PATH", env.get("PATH", os.defpath))
        if os.sep in program:
            # Relative to where the host runs it (--path, a lane), not to where fire was typed.
            where = os.path.join(plan.cwd, program)
            found = where if os.access(where, os.X_OK) and os.path.isfile(where) else None
        else:
            found = shutil.which(program, path=path)
        if found is None:
            where = "is not an executable file" if os.sep in program else "is not on PATH"
            hint = (
                "install pi (npm i -g @earendil-works/pi-coding-agent; pi-matrix's scripts/install-pi) "
                "or set PI_MATRIX_PI_COMMAND"
                if os.path.basename(program) == "pi"
                else f"install it or fix the command of profile {plan.launch.profile.name!r}"
            )
            agent = plan.launch.agent_id
            raise DispatchError(f"fire: agent {agent}: cannot start {program!r}: it {where}; {hint}")


@attrs.frozen
class StartFailure:
    agent: JobAgent
    reason: str
    code: int | None = None  # 127 when the program could not be started; None when unknown


def confirm_starts(
    store: MatrixStore, agents: Sequence[JobAgent], timeout: float = CONFIRM_S
) -> list[StartFailure]:
    """Wait (at most ``timeout``) until each agent's host has named its agent process in its entry,
    or failed to start it; the failures, each with its reason. A host still busy at the end is
    not a failure (a slow machine): the watcher records whatever comes next."""
    pending = {a.agent_id: a for a in agents if a.host is not None}
    failed: list[StartFailure] = []
    deadline = time.monotonic() + timeout
    while pending:
        for agent_id, agent in list(pending.items()):
            verdict = _verdict(store, agent)
            if verdict is None:
                continue
            del pending[agent_id]
            if verdict:
                code = 127 if "could not start" in verdict else None
                failed.append(StartFailure(agent, verdict, code))
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return failed


def _verdict(store: MatrixStore, agent: JobAgent) -> str | None:
    """``""`` started, a reason when it could not start, None while it is not known yet."""
    host = agent.host
    try:
        entry = store.find(agent.key)
    except PiMatrixError:
        entry = None
    ours = entry is not None and host is not None and entry.pid == host.pid
    if ours and entry is not None and entry.child_pid is not None:
        return ""
    failure = spawn_failure(store, agent.key)
    if failure is not None:
        return failure
    if ours and entry is not None and entry.status in (Status.TERMINAL, Status.CLOSED):
        return "" if entry.exit is None or entry.exit.code != 127 else "its agent could not start (exit 127)"
    if host is not None and not procs.is_alive(host):
        return "its host ended before it started the agent; see 'pi-matrix show " + agent.key + "'"
    return None


def spawn_failure(store: MatrixStore, key: str) -> str | None:
    """The reason the host of ``key`` could not start its agent (its ``spawn_failed`` event), if so:
    the fire and the watcher word such an end alike, whichever records it first."""
    for event in reversed(EventLog(store, key).tail(10)):
        if event.get("event") == "spawn_failed":
            return f"its agent could not start: {event.get('error', 'unknown error')}"
    return None
