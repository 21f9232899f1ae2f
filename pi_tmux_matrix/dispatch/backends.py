"""Where a fired agent's host runs: the :class:`Backend` protocol, :class:`TmuxBackend` and
:class:`SubprocessBackend`.

A backend starts the host argv it is given, with the env it is given, in the cwd it is given, and
says where it runs and which process it is (:class:`Started`). It never judges liveness: that is
done by process identity. A new backend is one new class here, listed in :func:`backends`; a
``FireRequest.backend`` names it, and the job record keeps that name (``JobAgent.backend``).
Every start of a host goes through a backend: a fire's, and recovery's (``recovery.relaunch``
starts a resumed agent through the backend its job names, ``recovery.rehost`` a new host
through the subprocess backend), so a backend listed here is never bypassed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Final, Protocol

import attrs

from .. import procs
from ..contract import DEFAULT_SOCKET, NEVER_INHERITED
from ..errors import ContractError, DispatchError, PiMatrixError
from ..identity import ProcessIdentity
from ..matrix.model import bounded
from ..matrix.store import MatrixStore
from ..matrix.tickets import LaunchTickets, Taken
from ..programs import spawn_detached
from .model import OPEN, SPLIT, SUBPROCESS, TMUX, JobAgent, PlannedAgent
from .tmux import DEFAULT_TIMEOUT_S, TmuxServer
from .tmux_model import AGENT_TAG, JOB_TAG, KEY_TAG, Pane

__all__ = [
    "TMUX_SESSION",
    "Backend",
    "LaunchClosed",
    "Started",
    "SubprocessBackend",
    "TmuxBackend",
    "backend_named",
    "backends",
    "start_fenced",
]

TMUX_SESSION: Final = "pi-matrix"  # the tmux session a fired agent's window opens in

log = logging.getLogger(__name__)


@attrs.frozen
class Started:
    """Where a host runs and which process it is (``host`` is None if it ended before it could be
    identified: a quick agent)."""

    host_pid: int
    host: ProcessIdentity | None
    target: str  # for humans: session:window, or "pid N"
    pane_id: str | None = None
    log: str | None = None  # where its output goes when no pane shows it

    def recorded(self, agent: JobAgent) -> JobAgent:
        """``agent`` with this start written into it."""
        return attrs.evolve(
            agent,
            pane_id=self.pane_id,
            target=self.target,
            host_pid=self.host_pid,
            host_start=self.host.start_ticks if self.host else None,
            boot_id=self.host.boot_id if self.host else agent.boot_id,
            log=self.log,
        )


def started_in(pane: Pane) -> Started:
    """A host that is the process of ``pane`` (tmux execs the pane command: no shell between)."""
    target = f"{pane.session}:{pane.window_name}"
    return Started(pane.pane_pid, procs.identify(pane.pane_pid), target, pane_id=pane.pane_id)


class LaunchClosed(DispatchError):
    """A start failed and nothing runs for it: its ticket was taken as abandoned (a pane made
    later starts nothing), or the host that started late was stopped. The cause is the start's
    own error; a caller may start the launch again elsewhere (recovery falls back to a detached
    host when tmux is unavailable)."""


class Backend(Protocol):
    """Starts hosts somewhere. Implementations are frozen: one per dispatcher."""

    @property
    def name(self) -> str:
        """What ``--backend`` and the job record call it."""
        ...

    def socket(self, requested: str) -> str | None:
        """The tmux socket an agent of this backend records (None: it runs in no tmux)."""
        ...

    def start(self, job_id: str, agent: JobAgent, planned: PlannedAgent) -> Started:
        """Start ``planned.argv`` with ``planned.env`` in ``planned.cwd``; errors are typed."""
        ...

    def adopt(self, job_id: str, agent: JobAgent, host: ProcessIdentity) -> Started | None:
        """A host that started although :meth:`start` failed (it took the launch's ticket):
        where it runs, tagged as :meth:`start` would have; None if that cannot be done now."""
        ...


@attrs.frozen
class TmuxBackend:
    """A detached window on the agent's tmux socket whose pane command *is* the host."""

    name = TMUX
    timeout: float = DEFAULT_TIMEOUT_S  # for each tmux call (a stalled server must not hang a fire)

    def socket(self, requested: str) -> str | None:
        return requested

    def start(self, job_id: str, agent: JobAgent, planned: PlannedAgent) -> Started:
        server = TmuxServer(
            agent.socket or DEFAULT_SOCKET, scrub_env=sorted(NEVER_INHERITED), timeout=self.timeout
        )
        tags = {KEY_TAG: agent.key, JOB_TAG: job_id}
        if planned.layout is not None:
            tags[AGENT_TAG] = agent.agent_id  # its pane's border label in the workspace
        session = planned.session or TMUX_SESSION
        if planned.layout == SPLIT:  # a workspace's next pane: beside the others, tiled
            pane = server.split(
                session, planned.argv, vertical=False, cwd=planned.cwd, env=planned.env, tags=tags, tiled=True
            )
        else:
            pane = server.launch(
                planned.argv,
                session=session,
                window_name=planned.window,
                cwd=planned.cwd,
                env=planned.env,
                tags=tags,
                fresh=planned.layout == OPEN,
            )
        return started_in(pane)

    def adopt(self, job_id: str, agent: JobAgent, host: ProcessIdentity) -> Started | None:
        server = TmuxServer(agent.socket or DEFAULT_SOCKET, timeout=self.timeout)
        try:
            pane = server.adopt(host.pid, tags={KEY_TAG: agent.key, JOB_TAG: job_id})
        except PiMatrixError as exc:
            log.warning("%s: cannot find the pane of late host pid %d: %s", agent.key, host.pid, exc)
            return None
        return None if pane is None or procs.identify(pane.pane_pid) != host else started_in(pane)


@attrs.frozen
class SubprocessBackend:
    """A detached process (its own session, no terminal) logging to the state dir.

    It inherits the dispatcher's environment, less what no launched agent may inherit; a tmux
    pane gets only what the launch passes (tmux's own environment is scrubbed instead)."""

    store: MatrixStore
    env: Mapping[str, str]
    name = SUBPROCESS

    def socket(self, requested: str) -> str | None:
        return None

    def start(self, job_id: str, agent: JobAgent, planned: PlannedAgent) -> Started:
        log_path = self.store.side_dir("logs") / (planned.log_name or f"{job_id}.{agent.agent_id}.log")
        env = {k: v for k, v in self.env.items() if k not in NEVER_INHERITED}
        env.update(planned.env)
        try:
            child = spawn_detached(planned.argv, log_path, cwd=planned.cwd, env=env)
        except OSError as exc:
            raise DispatchError(f"fire: cannot start {planned.argv[0]}: {exc.strerror}") from None
        return Started(child.pid, procs.identify(child.pid), f"pid {child.pid}", log=str(log_path))

    def adopt(self, job_id: str, agent: JobAgent, host: ProcessIdentity) -> Started | None:
        return None  # a failed spawn started nothing; a host of ours that did is stopped


def start_fenced(
    backend: Backend, store: MatrixStore | None, job_id: str, agent: JobAgent, planned: PlannedAgent
) -> Started:
    """``backend.start``, and when it fails, the launch closed for good (``store`` None: the
    matrix is off, no ticket was given). The launcher takes the launch's ticket as abandoned, so
    a pane a stalled tmux makes later starts nothing. If the host took the ticket first it is
    running: it is adopted (found by its pid and tagged) or, failing that, stopped."""
    try:
        return backend.start(job_id, agent, planned)
    except PiMatrixError as exc:
        if store is None:
            raise
        taken = LaunchTickets(store).take(planned.launch.ticket, Taken(None, bounded(str(exc), 300)))
        if taken is None or taken.host is None:
            raise LaunchClosed(f"{exc}; nothing runs for it (a pane made later starts nothing)") from exc
        late = taken.host
        adopted = backend.adopt(job_id, agent, late)
        if adopted is not None:
            log.warning("%s: %s, but its host (pid %d) started: adopted", agent.key, exc, late.pid)
            return adopted
        from .stops import stop_agents

        started = Started(late.pid, late, f"pid {late.pid}").recorded(agent)
        left = stop_agents(store, [started], reason="launch failed")
        if left:
            raise DispatchError(
                f"{exc}; its host (pid {late.pid}) started late and could NOT be stopped: stop it by hand"
            ) from exc
        raise LaunchClosed(f"{exc}; its host (pid {late.pid}) started late and was stopped") from exc


def backends(store: MatrixStore, env: Mapping[str, str]) -> dict[str, Backend]:
    """Every backend by name, in the order ``--backend`` lists them."""
    found: list[Backend] = [TmuxBackend(), SubprocessBackend(store, env)]
    return {backend.name: backend for backend in found}


def backend_named(known: Mapping[str, Backend], name: str) -> Backend:
    try:
        return known[name]
    except KeyError:
        raise ContractError("--backend", f"{name!r} is unknown", f"use {' or '.join(known)}") from None
