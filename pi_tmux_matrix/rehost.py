"""Rehosting: a worker whose host died while its agent lives gets a new host
(docs/decisions.md#a-live-agent-is-never-left-unsupervised).

Never leave a live child burning credits silently. A dead host's agent is no one's
child any more, so adopting the entry would write a grant no host reads. Instead the master
claims the entry by CAS (reason ``rehost``, the agent kept), then starts a detached ``pi-matrix
host --rehost KEY --rehost-claim GEN`` through the subprocess backend (``dispatch/backends.py``,
the door every host start goes through). That host registers only over the claim, takes the
agent over by pid + start time (a pidfd watches it; ``send`` reaches a pi agent through its
mailbox file, ``stop`` through identity-checked signals), and records its end as ``exited`` with
the code unknown. Of two masters racing, only the one whose claim lands starts a host; the loser
starts nothing.

Light to import (a master's program names :func:`rehost` as its rehoster at start): the
dispatcher is imported when a rehost runs.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Final

from .dispatch import SUBPROCESS
from .errors import Conflict, PiMatrixError, ResumeRefused
from .identity import Mode, ProcessIdentity
from .launch_contract import LaunchContract
from .matrix import lifecycle
from .matrix.model import Entry
from .matrix.store import MatrixStore, now_ms
from .matrix.strays import stray_agent
from .programs import cli_argv

if TYPE_CHECKING:
    from .dispatch.manager import Dispatcher
    from .dispatch.model import PlannedAgent

__all__ = ["REHOST", "rehost"]

REHOST: Final = "rehost"  # the reason of a rehost's claim, and the job id its host starts under


def rehost(store: MatrixStore, entry: Entry, parent: ProcessIdentity, parent_session: str) -> int:
    """Start a host that takes over ``entry``'s live agent under ``parent``; the new host's pid.
    :class:`ResumeRefused` when there is nothing to rehost or another launcher claimed it."""
    from .dispatch.manager import Dispatcher
    from .recovery import job_agent
    from .settings import load_settings

    if entry.child_process is None or stray_agent(entry) is None:
        raise ResumeRefused(f"{entry.key}: nothing to rehost (its host lives, or its agent is gone)")
    try:
        # A write in place (the status kept, the reason ``rehost``) whose new generation only the
        # host started here may register over; a racing launcher's CAS fails.
        claimed = store.update(
            entry.key, lambda e: e.moved(e.status, reason=REHOST), expected=entry.generation
        )
    except Conflict:
        raise ResumeRefused(
            f"{entry.key}: changed since it was read; another launcher won ("
            f"{lifecycle.claimed_by(store.find(entry.key))}); nothing was started here"
        ) from None
    # The subprocess backend, whatever the job's: the agent runs on where it is (its pane kept);
    # the new host only watches it, so it needs no terminal, and its output is its log.
    dispatcher = Dispatcher(store, load_settings(entry.identity.cwd))
    backend = dispatcher.backends[SUBPROCESS]
    planned = _plan(dispatcher, claimed, parent, parent_session)
    try:
        started = backend.start(REHOST, job_agent(backend, planned, None), planned)
    except PiMatrixError as exc:
        with contextlib.suppress(PiMatrixError):
            store.update(
                entry.key,
                lambda e: lifecycle.make_resumable(e, now_ms(), reason="rehost_failed"),
                expected=claimed.generation,
            )
        raise ResumeRefused(f"{entry.key}: cannot start a host to take its agent over: {exc}") from None
    return started.host_pid


def _plan(
    dispatcher: Dispatcher, claimed: Entry, parent: ProcessIdentity, parent_session: str
) -> PlannedAgent:
    """``pi-matrix host --rehost KEY --rehost-claim GEN`` with the contract of its new parent. It
    starts no agent: its launch names the agent it takes over (its recorded profile, or plain pi
    when that is gone: nothing is composed from it)."""
    from .dispatch.model import AgentLaunch, PlannedAgent
    from .dispatch.profile import WorkerLaunchProfile
    from .recovery import recorded_profile

    identity = claimed.identity
    contract = LaunchContract(
        parent_pid=parent.pid,
        parent_start=parent.start_ticks,
        parent_session=parent_session,
        agent_id=identity.agent_id,
        task_ref=claimed.task_ref,
        worktree_lane=identity.lane,
    )
    try:
        profile = recorded_profile(dispatcher, claimed)
    except PiMatrixError:
        profile = WorkerLaunchProfile(
            name="pi", provider="pi", command=("pi",), mode=identity.mode or Mode.PRINT
        )
    cwd = identity.cwd or "/"
    launch = AgentLaunch(
        job_id=REHOST,
        agent_id=identity.agent_id,
        session_id=identity.session_id,
        key=claimed.key,
        profile=profile,
        task="",
        cwd=cwd,
        parent=parent,
        parent_session=parent_session,
        allowed_paths=(),
        deadline_s=profile.deadline_s,
        nonce=REHOST,
        worktree=identity.worktree,
        lane=identity.lane,
        task_ref=claimed.task_ref,
        session_file=identity.session_file,
        watched=False,
    )
    argv = cli_argv(
        dispatcher.store.root, "host", f"--rehost={claimed.key}", f"--rehost-claim={claimed.generation}"
    )
    return PlannedAgent(
        launch,
        tuple(argv),
        contract.to_env(),
        cwd,
        identity.agent_id[:40],
        log_name=f"{claimed.key}.rehost.log",
    )
