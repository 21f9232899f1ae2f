"""Stopping job agents from the owner's side: through their hosts, all at once, then by
identity-checked signals; an agent whose host is gone is stopped by its own identity; only the
panes the dispatcher owns are closed (``stop JOB``, ``dismiss``, a launch that failed). A round's
deadline is not stopped from here: the agent's own host stops it (:mod:`.watch`)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Final

from .. import procs
from ..errors import PiMatrixError, TmuxUnavailable
from ..matrix.mailbox import Inbox, addressee
from ..matrix.store import MatrixStore
from ..matrix.strays import stop_stray, stray_agent
from .model import JobAgent

__all__ = ["STOP_WAIT_S", "STRAY_GRACE_S", "stop_agents"]

log = logging.getLogger(__name__)

STOP_WAIT_S: Final = 15.0  # host stop sequence: request + grace + SIGTERM + SIGKILL, with margin
HOST_TERM_GRACE_S: Final = 5.0  # a host that did not finish its stop: SIGTERM, this long, SIGKILL
STRAY_GRACE_S: Final = 5.0  # an agent without its host: SIGTERM, this long, then SIGKILL


def stop_agents(
    store: MatrixStore, agents: Sequence[JobAgent], *, reason: str, wait_s: float = STOP_WAIT_S
) -> list[JobAgent]:
    """Stop agents through their hosts, all at once, and return the ones whose host survived.

    Each host runs its own stop sequence (request -> SIGTERM -> SIGKILL of its agent); a host that
    has not finished within ``wait_s`` gets SIGTERM (it forwards it), then SIGKILL. Only hosts this
    dispatcher launched are signalled, checked by identity; only their own panes are closed. A
    request the disk refuses (full) is skipped: signals need no disk, and nobody waits for it.
    """
    hosts = [(agent, _host_of(store, agent)) for agent in agents]
    asked = 0
    for agent, host in hosts:
        if host is not None and procs.is_alive(host):
            to = addressee(store, agent.key, host.pid)
            try:
                Inbox(store, agent.key).post("stop", reason, sender=f"pi-matrix {reason}", to=to)
                asked += 1
            except PiMatrixError as exc:
                log.warning("%s; its host gets SIGTERM instead", exc)
    deadline = time.monotonic() + (wait_s if asked else 0.0)  # each host's own stop sequence first
    while time.monotonic() < deadline and any(procs.is_alive(h) for _, h in hosts):
        time.sleep(0.05)
    procs.stop([h for _, h in hosts], HOST_TERM_GRACE_S)  # then SIGTERM (a host forwards it), SIGKILL
    survivors = [a for a, h in hosts if h is not None and procs.is_alive(h)]
    survivors += [a for a in _stop_unsupervised(store, [a for a, h in hosts if not procs.is_alive(h)])]
    for agent, host in hosts:
        if agent not in survivors:
            _close_pane(agent, host)
    return survivors


def _stop_unsupervised(store: MatrixStore, agents: Sequence[JobAgent]) -> list[JobAgent]:
    """Agents whose host is dead while the agent itself runs on (no host forwards a stop): each is
    stopped by its recorded identity and its end recorded (:func:`~..matrix.strays.stop_stray`,
    the same as ``stop KEY``); the ones that survive are returned."""
    left: list[JobAgent] = []
    for agent in agents:
        try:
            entry = store.find(agent.key)
        except PiMatrixError:
            continue
        if entry is None or stray_agent(entry) is None:
            continue
        try:
            stop_stray(store, entry, grace_s=STRAY_GRACE_S)
        except PiMatrixError as exc:
            log.warning("%s: %s", agent.key, exc)
            left.append(agent)
    return left


def _host_of(store: MatrixStore, agent: JobAgent) -> procs.ProcessIdentity | None:
    """The host to stop for ``agent``: the one the job recorded while it lives, else the live host
    the matrix has registered for its key (a host the job never learnt of: a launch that timed
    out yet started, or one resumed after a crash). A stop never reports a live agent stopped."""
    if procs.is_alive(agent.host):
        return agent.host
    try:
        entry = store.find(agent.key)
    except PiMatrixError:
        return agent.host
    if entry is not None and procs.is_alive(entry.process):
        return entry.process
    return agent.host


def _close_pane(agent: JobAgent, host: procs.ProcessIdentity | None) -> None:
    """Close the agent's pane only if it still is that agent's: pane ids restart at %0 with a new
    tmux server, so the id alone could name another job's pane. Its tags must name this agent and,
    while the host lives, its process must be the host."""
    if agent.pane_ref is None:
        return
    socket, pane_id = agent.pane_ref
    from .tmux import TmuxServer
    from .tmux_model import KEY_TAG

    with contextlib.suppress(TmuxUnavailable, PiMatrixError, OSError):
        server = TmuxServer(socket)
        pane = server.pane(pane_id)
        if pane is None or pane.tag(KEY_TAG) != agent.key:
            return
        running = procs.identify(pane.pane_pid)
        if running is not None and host is not None and running != host:
            return
        server.kill_pane(pane_id)
