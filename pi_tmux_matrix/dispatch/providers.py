"""Each provider's argv: a launch profile plus one task becomes the agent CLI's command line.

Always a list, never a shell string, and the task is one argv word passed verbatim: nothing
here quotes, splits or expands it, so ``; rm -rf ~`` or ``$(id)`` in a task is just text.
The one thing a list cannot protect is the CLI's own option parser, so a task that would be
read as a flag (or, by pi, as an ``@file`` to attach) is refused instead of silently lost.
"""

from __future__ import annotations

import os
import sys
from typing import Final

import attrs

from ..errors import ContractError, ProfileError
from ..identity import Mode, validate_id
from ..piversion import TRUST_FLAGS_SINCE, pi_info, warn_unsupported
from ..programs import agent_argv
from .profile import PYTHON_WORD, TASK_WORD, WorkerLaunchProfile

__all__ = ["MAX_TASK_ARG_BYTES", "AgentCommand", "agent_command"]

# Linux MAX_ARG_STRLEN (32 pages): one longer argv word makes exec fail with E2BIG.
MAX_TASK_ARG_BYTES: Final = 128 * 1024 - 1


@attrs.frozen
class AgentCommand:
    """The agent CLI's argv (what goes after ``pi-matrix host ... --``).

    ``rpc_prompt``: in pi rpc mode the task is not in argv; the host sends it as the first
    ``prompt`` command on the rpc pipe.
    """

    argv: tuple[str, ...]
    rpc_prompt: str | None = None


def _check_task(task: str, provider: str, *, in_argv: bool = True) -> None:
    if not isinstance(task, str):
        raise ContractError("task", f"must be text, not {type(task).__name__}", "give the task as a string")
    if "\0" in task:
        raise ContractError("task", "contains a NUL character", "remove it (an argv word cannot hold NUL)")
    if not in_argv:
        return
    if len(os.fsencode(task)) > MAX_TASK_ARG_BYTES:
        raise ContractError(
            "task",
            f"is {len(os.fsencode(task))} bytes, over the {MAX_TASK_ARG_BYTES}-byte limit of one argument",
            "put the details in a file and give a short task that points at it",
        )
    if provider == "custom":
        return  # a custom command's author knows how it parses its task word
    if task.startswith("-"):
        raise ContractError(
            "task",
            f"starts with '-' (the {provider} CLI would read it as a flag)",
            "start the task with a word",
        )
    if provider == "pi" and task.startswith("@"):
        raise ContractError(
            "task", "starts with '@' (pi reads it as a file to attach)", "start the task with a word"
        )


def agent_command(
    profile: WorkerLaunchProfile,
    *,
    task: str | None,
    session_file: str | None,
    lane: str | None = None,
    python: str = sys.executable,
) -> AgentCommand:
    """Build one launch's argv. ``session_file`` and ``lane`` are used by pi (and ``lane`` by a
    custom command that takes ``--worktree-lane``); the other CLIs keep their own sessions."""
    if lane is not None:
        validate_id(lane, "lane")
    if session_file is not None and not os.path.isabs(session_file):
        raise ContractError("sessionFile", f"{session_file[:60]!r} is relative", "give an absolute path")
    if task is None and profile.mode is Mode.PRINT:
        raise ContractError(
            "task",
            f"missing for print-mode profile {profile.name!r}",
            "give a task (print mode does one turn)",
        )
    base = [python if word == PYTHON_WORD else word for word in profile.command]
    rpc_prompt: str | None = None
    provider = profile.provider
    if provider == "pi":
        argv, rpc_prompt = _pi(profile, base, task, session_file, lane)
    elif provider == "custom":
        argv = _custom(profile, base, task, lane)
    else:
        if task is not None:
            _check_task(task, provider)
        argv = _other(profile, base, task)
    if task is not None and len(argv) < 2:
        # tmux runs a one-word command through `sh -c`: the task would become shell code.
        raise ProfileError(
            profile.source,
            "profile.command",
            f"builds a one-word argv {argv!r} for a task",
            "give the command at least a program and one argument",
        )
    return AgentCommand(argv=tuple(argv), rpc_prompt=rpc_prompt)


def _pi(
    profile: WorkerLaunchProfile,
    argv: list[str],
    task: str | None,
    session_file: str | None,
    lane: str | None,
) -> tuple[list[str], str | None]:
    # Read before any flag is added: the command alone names the pi (its package.json; no
    # process is started for it).
    info = pi_info(agent_argv(argv), ask=False)
    warn_unsupported(info)
    if profile.mode is Mode.RPC:
        argv += ["--mode", "rpc"]
    elif profile.mode is Mode.PRINT:
        argv.append("-p")
    if session_file is not None:
        argv += ["--session", session_file]
    if profile.model is not None:
        argv += ["--model", profile.model]
    if profile.thinking is not None:
        argv += ["--thinking", profile.thinking]
    if profile.tools is not None:
        argv += ["--tools", ",".join(profile.tools)] if profile.tools else ["--no-tools"]
    # No discovered extensions: a worker could have planted one in the project's .pi/
    # (docs/decisions.md#workers-load-only-the-code-they-name). The bridge and the profile's own
    # come with -e.
    argv.append("--no-extensions")
    # Nor is the project trusted (pi >= 0.79 asks "Trust project folder?" before it loads
    # .pi/settings.json, skills, prompts, SYSTEM.md, mcp.json or extensions, and an unanswered
    # dialog would hold the worker forever): a worker never loads project-local pi resources,
    # as the envelope never lets it load .pi/ code. AGENTS.md context files are not trust-gated
    # and still load. An older pi has no dialog and no flag; a pi whose version cannot be read
    # is answered by the bridge instead (PI_MATRIX_PROJECT_TRUST=no, see plugin.py).
    if info.knows(TRUST_FLAGS_SINCE):
        argv.append("--no-approve")
    for extension in profile.extensions:
        argv += ["-e", extension]
    if profile.append_system_prompt is not None:
        argv += ["--append-system-prompt", profile.append_system_prompt]
    if profile.accepts_worktree_lane and lane is not None:
        argv += ["--worktree-lane", lane]
    if task is None:
        return argv, None
    if profile.mode is Mode.RPC:
        _check_task(task, "pi", in_argv=False)
        return argv, task
    _check_task(task, "pi")
    argv.append(task)
    return argv, None


def _other(profile: WorkerLaunchProfile, argv: list[str], task: str | None) -> list[str]:
    """claude, codex, opencode and agy: each CLI's own interactive and one-shot forms."""
    provider = profile.provider
    printing = profile.mode is Mode.PRINT
    if printing:
        argv += {"claude": ["-p"], "codex": ["exec"], "opencode": ["run"], "agy": []}[provider]
    if profile.model is not None:
        argv += ["--model", profile.model]
    if task is not None:
        # opencode's TUI and agy take their first prompt through a flag (agy has no positional
        # prompt: --prompt-interactive runs it, then stays interactive; -p runs it and exits).
        if provider == "opencode" and not printing:
            argv.append("--prompt")
        elif provider == "agy":
            argv.append("-p" if printing else "--prompt-interactive")
        argv.append(task)
    return argv


def _custom(profile: WorkerLaunchProfile, words: list[str], task: str | None, lane: str | None) -> list[str]:
    if task is not None:
        _check_task(task, "custom")
    has_slot = TASK_WORD in words
    argv = (
        [w for w in words if w != TASK_WORD]
        if task is None
        else [task if w == TASK_WORD else w for w in words]
    )
    if profile.accepts_worktree_lane and lane is not None:
        at = len(argv)
        argv[at:at] = ["--worktree-lane", lane]
    if task is not None and not has_slot:
        argv.append(task)
    return argv
