"""The command lines of the product's own programs, and the one way a detached one is started.

Every process the product starts of itself (an agent's host, a job's watcher, a fork's finisher)
is ``python -m pi_tmux_matrix [--state-dir D] VERB …``: one interpreter, one entry point, so a
hidden verb is all a new program needs. The argv is a list, never a shell string.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from . import strictjson
from .contract import ENV_PI_COMMAND
from .errors import ContractError
from .identity import AgentIdentityContract
from .launch_contract import ALLOWED_PATHS_MAX_BYTES as ENV_JSON_MAX_BYTES
from .matrix.fsio import open_append
from .matrix.model import bounded

__all__ = [
    "agent_argv",
    "cli_argv",
    "finisher_argv",
    "host_argv",
    "pi_command",
    "spawn_detached",
]


def cli_argv(state_dir: Path | str | None, *words: str, python: str = sys.executable) -> list[str]:
    """``pi-matrix [--state-dir D] WORDS…`` as this interpreter runs it (no PATH lookup)."""
    argv = [python, "-m", "pi_tmux_matrix"]
    if state_dir is not None:
        argv += ["--state-dir", str(state_dir)]
    return [*argv, *words]


def pi_command(env: Mapping[str, str] | None = None) -> list[str]:
    """The argv prefix that runs pi: ``$PI_MATRIX_PI_COMMAND`` (a JSON array) or ``["pi"]``.

    The one place the variable is read: every start of pi (a profile's, a master's or host's
    ``-- pi``, a resume, a fork, the demo) goes through here or :func:`agent_argv`."""
    source = os.environ if env is None else env
    raw = source.get(ENV_PI_COMMAND)
    if not raw:
        return ["pi"]
    try:
        # Strict and bounded like every JSON the CLI takes: 2,000 "[" is a usage error, never a
        # RecursionError's traceback. An argv prefix is one flat list.
        value = strictjson.loads(raw, max_bytes=ENV_JSON_MAX_BYTES, max_depth=2)
    except strictjson.StrictJSONError:
        value = None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise ContractError(
            ENV_PI_COMMAND,
            f"{raw[:80]!r} is not a JSON array of strings",
            f"set it like {ENV_PI_COMMAND}='[\"/usr/bin/pi\"]', or unset it",
        )
    return list(value)


def agent_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> list[str]:
    """``argv`` as it is started: a plain ``pi`` (``-- pi …``) becomes :func:`pi_command`'s
    prefix, so ``$PI_MATRIX_PI_COMMAND`` is honoured wherever pi starts; anything else as given."""
    if not argv or argv[0] != "pi":
        return list(argv)
    command = pi_command(env)
    if list(argv[: len(command)]) == command:
        return list(argv)  # resolved already (a profile's command), as by a command ["pi", "--offline"]
    return [*command, *argv[1:]]


def host_argv(
    state_dir: Path,
    *,
    identity: AgentIdentityContract,
    task_summary: str,
    task_ref: str | None,
    lane: str | None,
    rpc_prompt: str | None,
    agent_argv: Sequence[str],
    ticket: str | None = None,
    job: tuple[str, str] | None = None,
    python: str = sys.executable,
) -> list[str]:
    """``pi-matrix host …`` for one agent. The parent and the allowed-paths envelope come through
    the env contract (every launch's env is composed by the plugins' ``launch_env``); ``ticket``
    is the launch's ticket (``matrix.tickets``), taken by the host before it starts anything;
    ``job`` (job id, agent id) makes the host watch that job agent's marker rounds itself."""
    # Every value goes as --flag=VALUE: a task summary (or a path) that starts with "-" must
    # never be read as a flag by the host's parser.
    values: list[tuple[str, str | None]] = [
        ("--session-id", identity.session_id),
        ("--agent-id", identity.agent_id),
        ("--cwd", identity.cwd or os.getcwd()),
        ("--mode", identity.mode.value if identity.mode else "interactive"),
        ("--task-summary", bounded(task_summary, 400)),
        ("--profile", identity.profile or None),
        ("--provider", identity.provider or None),
        ("--session-file", identity.session_file or None),
        ("--worktree", identity.worktree or None),
        ("--worktree-lane", lane or None),
        ("--task-ref", task_ref or None),
        ("--rpc-prompt", rpc_prompt),
        ("--launch-ticket", ticket),
        ("--job", job[0] if job else None),
        ("--job-agent", job[1] if job else None),
    ]
    values += [("--resource", pointer) for pointer in identity.resource_pointers]
    argv = cli_argv(state_dir, "host", python=python)
    argv += [f"{flag}={value}" for flag, value in values if value is not None]
    return [*argv, "--", *agent_argv]


def agent_argv_of(argv: Sequence[str]) -> list[str]:
    """The agent's own argv in a :func:`host_argv` (what follows its ``--``)."""
    words = list(argv)
    return words[words.index("--") + 1 :] if "--" in words else []


def finisher_argv(
    state_dir: Path,
    run_id: str,
    *,
    watch: tuple[int, int] | None = None,
    notify: bool = True,
    python: str = sys.executable,
) -> list[str]:
    """A fork run's finisher (``pi-matrix runs RUN --wait --keep-pane``), in its own session: waits
    for the end and records it; for a background run it tells the parent (``notify``), for a
    waited one it watches the waiter (``watch``: pid, start ticks) and stops the fork if the waiter
    dies first."""
    argv = cli_argv(state_dir, "runs", run_id, "--wait", "--keep-pane", python=python)
    if notify:
        argv.append("--notify")
    if watch is not None:
        argv += ["--watch", f"{watch[0]}:{watch[1]}"]
    return argv


def spawn_detached(
    argv: Sequence[str], log_path: Path, *, cwd: str | None = None, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (a list, never a shell) in its own session with no stdin, its output appended
    to ``log_path`` (0600, never through a symlink): a process that outlives whoever started it."""
    fd = open_append(log_path)  # never a symlink, never blocking on a FIFO planted at its name
    try:
        os.set_blocking(fd, True)
        return subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=fd,
            stderr=fd,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(fd)
