"""Launch profiles and team templates: which agent CLI the dispatcher starts, and how.

A profile is one TOML file (``[profile]``), a team one file under ``teams/`` (``[team]``).
The shipped ones live in the resource package ``pi_tmux_matrix.launch_profiles``; files in
``<agent dir>/launch_profiles/`` override them by name. Loading is strict: the first broken
file raises :class:`ProfileError` naming the file, the field and the fix, because a profile
that silently lost a field (say ``write_paths``) would launch an agent with more reach than
its author meant.

A profile never carries authority: the parent, the task ref, the write envelope and the
markers come from the dispatcher, so a profile may not set those env variables.

Top down: the limits and allowed values; the profile and its check; teams; loading the files;
then the field checks (:class:`Checker` and the ``check_*`` functions, which ad-hoc agents in
:mod:`.adhoc` go through too) and the TOML shape both kinds of file are read from.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
import types
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, cast

import attrs

from .. import settings
from ..contract import CONTRACT_ENV, RESERVED_ENV_PREFIX
from ..errors import InvalidId, ProfileError, ProfileNotFound
from ..identity import Mode, validate_id

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    # mypy runs with python_version 3.10 while the venv (3.11+) has no tomli installed.
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

if TYPE_CHECKING:
    from importlib.abc import Traversable

__all__ = [
    "AGENT_LAUNCHING_TOOLS",
    "PI_ONLY_FIELDS",
    "PROVIDERS",
    "PYTHON_WORD",
    "TASK_WORD",
    "THINKING_LEVELS",
    "ProfileSet",
    "TeamMember",
    "TeamTemplate",
    "WorkerLaunchProfile",
    "load_profiles",
    "parse_profile",
    "parse_team",
    "resolve_write_paths",
    "shipped_dir",
    "user_dir",
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


RESOURCE_PACKAGE: Final = "pi_tmux_matrix.launch_profiles"
USER_DIR_NAME: Final = "launch_profiles"
TEAMS_DIR_NAME: Final = "teams"
MAX_FILE_BYTES: Final = 256 * 1024

# Field -> what the other CLI has instead (for the "remove it" fix).
PI_ONLY_FIELDS: Final[dict[str, str]] = {
    "thinking": "its own reasoning settings",
    "tools": "its own tools",
    "resource_profile": "its own resource settings",
    "write_paths": "its own sandboxing (PI_WORKER_ALLOWED_PATHS is enforced by pi only)",
    "extensions": "its own plugins",
    "extension_tools": "its own plugins",
    "append_system_prompt": "its own system prompt; put instructions in the task or a team member",
}

# TOML key -> attribute; "deadline" is seconds, like every other duration a user writes.
_PROFILE_KEYS: Final[dict[str, str]] = {
    "name": "name",
    "provider": "provider",
    "command": "command",
    "description": "description",
    "mode": "mode",
    "model": "model",
    "thinking": "thinking",
    "tools": "tools",
    "resource_profile": "resource_profile",
    "write_paths": "write_paths",
    "extensions": "extensions",
    "extension_tools": "extension_tools",
    "append_system_prompt": "append_system_prompt",
    "deadline": "deadline_s",
    "accepts_worktree_lane": "accepts_worktree_lane",
    "env": "env",
}
_ATTR_KEYS: Final = {attr: key for key, attr in _PROFILE_KEYS.items()}


@attrs.frozen
class WorkerLaunchProfile:
    """One way to launch an agent CLI. Validated on construction; errors name ``source``."""

    name: str
    provider: str
    command: tuple[str, ...]
    description: str = ""
    mode: Mode = Mode.INTERACTIVE
    model: str | None = None
    thinking: str | None = None
    tools: tuple[str, ...] | None = None
    resource_profile: str | None = None
    write_paths: tuple[str, ...] | None = None
    extensions: tuple[str, ...] = ()
    extension_tools: tuple[str, ...] = ()
    append_system_prompt: str | None = None
    deadline_s: float = 1200.0
    accepts_worktree_lane: bool = False
    env: tuple[tuple[str, str], ...] = ()
    source: str = ""

    def __attrs_post_init__(self) -> None:
        _check_profile(self)

    @property
    def is_pi(self) -> bool:
        return self.provider == "pi"

    @property
    def confinement(self) -> str:
        """What the envelope holds for this profile, said plainly: only pi's bridge enforces paths
        and tools, and bash is never confined (it runs with the user's full rights)."""
        paths = self.is_pi and bool(self.write_paths)
        tools = self.is_pi and self.tools is not None
        bash = not tools or bool(PI_PROCESS_TOOLS.intersection(self.tools or ()))
        if paths and not bash:
            return "confined: paths and tools"
        if paths:
            return "confined: paths (bash not confined)"
        if tools and not bash:
            return "confined: tools"
        return "not confined"


@attrs.frozen
class ProfileSet:
    """The profiles and teams in force, and the dirs they came from (shipped first)."""

    profiles: Mapping[str, WorkerLaunchProfile] = attrs.field(hash=False)
    teams: Mapping[str, TeamTemplate] = attrs.field(hash=False)
    sources: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        # A team naming a missing profile would only fail at fire time, halfway through a team.
        for team in self.teams.values():
            for index, member in enumerate(team.members):
                if member.profile not in self.profiles:
                    raise ProfileError(
                        team.source,
                        f"team.members[{index}].profile",
                        f"no launch profile named {member.profile!r}",
                        f"use one of: {', '.join(self.names()) or 'none'}",
                    )

    def profile(self, name: str) -> WorkerLaunchProfile:
        try:
            return self.profiles[name]
        except KeyError:
            raise ProfileNotFound("launch profile", name, self.names()) from None

    def team(self, name: str) -> TeamTemplate:
        try:
            return self.teams[name]
        except KeyError:
            raise ProfileNotFound("team", name, self.team_names()) from None

    def names(self) -> list[str]:
        return sorted(self.profiles)

    def team_names(self) -> list[str]:
        return sorted(self.teams)


# --- the profile as a whole --------------------------------------------------------------------------
def _check_profile(profile: WorkerLaunchProfile) -> None:
    # One check per field, in field order: when a file has several problems, the first one
    # reported stays the same as it always was.
    check = Checker(profile.source, "profile")
    check.ident(profile.name, "name")
    provider = profile.provider
    if provider not in PROVIDERS:
        raise check.fail(
            "provider", f"{shown(provider)} is not a provider", f"use one of: {', '.join(PROVIDERS)}"
        )
    check_command(check, profile.command, provider)
    check.text(profile.description, "description", MAX_DESCRIPTION_CHARS)
    check_mode(check, profile.mode, provider)
    if profile.model is not None:
        check_model(check, profile.model)
    _check_pi_only_fields(check, profile)
    if profile.thinking is not None and profile.thinking not in THINKING_LEVELS:
        raise check.fail(
            "thinking",
            f"{shown(profile.thinking)} is not a thinking level",
            f"use one of: {', '.join(THINKING_LEVELS)}",
        )
    if profile.tools is not None:
        # extension_tools is checked in its own place below; a malformed one provides nothing.
        provided = profile.extension_tools if isinstance(profile.extension_tools, tuple) else ()
        check_tools(check, profile.tools, provider, tuple(t for t in provided if isinstance(t, str)))
    if profile.resource_profile is not None:
        check.ident(profile.resource_profile, "resource_profile")
    if profile.write_paths is not None:
        for index, path in enumerate(check.words(profile.write_paths, "write_paths", MAX_WRITE_PATHS)):
            check_write_path(check, path, f"write_paths[{index}]")
    for index, extension in enumerate(check.words(profile.extensions, "extensions", MAX_EXTENSIONS)):
        check.word(extension, f"extensions[{index}]")
    check_extension_tools(check, profile.extension_tools, profile.extensions)
    if profile.append_system_prompt is not None:
        check.text(profile.append_system_prompt, "append_system_prompt", MAX_TEXT_CHARS, empty=False)
    check_deadline(check, profile.deadline_s)
    check_worktree_lane(check, profile.accepts_worktree_lane, provider)
    check_env(check, profile.env)
    if not isinstance(profile.source, str):
        raise check.fail("source", f"must be a string, not {kind_of(profile.source)}", "give the file path")


def _check_pi_only_fields(check: Checker, profile: WorkerLaunchProfile) -> None:
    if profile.provider == "pi":
        return
    for attr, instead in PI_ONLY_FIELDS.items():
        value = getattr(profile, attr)
        # extensions and extension_tools default to (); every other pi-only field is unset at
        # None ("tools = []" is a real setting: pi's --no-tools).
        unset = value == () if attr in ("extensions", "extension_tools") else value is None
        if not unset:
            raise check.fail(
                _ATTR_KEYS[attr],
                f"pi-only field on provider {profile.provider!r}",
                f"remove it (the {profile.provider} CLI owns {instead})",
            )


# --- parsing ----------------------------------------------------------------------------------------
def parse_profile(text: str, source: str) -> WorkerLaunchProfile:
    """One profile from TOML text; ``source`` names the file in every error."""
    section = section_of(load_toml(text, source), "profile", source)
    unknown_keys(section, _PROFILE_KEYS, source, "profile")
    for key in ("name", "provider", "command"):
        if key not in section:
            raise ProfileError(source, f"profile.{key}", "missing", f"add {key} = ... to [profile]")
    fields: dict[str, Any] = {}
    for key, raw in section.items():
        value: Any
        if key == "mode" and isinstance(raw, str) and raw in {m.value for m in Mode}:
            value = Mode(raw)
        elif key == "env":
            value = tuple(raw.items()) if isinstance(raw, dict) else raw
        elif key == "deadline" and isinstance(raw, int) and not isinstance(raw, bool):
            value = float(raw)
        else:
            value = as_tuple(raw)
        fields[_PROFILE_KEYS[key]] = value
    return WorkerLaunchProfile(**fields, source=source)


# --- teams ------------------------------------------------------------------------------------------

MAX_TEAM_MEMBERS: Final = 8
MAX_INSTRUCTIONS_CHARS: Final = 4000
_TEAM_KEYS: Final = ("name", "description", "members")
_MEMBER_KEYS: Final = ("profile", "suffix", "instructions")


@attrs.frozen
class TeamMember:
    """One agent of a team: which profile, its agent-id suffix, and what it is told first.

    Checked by the :class:`TeamTemplate` that holds it, so errors can name its index.
    """

    profile: str
    suffix: str
    instructions: str = ""


@attrs.frozen
class TeamTemplate:
    """Several agents fired together on one task (each gets its own instructions)."""

    name: str
    members: tuple[TeamMember, ...]
    description: str = ""
    source: str = ""

    def __attrs_post_init__(self) -> None:
        _check_team(self)


def _check_team(team: TeamTemplate) -> None:
    check = Checker(team.source, "team")
    check.ident(team.name, "name")
    check.text(team.description, "description", MAX_DESCRIPTION_CHARS)
    if not isinstance(team.members, tuple):
        raise check.fail(
            "members", f"must be a list of tables, not {kind_of(team.members)}", "add [[team.members]] tables"
        )
    if not 1 <= len(team.members) <= MAX_TEAM_MEMBERS:
        raise check.fail(
            "members",
            f"has {len(team.members)} members",
            f"give 1 to {MAX_TEAM_MEMBERS} [[team.members]] tables",
        )
    suffixes: set[str] = set()
    for index, member in enumerate(team.members):
        where = f"members[{index}]"
        if not isinstance(member, TeamMember):
            raise check.fail(where, f"is {kind_of(member)}", "give a TeamMember")
        check.ident(member.profile, f"{where}.profile")
        suffix = check.ident(member.suffix, f"{where}.suffix")
        if suffix in suffixes:
            raise check.fail(
                f"{where}.suffix", f"{suffix!r} is used twice", "give each member its own suffix"
            )
        suffixes.add(suffix)
        check.text(member.instructions, f"{where}.instructions", MAX_INSTRUCTIONS_CHARS)


def parse_team(text: str, source: str) -> TeamTemplate:
    """One team template from TOML text (profiles are checked by :class:`ProfileSet`)."""
    section = section_of(load_toml(text, source), "team", source)
    unknown_keys(section, _TEAM_KEYS, source, "team")
    if "name" not in section:
        raise ProfileError(source, "team.name", "missing", 'add name = "..." to [team]')
    raw_members = section.get("members")
    if not isinstance(raw_members, list):
        raise ProfileError(
            source,
            "team.members",
            "missing" if raw_members is None else f"must be a list of tables, not {kind_of(raw_members)}",
            "add one [[team.members]] table per agent",
        )
    members: list[TeamMember] = []
    for index, raw in enumerate(raw_members):
        where = f"team.members[{index}]"
        if not isinstance(raw, dict):
            raise ProfileError(
                source, where, f"must be a table, not {kind_of(raw)}", "write it as [[team.members]]"
            )
        unknown_keys(raw, _MEMBER_KEYS, source, where)
        for key in ("profile", "suffix"):
            if key not in raw:
                raise ProfileError(source, f"{where}.{key}", "missing", f'add {key} = "..."')
        members.append(TeamMember(raw["profile"], raw["suffix"], raw.get("instructions", "")))
    # Taken as written: the team's own check names a value of the wrong type.
    return TeamTemplate(
        name=cast("str", section["name"]),
        members=tuple(members),
        description=cast("str", section.get("description", "")),
        source=source,
    )


# --- loading ----------------------------------------------------------------------------------------
def shipped_dir() -> Traversable:
    """The profiles installed with the package (``pi_tmux_matrix.launch_profiles``)."""
    return resources.files(RESOURCE_PACKAGE)


def user_dir(agent_dir: Path) -> Path:
    """Where a user's own profiles live; a file there overrides a shipped one of the same name."""
    return agent_dir / USER_DIR_NAME


def _read_user_file(path: Path) -> bytes:
    try:
        # O_NONBLOCK + a regular-file check: a FIFO named x.toml must not hang every launch.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ProfileError(
            str(path), "file", f"cannot be read ({exc.strerror})", "fix its permissions or remove it"
        ) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ProfileError(
                str(path), "file", "is not a regular file", "remove it or replace it with a TOML file"
            )
        return os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)


def _files(folder: Traversable | Path, source: str) -> list[tuple[str, str, str]]:
    """(stem, text, source) of each ``*.toml`` directly in ``folder``, sorted; [] if it is absent."""
    if isinstance(folder, Path):
        if not folder.exists():
            return []
        if not folder.is_dir():
            raise ProfileError(
                source, "dir", "is not a directory", "remove it or make it a directory of *.toml files"
            )
    elif not folder.is_dir():
        return []
    found: list[tuple[str, str, str]] = []
    # Dot files are editor swap/backup files, never profiles.
    entries = sorted(
        (e for e in folder.iterdir() if e.name.endswith(".toml") and not e.name.startswith(".")),
        key=lambda e: e.name,
    )
    for entry in entries:
        where = str(entry)
        data = _read_user_file(entry) if isinstance(entry, Path) else entry.read_bytes()
        if len(data) > MAX_FILE_BYTES:
            raise ProfileError(
                where, "file", f"is over {MAX_FILE_BYTES} bytes", "a profile is a few lines; trim it"
            )
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProfileError(where, "file", f"is not UTF-8 ({exc.reason})", "save it as UTF-8") from None
        found.append((entry.name[: -len(".toml")], text, where))
    return found


def _check_stem(stem: str, name: str, source: str, section: str) -> None:
    if stem != name:
        raise ProfileError(
            source,
            f"{section}.name",
            f"{name!r} does not match the file name {stem}.toml",
            f"rename the file to {name}.toml or set name = {stem!r}",
        )


def load_profiles(agent_dir: Path | None = None) -> ProfileSet:
    """The shipped profiles and teams, overridden by name by ``<agent dir>/launch_profiles/``.

    Strict: the first broken file raises :class:`ProfileError` naming it. A missing user dir
    is fine (most users never write a profile).
    """
    base = settings.agent_dir() if agent_dir is None else agent_dir
    shipped = shipped_dir()
    user = user_dir(base)
    profiles: dict[str, WorkerLaunchProfile] = {}
    teams: dict[str, TeamTemplate] = {}
    folders: list[tuple[Traversable | Path, Traversable | Path]] = [
        (shipped, shipped.joinpath(TEAMS_DIR_NAME)),
        (user, user / TEAMS_DIR_NAME),
    ]
    for folder, teams_folder in folders:
        for stem, text, source in _files(folder, str(folder)):
            profile = parse_profile(text, source)
            _check_stem(stem, profile.name, source, "profile")
            profiles[profile.name] = profile
        for stem, text, source in _files(teams_folder, str(teams_folder)):
            team = parse_team(text, source)
            _check_stem(stem, team.name, source, "team")
            teams[team.name] = team
    return ProfileSet(
        profiles=types.MappingProxyType(profiles),
        teams=types.MappingProxyType(teams),
        sources=(str(shipped), str(user)),
    )


def resolve_write_paths(profile: WorkerLaunchProfile, *, cwd: str, worktree: str | None) -> tuple[str, ...]:
    """The ``PI_WORKER_ALLOWED_PATHS`` value for one launch: ``()`` is full scope.

    Placeholders are filled (``{worktree}`` without a worktree means the cwd), each path made
    absolute and normalised, duplicates dropped in order.
    """
    if not profile.write_paths:
        return ()
    root_cwd = os.path.abspath(cwd)
    root_worktree = os.path.abspath(worktree) if worktree else root_cwd
    resolved: list[str] = []
    for path in profile.write_paths:
        if path.startswith(WORKTREE_PLACEHOLDER):
            full = root_worktree + path[len(WORKTREE_PLACEHOLDER) :]
        elif path.startswith(CWD_PLACEHOLDER):
            full = root_cwd + path[len(CWD_PLACEHOLDER) :]
        else:
            full = path
        normal = os.path.normpath(os.path.abspath(full))
        if normal not in resolved:
            resolved.append(normal)
    return tuple(resolved)


# --- the field checks-------------------------------------------------------------------------------------
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
