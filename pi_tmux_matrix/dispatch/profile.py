"""Launch profiles and team templates: which agent CLI the dispatcher starts, and how.

A profile is one TOML file (``[profile]``), a team one file under ``teams/`` (``[team]``).
The shipped ones live in the resource package ``pi_tmux_matrix.launch_profiles``; files in
``<agent dir>/launch_profiles/`` override them by name. Loading is strict: the first broken
file raises :class:`ProfileError` naming the file, the field and the fix, because a profile
that silently lost a field (say ``write_paths``) would launch an agent with more reach than
its author meant.

A profile never carries authority: the parent, the task ref, the write envelope and the
markers come from the dispatcher, so a profile may not set those env variables.

The field checks live in :mod:`.profile_checks` and teams in :mod:`.teams`; every name is still
importable from here.
"""

from __future__ import annotations

import os
import stat
import types
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import attrs

from .. import settings
from ..errors import ProfileError, ProfileNotFound
from ..identity import Mode
from .profile_checks import (
    AGENT_LAUNCHING_TOOLS,
    CWD_PLACEHOLDER,
    MAX_DESCRIPTION_CHARS,
    MAX_EXTENSIONS,
    MAX_TEXT_CHARS,
    MAX_WRITE_PATHS,
    PI_PROCESS_TOOLS,
    PROVIDERS,
    PYTHON_WORD,
    TASK_WORD,
    THINKING_LEVELS,
    WORKTREE_PLACEHOLDER,
    Checker,
    as_tuple,
    check_command,
    check_deadline,
    check_env,
    check_extension_tools,
    check_mode,
    check_model,
    check_tools,
    check_worktree_lane,
    check_write_path,
    kind_of,
    load_toml,
    section_of,
    shown,
    unknown_keys,
)
from .teams import TeamMember, TeamTemplate, parse_team

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
