"""A fire's starts confirmed: the agent's program is found before a pane is made; whether each
host then started its agent is settled later, never by the fire waiting on it
(docs/decisions.md#fires-do-not-wait-for-starts).

Twenty single fires one after another used to wait twenty host start-ups; now a fire returns once
its launch calls are done (window, tags, job record, ``launching`` entry), and a failed start
still reaches the job (an ``exited`` result with the reason) and ``show``:

* the host could not start its agent (a missing interpreter, exit 127): the host records
  ``spawn_failed`` and its exit, and its own round thread writes the job's result;
* the host itself never got that far (its pane died at once, it ended before registering):
  :func:`settle_starts`, run by ``jobs``/``job`` (and the tool's views), finds the host dead by
  identity with its agent never started, writes the result and closes the launcher's
  ``launching`` record (so it is never relaunched as if interrupted).

A caller that wants the old wait asks for it (``confirm_s``, the CLI's ``--confirm-start``):
:func:`confirm_starts` waits for every host together, so twenty agents cost one wait.
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
from ..matrix import lifecycle
from ..matrix.mailbox import EventLog
from ..matrix.model import Entry, Status
from ..matrix.store import MatrixStore, now_ms
from ..programs import agent_argv_of
from .jobs import JobStore, result_now
from .model import Job, JobAgent, PlannedAgent, ResultKind

__all__ = [
    "CONFIRM_S",
    "StartFailure",
    "check_programs",
    "confirm_starts",
    "record_failures",
    "settle_starts",
    "spawn_failure",
]

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
    not a failure (a slow machine): its round thread, or :func:`settle_starts`, records what
    comes next."""
    pending = {a.agent_id: a for a in agents if a.host_pid is not None}
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
    try:
        entry = store.find(agent.key)
    except PiMatrixError:
        entry = None
    ours = entry is not None and agent.host_pid is not None and entry.pid == agent.host_pid
    if ours and entry is not None and entry.child_pid is not None:
        return ""
    failure = spawn_failure(store, agent.key)
    if failure is not None:
        return failure
    if ours and entry is not None and entry.status in (Status.TERMINAL, Status.CLOSED):
        return "" if entry.exit is None or entry.exit.code != 127 else "its agent could not start (exit 127)"
    if not _host_alive(agent):
        # Never identified, it published no ``launching`` entry: nothing for ``show`` to say.
        see = "" if agent.host is None else "; see 'pi-matrix show " + agent.key + "'"
        return "its host ended before it started the agent" + see
    return None


def _host_alive(agent: JobAgent) -> bool:
    """Whether ``agent``'s host may still be running. One the fire could not identify (its pane's
    process ended before its start time was read: a loaded machine, a host that dies at once)
    runs while its pid does; a pid taken since reads as alive, so no start fails on a guess."""
    if agent.host is not None:
        return procs.is_alive(agent.host)
    return agent.host_pid is None or procs.identify(agent.host_pid) is not None


def record_failures(store: MatrixStore, jobs: JobStore, job: Job, failed: Sequence[StartFailure]) -> None:
    """Each failed start reaches the job (an ``exited`` result with the reason; a result already
    there stands) and the entry (the launcher's ``launching`` record closed)."""
    for failure in failed:
        agent = failure.agent
        jobs.put_result(
            result_now(
                job,
                agent.agent_id,
                agent.key,
                agent.round,
                ResultKind.EXITED,
                detail=failure.reason,
                exit_code=failure.code,
            )
        )
        _close_unstarted(store, agent, failure.reason)


def settle_starts(store: MatrixStore, jobs: JobStore, job: Job, unsettled: Sequence[JobAgent]) -> bool:
    """Confirm, after the fact, the starts no fire waited for: of ``unsettled`` (agents with no
    result for their round whose host is dead), each that never started its agent gets its
    failure recorded. True if anything was written. An agent that did start is left alone
    (its host's end is the round thread's to report, or the job is orphaned)."""
    failed = []
    for agent in unsettled:
        reason = _never_started(store, agent)
        if reason is not None:
            failed.append(StartFailure(agent, reason, 127 if "could not start" in reason else None))
    if failed:
        record_failures(store, jobs, job, failed)
    return bool(failed)


def _never_started(store: MatrixStore, agent: JobAgent) -> str | None:
    """Why the dead host of ``agent`` never started it, or None if it did or we cannot tell (an
    entry that is gone proves nothing)."""
    host = agent.host
    if host is None or procs.is_alive(host):
        return None
    failure = spawn_failure(store, agent.key)
    if failure is not None:
        return failure
    try:
        entry = store.find(agent.key)
    except PiMatrixError:
        return None
    # Still the launcher's ``launching`` record under this host, which is dead: it never
    # registered (its pane died at once, or it ended first). A host that registered and died
    # is the round thread's or the orphan check's, never settled here on a guess.
    if entry is None or entry.pid != host.pid or entry.status is not Status.LAUNCHING:
        return None
    return "its host ended before it started the agent; see 'pi-matrix show " + agent.key + "'"


def _close_unstarted(store: MatrixStore, agent: JobAgent, reason: str) -> None:
    """A start reported as failed is never relaunched later: the launcher's own ``launching``
    record (its host died before registering) is closed, and ``show`` says why."""
    closed: list[Entry] = []

    def close(entry: Entry) -> Entry | None:
        if entry.status is not Status.LAUNCHING or agent.host_pid is None or entry.pid != agent.host_pid:
            return None
        closed.append(lifecycle.close(entry, "start_failed", now_ms()))
        return closed[-1]

    try:
        store.update(agent.key, close)
    except PiMatrixError:
        return
    if closed and spawn_failure(store, agent.key) is None:
        # No host wrote its own account: the start line of ``show`` comes from this one.
        EventLog(store, agent.key).write("spawn_failed", error=reason.partition("; see ")[0][:300])


def spawn_failure(store: MatrixStore, key: str) -> str | None:
    """The reason the host of ``key`` could not start its agent (its ``spawn_failed`` event), if so:
    the fire, ``jobs`` and the round thread word such an end alike, whichever records it first."""
    for event in reversed(EventLog(store, key).tail(10)):
        if event.get("event") == "spawn_failed":
            return f"its agent could not start: {event.get('error', 'unknown error')}"
    return None
