"""Team templates: several agents fired together on one task, each with its own instructions.

A team is one TOML file under ``launch_profiles/teams/`` (``[team]``), read as strictly as a
profile. Whether each member's profile exists is checked by :class:`.profile.ProfileSet`, which
knows the profiles in force.
"""

from __future__ import annotations

from typing import Final, cast

import attrs

from ..errors import ProfileError
from .profile_checks import (
    MAX_DESCRIPTION_CHARS,
    Checker,
    kind_of,
    load_toml,
    section_of,
    unknown_keys,
)

__all__ = ["TeamMember", "TeamTemplate", "parse_team"]

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
