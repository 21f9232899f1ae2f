"""Relaunching a dead worker into its exact session: the pluggable relauncher.

The default is a detached, headless ``pi-matrix host`` running ``pi -p --session <file> <wake>``
(the tmux launcher arrives with the dispatcher and plugs in here). Either way the launcher
publishes the new host's pid (status ``launching``) before the host registers, fenced by the
generation it observed, so a relaunch that lost a race never overwrites a newer registration.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import suppress
from typing import Final, Protocol

import attrs

from .. import procs
from ..contract import (
    ENV_AGENT_ID,
    ENV_ALLOWED_PATHS,
    ENV_PI_COMMAND,
    ENV_TASK_REF,
    ENV_WORKTREE_LANE,
    NEVER_INHERITED,
)
from ..errors import Conflict, PiMatrixError, ResumeRefused
from ..identity import Mode, ProcessIdentity
from ..matrix import lifecycle
from ..matrix.model import Entry, ResumablePayload, Status, bounded
from ..matrix.store import MatrixStore
from ..programs import host_argv, pi_command, spawn_detached

__all__ = [
    "ENV_PI_COMMAND",
    "DetachedHostRelauncher",
    "Relauncher",
    "ResumeRefused",
    "host_argv",
    "pi_command",
    "spawn_detached",
    "wake_prompt",
]

MAX_WAKE: Final = 2000


class Relauncher(Protocol):
    """Relaunch ``entry`` (resumable, dead) under ``parent``; returns the new host pid."""

    def __call__(self, entry: Entry, parent: ProcessIdentity, parent_session: str) -> int: ...


def wake_prompt(payload: ResumablePayload) -> str:
    """The first prompt of a resumed session: pointers, never a second transcript."""
    identity = payload.identity
    parts = [
        (
            f"[pi-matrix] You are agent {identity.agent_id}, resumed in your own session after "
            f"your process was lost ({payload.reason})."
        ),
    ]
    if payload.task_ref:
        parts.append(f"Task: {payload.task_ref}.")
    if payload.task_summary:
        parts.append(f"Task summary: {bounded(payload.task_summary, 600)}")
    parts.append(f"Latest checkpoint: {payload.checkpoint or 'the last message of this session'}.")
    if identity.resource_pointers:
        parts.append("Context: " + ", ".join(identity.resource_pointers[:8]) + ".")
    parts.append("Re-read what you need, then continue the task from where you stopped.")
    return bounded(" ".join(parts), MAX_WAKE)


def check_resumable(entry: Entry) -> ResumablePayload:
    """The payload to resume from, or :class:`ResumeRefused` saying what is missing."""
    payload = entry.resumable
    if entry.status is not Status.RESUMABLE or payload is None:
        raise ResumeRefused(f"{entry.key}: status {entry.status.value} is not resumable")
    identity = payload.identity
    if not identity.resume_complete:
        raise ResumeRefused(f"{entry.key}: no complete pi context (session file and cwd) to resume from")
    assert identity.session_file is not None and identity.cwd is not None
    if not os.path.isfile(identity.session_file):
        raise ResumeRefused(
            f"{entry.key}: session file {identity.session_file} is gone; it cannot be resumed exactly"
        )
    if not os.path.isdir(identity.cwd):
        raise ResumeRefused(
            f"{entry.key}: working directory {identity.cwd} is gone (pi would stop at a prompt); "
            "restore it or clean the entry up"
        )
    return payload


@attrs.define
class DetachedHostRelauncher:
    """Relaunch as a detached, headless ``pi-matrix host`` (print mode), logging beside the entry."""

    store: MatrixStore
    command: Sequence[str] | None = None

    def build(
        self, entry: Entry, parent: ProcessIdentity, parent_session: str
    ) -> tuple[list[str], dict[str, str], str]:
        """The argv, env and cwd of the relaunch (also what ``--dry-run`` shows)."""
        payload = check_resumable(entry)
        identity = payload.identity
        assert identity.session_file is not None and identity.cwd is not None
        agent = [
            *(self.command or pi_command()),
            "-p",
            "--session",
            identity.session_file,
            wake_prompt(payload),
        ]
        resumed = attrs.evolve(identity, mode=Mode.PRINT, provider=identity.provider or "pi")
        host = host_argv(
            self.store.root, identity=resumed, task_summary=payload.task_summary, task_ref=payload.task_ref,
            lane=identity.lane, rpc_prompt=None, agent_argv=agent, parent=(parent.pid, parent_session),
        )  # fmt: skip
        env = {
            key: value
            for key, value in os.environ.items()
            # The launcher's own contract never passes on: this worker's comes from its payload.
            if key not in NEVER_INHERITED
        }
        env[ENV_AGENT_ID] = identity.agent_id
        env[ENV_ALLOWED_PATHS] = "[]"
        if identity.lane:
            env[ENV_WORKTREE_LANE] = identity.lane
        if payload.task_ref:
            env[ENV_TASK_REF] = payload.task_ref
        return host, env, identity.cwd

    def __call__(self, entry: Entry, parent: ProcessIdentity, parent_session: str) -> int:
        argv, env, cwd = self.build(entry, parent, parent_session)
        # Claim by CAS before starting anything: of two masters relaunching one worker, only the
        # one whose claim lands starts a pi on the session file; the other is told why.
        try:
            claimed = self.store.update(entry.key, lifecycle.claim_launch, expected=entry.generation)
        except Conflict:
            raise ResumeRefused(
                f"{entry.key}: changed since it was read (another master relaunched or adopted it); "
                "look again with 'pi-matrix show KEY'"
            ) from None
        try:
            child = spawn_detached(argv, self.store.side_dir("logs") / f"{entry.key}.log", cwd=cwd, env=env)
        except BaseException:
            with suppress(PiMatrixError):
                self.store.update(entry.key, lifecycle.release_launch, expected=claimed.generation)
            raise
        launched = procs.identify(child.pid)
        if launched is not None:
            # Conflict: the new host registered first; its registration wins, as it should.
            with suppress(Conflict):
                self.store.update(
                    entry.key, lambda e: lifecycle.launched(e, launched), expected=claimed.generation
                )
        return child.pid
