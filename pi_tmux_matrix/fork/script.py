"""The fork's command line and launch script: which of the parent's pi flags and environment a
child inherits (docs/decisions.md#a-fork-inherits-its-parents-pi-not-its-authority), the
``fork.sh`` its pane runs, and the exit marker that script prints.

Pure apart from :func:`parent_argv_from_host`, which reads the caller's host's command line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from .. import procs
from ..contract import (
    ENV_FORK_RESULT_PATH,
    ENV_FORK_RUN_ID,
    ENV_FORK_TASK,
    ENV_HOST_PID,
    FORK_FORCED_ENV,
    FORK_NOT_INHERITED,
)
from ..matrix.model import bounded
from ..settings import ForkSettings

__all__ = [
    "EXIT_MARKER",
    "FORCED_ENV",
    "child_env",
    "child_flags",
    "config_flags",
    "find_exit_code",
    "inherited_flags",
    "launch_script",
    "merge_flags",
    "parent_argv_from_host",
]

EXIT_MARKER: Final = "__PI_FORK_EXIT_{run_id}__:"
# Set last in every child, over the parent's env and pi-fork.environment
# (docs/decisions.md#a-fork-inherits-its-parents-pi-not-its-authority).
FORCED_ENV: Final[Mapping[str, str]] = FORK_FORCED_ENV
# Never inherited: they would make the child speak for its parent (its host, its contract).
NOT_INHERITED: Final = FORK_NOT_INHERITED
# The parent's pi flags a child inherits ("--extension, --skill, --model, --thinking, --provider,
# etc.": docs/decisions.md#a-fork-inherits-its-parents-pi-not-its-authority): flag -> canonical
# spelling. The "etc." is what else keeps the fork a copy of its parent's pi: the same discovery
# switches, prompt templates and model cycle. Never inherited: --api-key (a secret would land in the
# run's argv and record), --tools and --no-tools (the fork's tools are its own),
# --session/--fork/--continue/--resume (the snapshot is its session),
# --system-prompt/--append-system-prompt (the fork gets its own), the output mode.
_INHERITED: Final[Mapping[str, str]] = {
    "--extension": "--extension",
    "-e": "--extension",
    "--skill": "--skill",
    "--model": "--model",
    "--thinking": "--thinking",
    "--provider": "--provider",
    "--prompt-template": "--prompt-template",
    "--models": "--models",
}
_INHERITED_SWITCHES: Final[Mapping[str, str]] = {
    "--no-extensions": "--no-extensions",
    "-ne": "--no-extensions",
    "--no-skills": "--no-skills",
    "-ns": "--no-skills",
    "--no-prompt-templates": "--no-prompt-templates",
    "-np": "--no-prompt-templates",
    "--no-context-files": "--no-context-files",
    "-nc": "--no-context-files",
}
_MANY: Final = frozenset({"--extension", "--skill", "--prompt-template"})  # may be given many times
GO_WAIT_S: Final = 10  # how long a fork pane waits for its launcher's go before giving up
# Left to the pane's own tmux (the caller's may describe another terminal).
_PANE_OWN: Final = frozenset({"TERM", "COLUMNS", "LINES"})
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def inherited_flags(argv: Sequence[str]) -> list[str]:
    """The parent's inheritable flags (:data:`_INHERITED` with their values, ``--flag value`` or
    ``--flag=value``, and the switches of :data:`_INHERITED_SWITCHES`) in order, spelled
    canonically; the rest is dropped."""
    found: list[str] = []
    words = list(argv)
    index = 0
    while index < len(words):
        word = words[index]
        name, eq, value = word.partition("=")
        if name in _INHERITED and eq and name.startswith("--"):
            found += [_INHERITED[name], value]
        elif word in _INHERITED and index + 1 < len(words):
            found += [_INHERITED[word], words[index + 1]]
            index += 1
        elif word in _INHERITED_SWITCHES:
            found.append(_INHERITED_SWITCHES[word])
        index += 1
    return found


def _items(flags: Sequence[str]) -> list[tuple[str, str | None]]:
    """Canonical flags as (flag, value) items; a switch has no value."""
    items: list[tuple[str, str | None]] = []
    words = list(flags)
    index = 0
    while index < len(words):
        if words[index] in _INHERITED_SWITCHES.values():
            items.append((words[index], None))
            index += 1
        else:
            items.append((words[index], words[index + 1] if index + 1 < len(words) else ""))
            index += 2
    return items


def merge_flags(inherited: Sequence[str], extra: Sequence[str]) -> list[str]:
    """``inherited`` then ``extra``; a single-valued flag given in ``extra`` replaces the
    inherited one, and the same extension (skill, switch) is never given twice."""
    extra_items = _items(extra)
    overridden = {flag for flag, value in extra_items if value is not None and flag not in _MANY}
    merged: list[tuple[str, str | None]] = []
    for item in [*(i for i in _items(inherited) if i[0] not in overridden), *extra_items]:
        if item not in merged:
            merged.append(item)
    return [word for flag, value in merged for word in ((flag,) if value is None else (flag, value))]


def config_flags(fork: ForkSettings) -> list[str]:
    """The flags ``pi-fork`` settings give every child: ``defaultModel``, ``defaultThinking``,
    ``extensions``."""
    flags: list[str] = []
    if fork.default_model:
        flags += ["--model", fork.default_model]
    if fork.default_thinking:
        flags += ["--thinking", fork.default_thinking]
    for extension in fork.extensions:
        flags += ["--extension", extension]
    return flags


def child_flags(
    parent_argv: Sequence[str], extra: Sequence[str], bridge: str | None, *, config: Sequence[str] = ()
) -> list[str]:
    """The child's pi flags: the ones it inherits from ``parent_argv``, then the ``pi-fork``
    settings' ``config`` (:func:`config_flags`), then the inheritable ones of ``extra`` (the
    caller's own choice wins over both), then the bridge extension that writes the result."""
    flags = merge_flags(inherited_flags(parent_argv), inherited_flags(config))
    flags = merge_flags(flags, inherited_flags(extra))
    if bridge is not None:
        flags = merge_flags(flags, ["--extension", bridge])
    return flags


def child_env(
    parent: Mapping[str, str], overrides: Mapping[str, str], run: Mapping[str, str]
) -> dict[str, str]:
    """The child's environment: the parent's (minus what would make the child speak for the
    parent), then ``pi-fork.environment`` (its alias ``processMatrix.forkEnvironment`` included),
    then the run's, then :data:`FORCED_ENV`."""
    env = {k: v for k, v in parent.items() if k not in NOT_INHERITED and "\0" not in v}
    env.update({k: v for k, v in overrides.items() if k not in NOT_INHERITED})
    env.update(run)
    env.update(FORCED_ENV)
    return env


def launch_script(
    run_id: str,
    argv: Sequence[str],
    exit_file: str | None = None,
    *,
    env: Mapping[str, str] | None = None,
    go_file: str | None = None,
) -> str:
    """The pane's script: its environment, the wait for the launcher's go, pi, then the exit
    marker on a line of its own (and the code in ``exit_file``: a child that ends before the
    pane's pipe is attached leaves no marker in the log), then wait for Enter (a finished
    background fork stays on screen; the waiter closes a wait-mode pane itself).

    ``env`` is set here, not on tmux's command line, where any user's ``ps`` would show its
    values; the names a child must never inherit are unset (the caller's tmux server may hold
    them in its global environment). pi starts only once ``go_file`` exists: a launcher that
    died between making the pane and recording it leaves a pane that gives up after
    :data:`GO_WAIT_S` seconds, never an unrecorded pi."""
    marker = EXIT_MARKER.format(run_id=run_id)
    keep = f"printf '%s\\n' \"$code\" > {shlex.quote(exit_file)}\n" if exit_file else ""
    lines = ["#!/bin/sh", f"# pi-matrix fork run {run_id}"]
    if env is not None:
        lines += [f"unset {name}" for name in sorted(NOT_INHERITED - {"TMUX", "TMUX_PANE"} - set(env))]
        lines += [
            f"export {name}={shlex.quote(value)}"
            for name, value in env.items()
            if name not in _PANE_OWN and _ENV_NAME.fullmatch(name) and "\0" not in value
        ]
    if go_file is not None:
        go = shlex.quote(go_file)
        lines += [
            "tries=0",
            f"while [ ! -e {go} ]; do",
            f'  tries=$((tries + 1)); if [ "$tries" -gt {GO_WAIT_S * 20} ]; then',
            "    echo '[pi-matrix] the fork was never confirmed by its launcher: nothing was started.'",
            "    exit 125",
            "  fi",
            "  sleep 0.05",
            "done",
        ]
    return (
        "\n".join(lines) + "\n"
        f"{shlex.join(argv)}\n"
        "code=$?\n"
        f"{keep}"
        f"printf '\\n%s%s\\n' {shlex.quote(marker)} \"$code\"\n"
        "printf '%s\\n' '[pi-matrix] fork finished; press Enter to close this pane.'\n"
        "read -r _ || true\n"
        'exit "$code"\n'
    )


def fork_script(
    run_id: str,
    argv: Sequence[str],
    folder: Path,
    *,
    parent_env: Mapping[str, str],
    overrides: Mapping[str, str],
    task: str,
) -> str:
    """The run's ``fork.sh``: :func:`launch_script` with the child's environment (the run's
    result path, id and task on top of the parent's and ``overrides``) and its exit and go files
    in the run's ``folder``."""
    env = child_env(
        parent_env,
        overrides,
        {
            ENV_FORK_RESULT_PATH: str(folder / "result.json"),
            ENV_FORK_RUN_ID: run_id,
            ENV_FORK_TASK: bounded(task, 2000),
        },
    )
    return launch_script(run_id, argv, str(folder / "exit.code"), env=env, go_file=str(folder / "go"))


def find_exit_code(log: str, run_id: str) -> int | None:
    """The code of the run's exit marker in ``log`` (a whole line; ANSI-free by construction of
    the marker line), or None."""
    marker = re.escape(EXIT_MARKER.format(run_id=run_id))
    found = re.findall(rf"(?m)^{marker}(-?[0-9]{{1,4}})\r?$", log)
    return int(found[-1]) if found else None


def parent_argv_from_host(env: Mapping[str, str]) -> list[str] | None:
    """The argv the caller's pi-matrix host runs its agent with (the words after its ``--``).

    pi rewrites its own process title, so its flags are read from the host that started it:
    the one ``PI_MATRIX_HOST_PID`` names, trusted only if it is one of the caller's ancestors."""
    raw = env.get(ENV_HOST_PID, "")
    if not raw.isdigit():
        return None
    for ancestor in procs.ancestors():
        if ancestor.pid != int(raw):
            continue
        words = procs.cmdline(ancestor)
        if not words or "--" not in words:
            return None
        return words[words.index("--") + 1 :]
    return None
