"""Relaunching a dead worker into its exact session: what the master needs to know of it.

The master is handed a :class:`Relauncher` by its program (``pi-matrix master`` passes the
dispatcher's ``relaunch`` hook, whose matrix implementation is :func:`pi_tmux_matrix.resume.relaunch`:
the same launch door as every fire, so the bridge and the envelope come from the worker's recorded
profile). Here stay the pure parts: which entries can be resumed and the wake prompt. The launcher
claims the entry (``launching``, by CAS) before it starts anything and publishes the new host's
pid fenced by its claim, so a relaunch that lost a race never starts a second agent.
"""

from __future__ import annotations

import os
from typing import Final, Protocol

from .. import pisession
from ..errors import ResumeRefused
from ..identity import ProcessIdentity
from ..matrix.model import Entry, ResumablePayload, Status, bounded

__all__ = [
    "Relauncher",
    "transcript_lost",
    "wake_prompt",
]

MAX_WAKE: Final = 2000


class Relauncher(Protocol):
    """Relaunch ``entry`` (resumable, dead) under ``parent``; returns the new host pid."""

    def __call__(self, entry: Entry, parent: ProcessIdentity, parent_session: str) -> int: ...


def transcript_lost(payload: ResumablePayload) -> bool:
    """The worker's session holds no transcript: no file was written, it is gone, or it holds only
    its header (the agent died before its first turn). It is relaunched as the same agent, told
    to start the task again from its summary."""
    return not pisession.has_transcript(payload.identity.session_file)


def wake_prompt(payload: ResumablePayload) -> str:
    """The first prompt of a resumed session: pointers, never a second transcript."""
    identity = payload.identity
    if transcript_lost(payload):
        first = (
            f"[pi-matrix] You are agent {identity.agent_id}, relaunched after your process was lost "
            f"({payload.reason}). Your session holds no transcript (it ended before one was written), "
            "so start the task again from its summary."
        )
    else:
        first = (
            f"[pi-matrix] You are agent {identity.agent_id}, resumed in your own session after "
            f"your process was lost ({payload.reason})."
        )
    parts = [first]
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
    if not identity.relaunchable:
        what = "not a pi agent" if not identity.is_pi else "no working directory recorded"
        raise ResumeRefused(f"{entry.key}: {what}; only a pi agent with its cwd can be relaunched")
    assert identity.cwd is not None
    if not os.path.isdir(identity.cwd):
        raise ResumeRefused(
            f"{entry.key}: working directory {identity.cwd} is gone (pi would stop at a prompt); "
            "restore it or clean the entry up"
        )
    return payload
