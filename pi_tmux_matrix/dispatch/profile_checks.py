"""The field checks behind launch profiles and team files, and the TOML shape they are read from.

Every check raises :class:`ProfileError` naming the file, the field and the fix. The limits, the
placeholders and the allowed values live here with the checks that hold them; the classes that
run these checks on construction live in :mod:`.profile` and :mod:`.teams`.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterable, Mapping
from typing import Final

from ..contract import CONTRACT_ENV, RESERVED_ENV_PREFIX
from ..errors import InvalidId, ProfileError
from ..identity import Mode, validate_id

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    # mypy runs with python_version 3.10 while the venv (3.11+) has no tomli installed.
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

__all__ = [
    "AGENT_LAUNCHING_TOOLS",
    "CWD_PLACEHOLDER",
    "MAX_DESCRIPTION_CHARS",
    "MAX_EXTENSIONS",
    "MAX_TEXT_CHARS",
    "MAX_WRITE_PATHS",
    "PI_BUILTIN_TOOLS",
    "PI_PROCESS_TOOLS",
    "PROVIDERS",
    "PYTHON_WORD",
    "TASK_WORD",
    "THINKING_LEVELS",
    "WORKTREE_PLACEHOLDER",
    "Checker",
    "as_tuple",
    "check_command",
    "check_deadline",
    "check_env",
    "check_extension_tools",
    "check_mode",
    "check_model",
    "check_tools",
    "check_worktree_lane",
    "check_write_path",
    "kind_of",
    "load_toml",
    "section_of",
    "shown",
    "unknown_keys",
]

PROVIDERS: Final = ("pi", "claude", "codex", "opencode", "agy", "custom")
THINKING_LEVELS: Final = ("off", "minimal", "low", "medium", "high", "xhigh")

# The placeholders a profile may use; the dispatcher fills them per launch.
PYTHON_WORD: Final = "{python}"
TASK_WORD: Final = "{task}"
WORKTREE_PLACEHOLDER: Final = "{worktree}"
CWD_PLACEHOLDER: Final = "{cwd}"

DEADLINE_MIN_S: Final = 1.0
DEADLINE_MAX_S: Final = 86_400.0
MAX_COMMAND_WORDS: Final = 64
MAX_WORD_CHARS: Final = 4096
MAX_TEXT_CHARS: Final = 32_000
MAX_DESCRIPTION_CHARS: Final = 2000
MAX_MODEL_CHARS: Final = 200
MAX_TOOLS: Final = 64
MAX_EXTENSIONS: Final = 32
MAX_WRITE_PATHS: Final = 256  # the contract's cap on PI_WORKER_ALLOWED_PATHS
MAX_ENV: Final = 64
MAX_ENV_VALUE_CHARS: Final = 32_768

ENV_KEY_PATTERN: Final = re.compile(r"[A-Z_][A-Z0-9_]*")
# Tool names are joined with ',' into one --tools value, so a name may not hold one.
TOOL_PATTERN: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
# Tools that start other agents (the master's tmux_agent_manager, the fork tool, pi's subagent
# example): never in a worker's ceiling (docs/decisions.md#a-workers-tools-are-a-ceiling). The
# bridge's envelope.ts keeps the same list.
AGENT_LAUNCHING_TOOLS: Final = frozenset({"tmux_agent_manager", "fork", "subagent"})
# pi's own tools: `allToolNames` in dist/core/tools/index.js of every supported pi (0.73.1 has the
# first seven; 1.x adds `powershell`). tests/test_profiles.py holds this list against the
# installed pi, so a pi that adds one fails there, not silently.
# A pi profile's `tools` may name these and what its own extensions provide (`extension_tools`);
# pi takes any other name in --tools without a word and the worker simply lacks that tool. The
# bridge's own tools (tmux_agent_manager, fork) all launch agents, so no worker ever has them.
PI_BUILTIN_TOOLS: Final = ("read", "bash", "powershell", "edit", "write", "grep", "find", "ls")
# pi's tools that run commands with the user's rights: the envelope never confines them.
PI_PROCESS_TOOLS: Final = frozenset({"bash", "powershell"})
# Authority the dispatcher grants per launch; a profile setting one would forge it.
RESERVED_ENV: Final = CONTRACT_ENV


# --- checks ------------------------------------------------------------------------------------------
def shown(value: object) -> str:
    """A bad value as an error quotes it: its repr, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def kind_of(value: object) -> str:
    """A value's type as an error names it ("a string", "an integer", ...)."""
    return {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}.get(
        type(value), f"a {type(value).__name__}"
    )


class Checker:
    """Raises :class:`ProfileError` for one file and section, so each check is one line."""

    def __init__(self, source: str, section: str) -> None:
        self.source = source
        self.section = section

    def fail(self, field: str, problem: str, fix: str) -> ProfileError:
        return ProfileError(self.source, f"{self.section}.{field}", problem, fix)

    def text(self, value: object, field: str, limit: int, *, empty: bool = True) -> str:
        if not isinstance(value, str):
            raise self.fail(field, f"must be a string, not {kind_of(value)}", f'write it as {field} = "..."')
        if not empty and not value:
            raise self.fail(field, "is empty", "give a value or remove the key")
        if "\0" in value:
            raise self.fail(field, "contains a NUL character", "remove it")
        if len(value) > limit:
            raise self.fail(field, f"is {len(value)} characters long", f"keep it under {limit}")
        return value

    def word(self, value: object, field: str) -> str:
        """An argv word that must not be read as a flag by the CLI it is passed to."""
        text = self.text(value, field, MAX_WORD_CHARS, empty=False)
        if text.startswith("-"):
            raise self.fail(field, f"{shown(text)} starts with '-'", "give the value itself, not a flag")
        return text

    def words(self, value: object, field: str, limit: int) -> tuple[str, ...]:
        if not isinstance(value, tuple):
            raise self.fail(
                field, f"must be a list of strings, not {kind_of(value)}", f'write it as {field} = ["..."]'
            )
        if len(value) > limit:
            raise self.fail(field, f"has {len(value)} items", f"keep at most {limit}")
        for index, item in enumerate(value):
            self.text(item, f"{field}[{index}]", MAX_WORD_CHARS, empty=False)
        return value

    def ident(self, value: object, field: str) -> str:
        try:
            return validate_id(value, field)
        except InvalidId as exc:
            raise self.fail(field, exc.problem, exc.fix) from None


# -a/--approve too: a worker never trusts the project's .pi/ (launch-profiles.md#project-trust).
_PI_AUTHORITY_FLAGS: Final = frozenset(
    {
        "--tools",
        "--no-tools",
        "-nt",
        "--no-builtin-tools",
        "-nbt",
        "-e",
        "--extension",
        "--no-extensions",
        "-ne",
        "--approve",
        "-a",
    }
)


def check_command(check: Checker, value: object, provider: str) -> None:
    command = check.words(value, "command", MAX_COMMAND_WORDS)
    if not command:
        raise check.fail("command", "is empty", 'give the CLI to run, e.g. command = ["pi"]')
    if command[0] == TASK_WORD:
        # The task is untrusted text; it must never become the program that runs.
        raise check.fail("command[0]", "is the {task} placeholder", "start the command with a program")
    if TASK_WORD in command and provider != "custom":
        raise check.fail(
            "command",
            "uses {task} on a known provider",
            f"remove it: the {provider} argv builder places the task",
        )
    for index, word in enumerate(command[1:], start=1):
        # The tool ceiling and the extensions are the profile's own fields, checked there; set in
        # the command words they would slip past those checks (an agent-launching tool, say).
        flag = word.split("=", 1)[0]
        if provider == "pi" and flag in _PI_AUTHORITY_FLAGS:
            raise check.fail(
                f"command[{index}]",
                f"{shown(word)} sets pi's tools, extensions or project trust",
                "use the profile's tools and extensions fields instead",
            )
        if AGENT_LAUNCHING_TOOLS & set(re.split(r"[,= ]", word)):
            raise check.fail(
                f"command[{index}]",
                f"{shown(word)} names a tool that launches agents",
                "remove it: every dispatched agent is a worker",
            )


def check_mode(check: Checker, mode: object, provider: str) -> None:
    if not isinstance(mode, Mode):
        if isinstance(mode, str):
            raise check.fail(
                "mode",
                f"{shown(mode)} is not a mode",
                f"use one of: {', '.join(m.value for m in Mode)}",
            )
        raise check.fail("mode", f"must be a string, not {kind_of(mode)}", 'write it as mode = "interactive"')
    if mode is Mode.RPC and provider != "pi":
        raise check.fail(
            "mode", f"rpc is pi-only, not for provider {provider!r}", 'use mode = "interactive" or "print"'
        )
    if mode is Mode.PRINT and provider == "custom":
        raise check.fail(
            "mode",
            "print needs a known provider's print flag",
            'use mode = "interactive" (a custom command runs as written)',
        )


def check_model(check: Checker, model: object) -> None:
    model = check.word(model, "model")
    if len(model) > MAX_MODEL_CHARS or any(c.isspace() for c in model):
        raise check.fail("model", f"{shown(model)} is not a model id", "give one word, e.g. provider/model")


def check_tools(
    check: Checker, tools: object, provider: str = "pi", extension_tools: tuple[str, ...] = ()
) -> None:
    """``tools``, the ceiling: names only, none that launches agents, and on pi only pi's
    built-in tools and those the profile's extensions provide (``extension_tools``;
    docs/decisions.md#a-workers-tools-are-a-ceiling)."""
    for index, tool in enumerate(_tool_names(check, tools, "tools")):
        if provider == "pi" and tool not in PI_BUILTIN_TOOLS and tool not in extension_tools:
            raise check.fail(
                f"tools[{index}]",
                f"{tool!r} is neither one of pi's built-in tools ({', '.join(PI_BUILTIN_TOOLS)}) "
                "nor named by this profile's extension_tools",
                'remove it, or load the extension that provides it (extensions = ["path/to/ext.ts"]) '
                f'and name the tool there: extension_tools = ["{tool}"]',
            )


def check_extension_tools(check: Checker, names: object, extensions: object) -> None:
    """``extension_tools``: the tools the profile's own extensions provide, as their author
    declares them. pi learns an extension's tools only by running it (a name may be computed, the
    path is relative to a lane that does not exist yet), so the profile says what it loads them for."""
    declared = _tool_names(check, names, "extension_tools")
    if declared and not extensions:
        raise check.fail(
            "extension_tools",
            "names tools, but the profile loads no extension",
            'add the extension that provides them (extensions = ["path/to/ext.ts"]) '
            "or remove extension_tools",
        )


def _tool_names(check: Checker, value: object, field: str) -> tuple[str, ...]:
    names = check.words(value, field, MAX_TOOLS)
    for index, tool in enumerate(names):
        if TOOL_PATTERN.fullmatch(tool) is None:
            raise check.fail(
                f"{field}[{index}]",
                f"{shown(tool)} is not a tool name",
                "use names like read, bash, edit, grep",
            )
        if tool in AGENT_LAUNCHING_TOOLS:
            # Every dispatched agent is a worker, and a worker never launches agents (the
            # bridge also blocks these at run time, whatever the profile says).
            raise check.fail(
                f"{field}[{index}]",
                f"{tool!r} launches agents, which a worker is never granted",
                "remove it; only a master session fires agents",
            )
    return names


def check_deadline(check: Checker, deadline: object) -> None:
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline):
        raise check.fail(
            "deadline", f"must be a number of seconds, not {shown(deadline)}", "write e.g. deadline = 1200"
        )
    if not DEADLINE_MIN_S <= deadline <= DEADLINE_MAX_S:
        raise check.fail(
            "deadline",
            f"{deadline:g} s is outside {DEADLINE_MIN_S:g}..{DEADLINE_MAX_S:g}",
            "give 1 to 86400 seconds (24 h)",
        )


def check_worktree_lane(check: Checker, accepts: object, provider: str) -> None:
    if not isinstance(accepts, bool):
        raise check.fail(
            "accepts_worktree_lane",
            f"must be true or false, not {shown(accepts)}",
            "write accepts_worktree_lane = true",
        )
    if accepts and provider in ("claude", "codex", "opencode", "agy"):
        raise check.fail(
            "accepts_worktree_lane", f"the {provider} CLI has no --worktree-lane flag", "remove it"
        )


def check_write_path(check: Checker, path: str, field: str) -> None:
    rest = path
    for placeholder in (WORKTREE_PLACEHOLDER, CWD_PLACEHOLDER):
        if path == placeholder:
            return
        if path.startswith(placeholder + "/"):
            rest = path[len(placeholder) :]
            break
    fix = 'give an absolute path, "{worktree}", "{cwd}", or one of those followed by /sub/dir'
    if not rest.startswith("/"):
        raise check.fail(field, f"{shown(path)} is relative", fix)
    # '..' would let "{worktree}/../.." reach outside the lane it is meant to confine.
    if any(part in (".", "..") for part in rest.split("/")):
        raise check.fail(field, f"{shown(path)} has a '.' or '..' part", fix)


def check_env(check: Checker, env: object) -> None:
    if not isinstance(env, tuple):
        raise check.fail(
            "env", f"must be a table, not {kind_of(env)}", 'write it as [profile.env] KEY = "value"'
        )
    if len(env) > MAX_ENV:
        raise check.fail("env", f"has {len(env)} variables", f"keep at most {MAX_ENV}")
    seen: set[str] = set()
    for pair in env:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
            raise check.fail(
                "env", f"{shown(pair)} is not a (name, value) pair", 'write [profile.env] KEY = "value"'
            )
        key, value = pair
        if ENV_KEY_PATTERN.fullmatch(key) is None:
            raise check.fail(
                f"env.{key[:60]}", "is not a variable name", "use A-Z 0-9 _ starting with a letter or _"
            )
        if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIX):
            raise check.fail(
                f"env.{key}",
                "is set by the dispatcher for each launch (parent, task, scope, lane, markers)",
                "remove it: a profile cannot grant an agent its authority",
            )
        if key in seen:
            raise check.fail(f"env.{key}", "is set twice", "keep one")
        seen.add(key)
        check.text(value, f"env.{key}", MAX_ENV_VALUE_CHARS)


# --- the TOML shape -----------------------------------------------------------------------------------
def load_toml(text: str, source: str) -> dict[str, object]:
    """The parsed file; bad syntax is a :class:`ProfileError` naming ``source``."""
    try:
        document: dict[str, object] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(
            source, "TOML", f"not valid TOML ({exc})", "fix the syntax at the line shown"
        ) from None
    except RecursionError:
        # tomllib recurses per nesting level: a hostile file must be an error, never a crash.
        raise ProfileError(source, "TOML", "nested too deeply to read", "a profile is a flat table") from None
    return document


def section_of(document: Mapping[str, object], name: str, source: str) -> dict[str, object]:
    """The file's one ``[name]`` table; any other top-level key is refused."""
    for key in document:
        if key != name:
            raise ProfileError(
                source, key, "unknown top-level key", f"a file holds one [{name}] table and nothing else"
            )
    section = document.get(name)
    if not isinstance(section, dict):
        raise ProfileError(
            source,
            name,
            "missing" if section is None else f"must be a table, not {kind_of(section)}",
            f"start the file with [{name}]",
        )
    return section


def unknown_keys(section: Mapping[str, object], allowed: Iterable[str], source: str, prefix: str) -> None:
    """Refuse the first key not in ``allowed`` (a misspelt key must not be silently dropped)."""
    allowed = tuple(allowed)
    for key in section:
        if key not in allowed:
            raise ProfileError(
                source, f"{prefix}.{key}", "unknown key", f"the allowed keys are: {', '.join(allowed)}"
            )


def as_tuple(value: object) -> object:
    # Lists become tuples; anything else is passed through for the checks to name its type.
    return tuple(value) if isinstance(value, list) else value
