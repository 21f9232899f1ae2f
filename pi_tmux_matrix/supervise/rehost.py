"""Rehosting: a worker whose host died while its agent lives gets a new host
(docs/decisions.md#a-live-agent-is-never-left-unsupervised).

Never leave a live child burning credits silently. A dead host's agent is no one's
child any more, so adopting the entry would write a grant no host reads. Instead the master
claims the entry by CAS (reason ``rehost``, the agent kept), then starts a
detached ``pi-matrix host --rehost KEY --rehost-claim GEN``. That host registers only over the
claim, takes the agent over by pid + start time (a pidfd watches it; ``send`` reaches a pi agent
through its mailbox file, ``stop`` through identity-checked signals), and records its end as
``exited`` with the code unknown. Of two masters racing, only the one whose claim lands starts a
host; the loser starts nothing.
"""

from __future__ import annotations

import contextlib
import os

from ..contract import NEVER_INHERITED, LaunchContract
from ..errors import Conflict, PiMatrixError, ResumeRefused
from ..identity import ProcessIdentity
from ..matrix import lifecycle
from ..matrix.model import Entry
from ..matrix.store import MatrixStore, now_ms
from ..matrix.strays import stray_agent
from ..programs import cli_argv, spawn_detached

__all__ = ["REHOST", "needs_rehost", "rehost"]

REHOST = "rehost"


def needs_rehost(entry: Entry) -> bool:
    """Its host is dead and its agent lives: supervision, not adoption, is what it lacks."""
    return stray_agent(entry) is not None


def claim_rehost(entry: Entry) -> Entry:
    """The launcher's claim: a write in place (the status kept, the reason ``rehost``) whose new
    generation only the host it starts may register over; a racing launcher's CAS fails."""
    return entry.moved(entry.status, reason=REHOST)


def rehost(store: MatrixStore, entry: Entry, parent: ProcessIdentity, parent_session: str) -> int:
    """Start a host that takes over ``entry``'s live agent under ``parent``; the new host's pid.
    :class:`ResumeRefused` when there is nothing to rehost or another launcher claimed it."""
    agent = entry.child_process
    if agent is None or not needs_rehost(entry):
        raise ResumeRefused(f"{entry.key}: nothing to rehost (its host lives, or its agent is gone)")
    try:
        claimed = store.update(entry.key, claim_rehost, expected=entry.generation)
    except Conflict:
        raise ResumeRefused(
            f"{entry.key}: changed since it was read; another launcher won ("
            f"{lifecycle.claimed_by(store.find(entry.key))}); nothing was started here"
        ) from None
    contract = LaunchContract(
        parent_pid=parent.pid, parent_start=parent.start_ticks, parent_session=parent_session,
        agent_id=entry.identity.agent_id, task_ref=entry.task_ref, worktree_lane=entry.identity.lane,
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in NEVER_INHERITED}
    env.update(contract.to_env())
    argv = cli_argv(store.root, "host", f"--rehost={entry.key}", f"--rehost-claim={claimed.generation}")
    try:
        child = spawn_detached(
            argv, store.side_dir("logs") / f"{entry.key}.rehost.log", cwd=entry.identity.cwd or "/", env=env
        )
    except OSError as exc:
        with contextlib.suppress(PiMatrixError):
            store.update(
                entry.key,
                lambda e: lifecycle.make_resumable(e, now_ms(), reason="rehost_failed"),
                expected=claimed.generation,
            )
        why = exc.strerror or str(exc)
        raise ResumeRefused(f"{entry.key}: cannot start a host to take its agent over: {why}") from None
    return child.pid
