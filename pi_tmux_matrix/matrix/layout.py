"""The state dir's names, and whether it holds anything to list: importable without the model.

A person's first ``pi-matrix ls`` (an empty or absent state dir) answers from here alone, without
loading attrs, the entry model or the store (about half of that command's start-up).
:mod:`.statedir` re-exports the names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Final

from .fsio import opened_dir

__all__ = [
    "LOCKS",
    "MAILBOX",
    "PIPES",
    "QUARANTINE",
    "RESERVED_DIRS",
    "SUFFIX",
    "TMP_SUFFIX",
    "inbox_name",
    "lists_nothing",
    "notices_name",
    "pipe_name",
    "pipe_prefix",
]

SUFFIX: Final = ".json"
TMP_SUFFIX: Final = ".json.tmp"
LOCKS: Final = "locks"
QUARANTINE: Final = "quarantine"
MAILBOX: Final = "mailbox"
PIPES: Final = "pipes"  # the FIFOs a tmux agent's host reads its pane from (pipe_name: one per host)
# Sub-directories the matrix itself keeps beside the entries; never reported as foreign.
RESERVED_DIRS: Final = frozenset(
    {
        LOCKS,
        QUARANTINE,
        "events",
        MAILBOX,
        "results",
        "runs",
        "jobs",
        "logs",
        "artifacts",
        "launches",
        "archived-jobs",
        "archived-results",
        "variables",
        PIPES,
    }
)


def inbox_name(key: str) -> str:
    """The host's command queue of ``key``, a folder under ``mailbox/``."""
    return key


def pipe_name(job_id: str, agent_id: str, host_pid: int) -> str:
    """The FIFO under ``pipes/`` the host ``host_pid`` reads its job agent's pane from. One per
    host, not per agent: after ``fire --force`` the archived job's host (still running, its pane
    left alone) and the new one share the job id and the agent id, and a shared name let each
    remove the other's FIFO (a pane pipe opening it then waited for good)."""
    return f"{pipe_prefix(job_id, agent_id)}{host_pid}.fifo"


def pipe_prefix(job_id: str, agent_id: str) -> str:
    """What every :func:`pipe_name` of that job agent starts with, whichever host made it."""
    return f"{job_id}.{agent_id}."


def notices_name(key: str) -> str:
    """The agent's notices of ``key`` (``PI_MATRIX_MAILBOX``), a file under ``mailbox/``."""
    return f"{key}.agent.jsonl"


def lists_nothing(root: Path) -> bool:
    """Whether a listing of ``root`` would show no entry and report no file: the state dir is
    absent, or holds only writes in flight (dot files) and the matrix's own sub-directories.

    Opened with the store's own checks, so an unsafe state dir is refused here word for word as
    the store refuses it.
    """
    with opened_dir(root, create=False) as root_fd:
        if root_fd is None:
            return True
        with os.scandir(root_fd) as scan:
            for item in scan:
                if item.name.startswith("."):
                    continue
                if item.name in RESERVED_DIRS and item.is_dir(follow_symlinks=False):
                    continue
                return False
    return True
