"""Ad-hoc agents (the origin's ``fire_task`` ``agents[]``): agents described in the fire itself,
without a profile file.

Each entry becomes a :class:`.profile.WorkerLaunchProfile` built here and checked by the profile's
own checks, so an ad-hoc agent can never carry what a profile file could not: the pi-only fields
(``tools``, ``resourceProfile``, ``thinkingLevel``) are refused on other providers, and
``worktreeLane`` wherever a profile's ``accepts_worktree_lane`` is. Every error names the entry and
its parameter (``agents[1].tools``) the way the caller wrote it.

An ad-hoc ``command`` is a string split into words the way a shell would split them, but no shell
ever runs it: one that needs a shell (a pipe, a redirection, ``$VAR``, a glob) is refused.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Final

import attrs

from ..errors import ContractError, ProfileError
from ..identity import Mode, validate_id
from .profile import PROVIDERS, Checker, WorkerLaunchProfile, check_worktree_lane

__all__ = ["MAX_AGENTS", "AdHocAgent", "parse_agents", "split_command"]

MAX_AGENTS: Final = 12  # the origin's limit per fire
PROFILE_PREFIX: Final = "adhoc."  # an ad-hoc agent's profile name: never a profile file's
DEFAULT_DEADLINE_S: Final = 1200.0

# The origin's camelCase name (and today's snake_case alias) -> our field.
_KEYS: Final[dict[str, str]] = {
    "provider": "provider",
    "name": "name",
    "command": "command",
    "path": "path",
    "cwd": "cwd",
    "tools": "tools",
    "resourceProfile": "resource_profile",
    "resource_profile": "resource_profile",
    "thinkingLevel": "thinking",
    "thinking_level": "thinking",
    "worktreeLane": "worktree_lane",
    "worktree_lane": "worktree_lane",
}
# A profile field (as its checks name it) -> the parameter the caller wrote.
_PARAM_OF: Final[dict[str, str]] = {
    "name": "name",
    "provider": "provider",
    "command": "command",
    "tools": "tools",
    "resource_profile": "resourceProfile",
    "thinking": "thinkingLevel",
    "write_paths": "path",
    "accepts_worktree_lane": "worktreeLane",
    "worktree_lane": "worktreeLane",
}
# Unquoted, these mean something only to a shell; run without one they would silently differ.
_OPERATORS: Final = frozenset("|&;<>()\n")
_GLOBS: Final = frozenset("*?[")


@attrs.frozen
class AdHocAgent:
    """One ``agents[]`` entry, read; :meth:`profile` checks it against the profile rules."""

    index: int
    provider: str
    name: str
    command: tuple[str, ...]
    path: str | None = None
    cwd: str | None = None  # the origin's legacy folder: the agent runs there, nothing is narrowed
    tools: tuple[str, ...] | None = None
    resource_profile: str | None = None
    thinking: str | None = None
    worktree_lane: str | None = None

    @property
    def field(self) -> str:
        return f"agents[{self.index}]"

    @property
    def folder(self) -> tuple[str, str] | None:
        """(its own folder, the parameter that named it), if it has one."""
        if self.path is not None:
            return self.path, f"{self.field}.path"
        return None if self.cwd is None else (self.cwd, f"{self.field}.cwd")

    def profile(self) -> WorkerLaunchProfile:
        """The launch profile this agent runs under (checked exactly as a profile file is)."""
        is_pi = self.provider == "pi"
        try:
            if self.worktree_lane is not None:
                check_worktree_lane(Checker(self.field, "profile"), True, self.provider)
            return WorkerLaunchProfile(
                name=f"{PROFILE_PREFIX}{self.name}",
                provider=self.provider,
                command=self.command,
                description=f"ad-hoc agent {self.name}",
                mode=Mode.INTERACTIVE,
                tools=self.tools,
                resource_profile=self.resource_profile,
                thinking=self.thinking,
                # The origin's pi path narrows pi's file tools to the agent's folder.
                write_paths=("{cwd}",) if is_pi and self.path is not None else None,
                deadline_s=DEFAULT_DEADLINE_S,
                source=self.field,
            )
        except ProfileError as exc:
            raise self._renamed(exc) from None

    def _renamed(self, exc: ProfileError) -> ContractError:
        """The profile check's error, naming this entry's parameter instead of a TOML key."""
        field = exc.field.split(": ", 1)[-1].removeprefix("profile.")
        key = field.split("[", 1)[0].split(".", 1)[0]
        param = _PARAM_OF.get(key, key)
        fix = exc.fix
        if "pi-only field" in exc.problem:
            fix = f"{fix}; configure the {self.provider} CLI itself through command instead"
        return ContractError(f"{self.field}.{param}", exc.problem, fix)


def split_command(text: str, field: str) -> tuple[str, ...]:
    """``text`` as argv words, split as a shell would but never run by one; refused when its
    meaning needs a shell (an operator, an expansion, a glob, a comment, an unclosed quote)."""
    why = _shell_meaning(text)
    if why is not None:
        raise _needs_shell(field, text, why)
    try:
        words = tuple(shlex.split(text, posix=True))
    except ValueError as exc:
        raise _needs_shell(field, text, str(exc).lower()) from None
    if not words:
        raise ContractError(field, "is empty", 'give the CLI to run, e.g. "claude --model sonnet"')
    return words


def _shell_meaning(text: str) -> str | None:
    """Why a shell would read ``text`` otherwise than as plain words (None: it would not)."""
    quote = ""
    escaped = False
    at_word_start = True
    brace = ""  # the unquoted text since an unquoted "{" in this word (bash's {a,b} and {1..3})
    for char in text:
        if escaped:
            escaped, at_word_start = False, False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote:
            if char == quote:
                quote = ""
            elif quote == '"' and char in "$`":
                return f"{char!r} would expand"
        elif char in "'\"":
            quote, at_word_start = char, False
        else:
            if brace and char == "}" and ("," in brace or ".." in brace):
                return f"'{brace}}}' would be a brace expansion"
            brace = "{" if char == "{" else "" if (char in " \t}" or not brace) else brace + char
            why = _unquoted(char, at_word_start=at_word_start)
            if why is not None:
                return why
            at_word_start = char in " \t"
    return None


def _unquoted(char: str, *, at_word_start: bool) -> str | None:
    if char in _OPERATORS:
        return f"{char!r} is a shell operator"
    if char in "$`":
        return f"{char!r} would expand"
    if char in _GLOBS:
        return f"{char!r} would be a glob"
    if at_word_start and char in "~#":
        return f"{char!r} at a word's start means something to a shell"
    return None


def _needs_shell(field: str, text: str, why: str) -> ContractError:
    shown = text if len(text) <= 60 else text[:57] + "..."
    return ContractError(
        field,
        f"{shown!r} needs a shell ({why}); no shell ever runs an agent's command",
        "give plain words (quote a word with spaces), or put the pipeline in a script and give its path",
    )


def parse_agents(raw: object) -> tuple[AdHocAgent, ...]:
    """The ``agents[]`` list (parsed JSON) as :class:`AdHocAgent` values, every entry checked
    (its profile too) before anything is made."""
    if not isinstance(raw, Sequence) or isinstance(raw, (str, bytes)):
        raise ContractError("agents", f"must be a list of objects, not {type(raw).__name__}", "give [{...}]")
    if not 1 <= len(raw) <= MAX_AGENTS:
        raise ContractError("agents", f"has {len(raw)} entries", f"give 1 to {MAX_AGENTS} agents")
    agents = tuple(_agent(index, entry) for index, entry in enumerate(raw))
    seen: set[str] = set()
    for agent in agents:
        if agent.name in seen:
            raise ContractError(
                f"{agent.field}.name", f"{agent.name!r} is used twice", "give each agent its own name"
            )
        seen.add(agent.name)
        agent.profile()
    return agents


def _agent(index: int, entry: object) -> AdHocAgent:
    where = f"agents[{index}]"
    if not isinstance(entry, Mapping):
        raise ContractError(where, f"must be an object, not {type(entry).__name__}", 'give {"provider": ...}')
    values: dict[str, object] = {}
    for key, value in entry.items():
        if key not in _KEYS:
            allowed = ", ".join(k for k in _KEYS if "_" not in k and k != "cwd")
            raise ContractError(f"{where}.{key}", "unknown parameter", f"the parameters are: {allowed}")
        if value is not None:
            values[_KEYS[key]] = value
    provider = values.get("provider", "custom")  # the origin's default
    if provider not in PROVIDERS:
        raise ContractError(
            f"{where}.provider", f"{provider!r} is not a provider", f"use one of: {', '.join(PROVIDERS)}"
        )
    name = validate_id(values.get("name", f"{provider}-{index + 1}"), f"{where}.name")
    command = values.get("command")
    if command is None:
        if provider == "custom":
            raise ContractError(f"{where}.command", "missing for provider custom", "give the CLI to run")
        words: tuple[str, ...] = (str(provider),)
    elif isinstance(command, str):
        words = split_command(command, f"{where}.command")
    else:
        raise ContractError(f"{where}.command", f"must be a string, not {type(command).__name__}", "give one")
    return AdHocAgent(
        index=index,
        provider=str(provider),
        name=name,
        command=words,
        path=_text(values, "path", where),
        cwd=_text(values, "cwd", where),
        tools=_tools(values, where),
        resource_profile=_text(values, "resource_profile", where),
        thinking=_text(values, "thinking", where),
        worktree_lane=_text(values, "worktree_lane", where),
    )


def _text(values: Mapping[str, object], key: str, where: str) -> str | None:
    value = values.get(key)
    if value is None or isinstance(value, str):
        return value
    param = _PARAM_OF.get(key, key)
    raise ContractError(f"{where}.{param}", f"must be a string, not {type(value).__name__}", "give text")


def _tools(values: Mapping[str, object], where: str) -> tuple[str, ...] | None:
    tools = values.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list) or not all(isinstance(t, str) for t in tools):
        raise ContractError(f"{where}.tools", "must be a list of tool names", 'give e.g. ["read", "grep"]')
    return tuple(tools)
