"""What a caller asks of ``fire`` (:class:`FireRequest`) and the checks on each field, made before
anything is reserved or started: the task, the deadline, the folder, the launch key, the names
derived from them."""

from __future__ import annotations

import hashlib
import os
import re
from typing import TYPE_CHECKING, Final

import attrs

from ..contract import DEFAULT_SOCKET
from ..errors import ContractError
from ..identity import ID_MAX, ID_PATTERN, validate_id
from . import TMUX
from .model import MAX_ROUND

if TYPE_CHECKING:
    from .adhoc import AdHocAgent

__all__ = [
    "LAUNCH_KEY",
    "MAX_DEADLINE_S",
    "MAX_TASK_BYTES",
    "MIN_DEADLINE_S",
    "USAGE_LINE",
    "FireRequest",
    "agent_id_of",
    "check_task",
    "check_workspace",
    "cwd_of",
    "deadline_of",
    "job_id_of",
    "launch_job_id",
    "marker_instruction",
    "window_name",
    "workspace_field",
]


MIN_DEADLINE_S: Final = 1.0
# The origin's launch keys: a stable job id a caller chooses (letters, digits, _ . : -).
LAUNCH_KEY: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{3,79}")

MAX_TASK_BYTES: Final = 32 * 1024
MAX_DEADLINE_S: Final = 24 * 3600.0


@attrs.frozen
class FireRequest:
    task: str
    profile: str | None = None
    team: str | None = None
    lane: str | None = None
    goal_id: str | None = None
    path: str | None = None
    socket: str = DEFAULT_SOCKET
    deadline_s: float | None = None
    backend: str = TMUX
    dry_run: bool = False
    parent_pid: int | None = None
    parent_session: str | None = None
    agent_id: str | None = None
    # Ad-hoc agents described in the fire itself (the origin's agents[]), instead of a profile or team.
    agents: tuple[AdHocAgent, ...] = ()
    # A stable job id the caller chooses (the origin's launchKey); ``force`` archives the record
    # of an earlier job with that id (its live panes are never touched).
    launch_key: str | None = None
    force: bool = False
    # The tmux session the agents' windows go in (the origin's workspaceName); a fresh one.
    workspace: str | None = None
    # False: a workspace (launch_workspace): the agents are the tiled panes of one window of the
    # fresh session ``workspace``, run interactively, with no watcher, deadline or marker; the task
    # is optional (without one they start idle).
    watched: bool = True
    # How long fire waits for every host to report its agent started (or failed to). 0, the
    # default: not at all (a series of fires must not wait on each start in turn:
    # docs/decisions.md#fires-do-not-wait-for-starts); a failed start still reaches the job and
    # ``show`` (dispatch/confirm.py says how).
    # Bounded when asked, so a slow machine costs a warning in the record, never a hang.
    confirm_s: float = 0.0


# The line naming a round's usage claim file (the pi bridge reads it from the prompt it ran).
USAGE_LINE: Final = "[pi-matrix] usage file "


def marker_instruction(nonce: str, usage_file: str | None = None) -> str:
    """How an agent is told to end: the marker itself never appears in the text, so an echo of
    the instruction cannot be taken for the agent's answer. With ``usage_file``, where it may
    claim the round's usage first (optional and advisory; the pi bridge writes it for pi)."""
    text = (
        f"When you are finished, print a line holding only DONE, a colon and the code {nonce} "
        f"(no spaces). If you cannot go on, print BLOCKED, a colon and {nonce}, then a space and "
        "the reason, on a line of its own."
    )
    if usage_file is None:
        return text
    return (
        f"{text} Optionally, before that line, claim this round's token usage by writing JSON "
        'such as {"totalTokens": 1234, "cost": {"total": 0.05}} to the file named below.\n'
        f"{USAGE_LINE}{usage_file}"
    )


def agent_id_of(job_id: str, agent_id: str) -> str:
    """A valid agent id short enough that every name derived from it (the result record
    ``<job>.<agent>.<round>``) is a valid id too: checked before anything is written."""
    validate_id(agent_id, "--agent-id")
    room = ID_MAX - len(f"{job_id}..{MAX_ROUND}")
    if len(agent_id) > room:
        raise ContractError(
            "--agent-id",
            f"{agent_id[:40]!r}... is {len(agent_id)} characters (a team adds its suffix)",
            f"use at most {room} characters: its result records are named <job>.<agent>.<round>",
        )
    return agent_id


def window_name(agent_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "-", agent_id)[:40]


def workspace_field(request: FireRequest) -> str:
    """The flag that names the workspace session: ``workspace``'s ``--name``, ``fire``'s ``--workspace``."""
    return "--workspace" if request.watched else "--name"


def check_workspace(request: FireRequest) -> None:
    """A workspace is one fresh tmux session: it needs its name and the tmux backend."""
    if request.workspace is None:
        raise ContractError("--name", "missing", "name the tmux session the workspace opens")
    if request.backend != TMUX:
        raise ContractError(
            "--backend", f"{request.backend!r} has no panes", "a workspace runs in tmux: drop --backend"
        )


def check_task(task: str) -> str:
    if not task.strip():
        raise ContractError("TASK", "empty", "give the task after --")
    if len(task.encode("utf-8", "surrogatepass")) > MAX_TASK_BYTES:
        raise ContractError(
            "TASK", f"over {MAX_TASK_BYTES} bytes", "put long context in a file and point to it"
        )
    if "\x00" in task:
        raise ContractError("TASK", "contains a NUL byte", "remove it (argv cannot carry NUL)")
    return task


def deadline_of(request: FireRequest, profile_deadline: float) -> float:
    deadline = request.deadline_s if request.deadline_s is not None else profile_deadline
    if not (MIN_DEADLINE_S <= deadline <= MAX_DEADLINE_S):
        raise ContractError(
            "--deadline", f"{deadline:g}s is outside 1..{MAX_DEADLINE_S:.0f}", "give seconds, at most 24 h"
        )
    return float(deadline)


def cwd_of(request: FireRequest) -> str:
    path = request.path or os.getcwd()
    real = os.path.realpath(path)
    if not os.path.isdir(real):
        raise ContractError("--path", f"{path} is not a directory", "give an existing folder for the agents")
    return real


def job_id_of(request: FireRequest) -> str | None:
    """The job id a launch key names, always the same one (None: a fresh generated id)."""
    return None if request.launch_key is None else launch_job_id(request.launch_key)


def launch_job_id(key: str) -> str:
    """The job id of launch key ``key`` (``fire --launch-key``; a job verb may name the job by it)."""
    if not LAUNCH_KEY.fullmatch(key):
        raise ContractError(
            "--launch-key",
            f"{key[:90]!r} is not a launch key",
            "use 4-80 letters, digits, '_', '.', ':' or '-', starting with a letter or digit",
        )
    if ID_PATTERN.fullmatch(key):
        return key
    # ':' names no file here: the key is kept readable, made a file-safe id, and told apart from
    # every other key by a digest of the whole key.
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{key.replace(':', '.')}-{digest}"
