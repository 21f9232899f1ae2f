"""Launch profiles, team templates and each provider's argv (issue 4, item 2).

Profiles are real TOML files under ``tmp_path`` (the autouse fixture points
``PI_CODING_AGENT_DIR`` there); the stand-in and the ``custom`` example run as real processes,
so "the task is one argv word, verbatim" is checked by an exec, not by inspecting a list.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import attrs
import pytest

from pi_tmux_matrix.dispatch.profile import (
    PI_ONLY_FIELDS,
    ProfileSet,
    TeamMember,
    TeamTemplate,
    WorkerLaunchProfile,
    load_profiles,
    parse_profile,
    parse_team,
    resolve_write_paths,
    shipped_dir,
    user_dir,
)
from pi_tmux_matrix.dispatch.providers import AgentCommand, agent_command
from pi_tmux_matrix.errors import ContractError, ProfileError, ProfileNotFound
from pi_tmux_matrix.identity import Mode
from pi_tmux_matrix.testing import standin

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_PROFILES = [
    "agy",
    "claude",
    "codex",
    "custom",
    "opencode",
    "pi-reviewer",
    "pi-rpc-worker",
    "pi-worker",
    "stand-in",
]
SHIPPED_TEAMS = [
    "builder-validator",
    "full-provider-review",
    "impl-review",
    "provider-prompt-smoke",
    "stand-in-pair",
]
HOSTILE_TASKS = [
    "; rm -rf ~",
    "$(id) `id` ${HOME}",
    "it's \"quoted\" and 'single'",
    "line one\nline two\n\ttabbed",
    "a | b && c > /tmp/x < /dev/null &",
    "*.py ~ !! #comment",
    "unicode: héllo ✓ \u202e",
]


def profile_toml(**fields: Any) -> str:
    """A ``[profile]`` file (env as its own table); defaults make a valid pi profile."""
    values: dict[str, Any] = {"name": "p", "provider": "pi", "command": ["pi"]}
    values.update(fields)
    env = values.pop("env", None)
    lines = ["[profile]", *(f"{key} = {toml_value(value)}" for key, value in values.items())]
    if env is not None:
        lines += ["[profile.env]", *(f"{key} = {toml_value(value)}" for key, value in env.items())]
    return "\n".join(lines) + "\n"


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    raise TypeError(value)


def make(**fields: Any) -> WorkerLaunchProfile:
    values: dict[str, Any] = {"name": "p", "provider": "pi", "command": ("pi",), "source": "test.toml"}
    values.update(fields)
    return WorkerLaunchProfile(**values)


@pytest.fixture
def agent_dir(isolated_env: Path) -> Path:
    return Path(os.environ["PI_CODING_AGENT_DIR"])


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# --- the shipped set ----------------------------------------------------------------------------------
def test_every_shipped_profile_and_team_loads_and_builds_argv(agent_dir: Path) -> None:
    profiles = load_profiles()
    assert profiles.names() == SHIPPED_PROFILES
    assert profiles.team_names() == SHIPPED_TEAMS
    assert profiles.sources == (str(shipped_dir()), str(user_dir(agent_dir)))
    for name in profiles.names():
        profile = profiles.profile(name)
        assert profile.source.endswith(f"{name}.toml")
        command = agent_command(profile, task="do the thing", session_file="/tmp/s.jsonl", lane="lane-1")
        assert isinstance(command, AgentCommand) and len(command.argv) >= 2
        if profile.mode is Mode.RPC:
            assert command.rpc_prompt == "do the thing" and "do the thing" not in command.argv
        else:
            assert command.rpc_prompt is None and "do the thing" in command.argv
        assert "{python}" not in command.argv and "{task}" not in command.argv
    for name in profiles.team_names():
        team = profiles.team(name)
        assert 1 <= len(team.members) <= 8
        for member in team.members:
            profiles.profile(member.profile)


def test_shipped_profiles_say_what_the_issue_asks(agent_dir: Path) -> None:
    profiles = load_profiles()
    reviewer = profiles.profile("pi-reviewer")
    assert reviewer.tools == ("read", "grep", "find", "ls")
    assert profiles.profile("pi-rpc-worker").mode is Mode.RPC
    assert profiles.profile("pi-worker").write_paths == ("{worktree}",)
    stand_in = profiles.profile("stand-in")
    assert stand_in.provider == "pi" and stand_in.deadline_s == 600
    assert stand_in.command == ("{python}", "-m", "pi_tmux_matrix.testing.standin")
    assert "stand-in" in stand_in.description and "demo" in stand_in.description
    assert [m.profile for m in profiles.team("impl-review").members] == ["pi-worker", "pi-reviewer"]
    assert [m.profile for m in profiles.team("stand-in-pair").members] == ["stand-in", "stand-in"]
    for name in ("claude", "codex", "opencode", "agy"):
        assert profiles.profile(name).command == (name,)
    # agy takes no positional prompt: its first one goes through --prompt-interactive (the origin's).
    agy = agent_command(profiles.profile("agy"), task="T", session_file=None)
    assert agy.argv == ("agy", "--prompt-interactive", "T")


def test_unknown_names_are_not_found_and_list_the_known_ones(agent_dir: Path) -> None:
    profiles = load_profiles()
    with pytest.raises(ProfileNotFound, match=r"no launch profile named 'nope'; known: agy, claude, codex"):
        profiles.profile("nope")
    with pytest.raises(ProfileNotFound, match="no team named 'nope'; known: " + ", ".join(SHIPPED_TEAMS)):
        profiles.team("nope")


def test_load_profiles_defaults_to_the_agent_dir_from_env(agent_dir: Path) -> None:
    write(agent_dir / "launch_profiles" / "mine.toml", profile_toml(name="mine"))
    assert "mine" in load_profiles().names()


# --- the user dir -------------------------------------------------------------------------------------
def test_a_user_file_overrides_a_shipped_profile_and_team_by_name(agent_dir: Path) -> None:
    folder = user_dir(agent_dir)
    mine = write(
        folder / "claude.toml", profile_toml(name="claude", provider="claude", command=["my-claude"])
    )
    write(folder / "extra.toml", profile_toml(name="extra", deadline=30))
    write(
        folder / "teams" / "impl-review.toml",
        '[team]\nname = "impl-review"\n[[team.members]]\nprofile = "extra"\nsuffix = "solo"\n',
    )
    profiles = load_profiles(agent_dir)
    assert profiles.profile("claude").command == ("my-claude",)
    assert profiles.profile("claude").source == str(mine)
    assert profiles.profile("extra").deadline_s == 30.0
    assert profiles.profile("codex").command == ("codex",)  # the rest are still the shipped ones
    assert [m.suffix for m in profiles.team("impl-review").members] == ["solo"]
    assert profiles.team("stand-in-pair").source.startswith(str(shipped_dir()))


def test_a_missing_user_dir_is_fine_and_dot_files_are_skipped(agent_dir: Path) -> None:
    assert load_profiles(agent_dir / "nowhere").names() == SHIPPED_PROFILES
    write(user_dir(agent_dir) / ".claude.toml.swp.toml", "not toml at all [[[")
    write(user_dir(agent_dir) / "notes.txt", "not a profile")
    assert load_profiles(agent_dir).names() == SHIPPED_PROFILES


def test_a_broken_user_file_fails_loading_naming_the_file(agent_dir: Path) -> None:
    bad = write(user_dir(agent_dir) / "broken.toml", "[profile\nname = ")
    with pytest.raises(ProfileError, match=r"broken\.toml: TOML: not valid TOML") as caught:
        load_profiles(agent_dir)
    assert caught.value.source == str(bad)


def test_a_user_file_that_is_not_utf8_or_regular_or_huge_is_refused(agent_dir: Path) -> None:
    folder = user_dir(agent_dir)
    write(folder / "x.toml", "")
    (folder / "x.toml").write_bytes(b'[profile]\nname = "\xff"\n')
    with pytest.raises(ProfileError, match=r"x\.toml: file: is not UTF-8"):
        load_profiles(agent_dir)
    (folder / "x.toml").unlink()
    os.mkfifo(folder / "fifo.toml")  # must not hang
    with pytest.raises(ProfileError, match=r"fifo\.toml: file: is not a regular file"):
        load_profiles(agent_dir)
    (folder / "fifo.toml").unlink()
    write(folder / "big.toml", "# " + "x" * (300 * 1024))
    with pytest.raises(ProfileError, match=r"big\.toml: file: is over"):
        load_profiles(agent_dir)


def test_a_user_dir_that_is_a_file_is_refused(agent_dir: Path) -> None:
    write(user_dir(agent_dir), "oops")
    with pytest.raises(ProfileError, match=r"launch_profiles: dir: is not a directory"):
        load_profiles(agent_dir)


def test_file_stem_must_equal_the_name(agent_dir: Path) -> None:
    write(user_dir(agent_dir) / "other.toml", profile_toml(name="mine"))
    with pytest.raises(
        ProfileError, match=r"other\.toml: profile\.name: 'mine' does not match the file name"
    ):
        load_profiles(agent_dir)


def test_team_stem_must_equal_the_name(agent_dir: Path) -> None:
    write(
        user_dir(agent_dir) / "teams" / "t1.toml",
        '[team]\nname = "t2"\n[[team.members]]\nprofile = "claude"\nsuffix = "a"\n',
    )
    with pytest.raises(ProfileError, match=r"t1\.toml: team\.name: 't2' does not match"):
        load_profiles(agent_dir)


def test_a_team_member_naming_an_unknown_profile_is_refused(agent_dir: Path) -> None:
    team = write(
        user_dir(agent_dir) / "teams" / "t.toml",
        '[team]\nname = "t"\n[[team.members]]\nprofile = "claude"\nsuffix = "a"\n'
        '[[team.members]]\nprofile = "ghost"\nsuffix = "b"\n',
    )
    with pytest.raises(
        ProfileError, match=r"team\.members\[1\]\.profile: no launch profile named 'ghost'"
    ) as e:
        load_profiles(agent_dir)
    assert e.value.source == str(team) and "claude" in str(e.value)


# --- one profile's fields -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("thinking", "high"),
        ("tools", ["read"]),
        ("tools", []),
        ("resource_profile", "small"),
        ("write_paths", ["{worktree}"]),
        ("extensions", ["x.ts"]),
        ("extension_tools", ["delegate"]),
        ("append_system_prompt", "be terse"),
    ],
)
def test_each_pi_only_field_is_refused_on_claude_naming_the_field(key: str, value: Any) -> None:
    text = profile_toml(name="claude", provider="claude", command=["claude"], **{key: value})
    with pytest.raises(ProfileError) as caught:
        parse_profile(text, "launch_profiles/claude.toml")
    assert str(caught.value).startswith(
        f"launch_profiles/claude.toml: profile.{key}: pi-only field on provider 'claude'; remove it"
    )
    assert key in PI_ONLY_FIELDS


def test_a_tool_nothing_provides_is_refused_at_load_naming_it() -> None:
    """Issue 28.7: the issue's own list. pi takes any name in --tools without a word (the worker
    just lacks the tool), so a pi profile's tools are pi's built-in ones or those its extensions
    provide, as extension_tools declares them; the error names the field, the name and the fix."""
    text = profile_toml(tools=["read", "delegate", "unknown-extension"])
    with pytest.raises(ProfileError) as caught:
        parse_profile(text, "launch_profiles/p.toml")
    assert str(caught.value) == (
        "launch_profiles/p.toml: profile.tools[1]: 'delegate' is neither one of pi's built-in tools "
        "(read, bash, powershell, edit, write, grep, find, ls) nor named by this profile's extension_tools; "
        "remove it, "
        'or load the extension that provides it (extensions = ["path/to/ext.ts"]) and name the tool there: '
        'extension_tools = ["delegate"]'
    )
    # An extension that provides delegate: the next unknown name is the one refused.
    extension = {"extensions": ["/ext/delegate.ts"], "extension_tools": ["delegate"]}
    declared = profile_toml(tools=["read", "delegate", "unknown-extension"], **extension)
    with pytest.raises(ProfileError, match=r"profile\.tools\[2\]: 'unknown-extension' is neither"):
        parse_profile(declared, "p.toml")
    accepted = parse_profile(profile_toml(tools=["read", "delegate"], **extension), "p.toml")
    assert accepted.tools == ("read", "delegate") and accepted.extension_tools == ("delegate",)
    assert agent_command(accepted, task="T", session_file=None).argv == (
        "pi", "--tools", "read,delegate", "--no-extensions", "-e", "/ext/delegate.ts", "T",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"extension_tools": ["delegate"]}, r"extension_tools: names tools, but the profile loads no ext"),
        ({"extensions": ["e.ts"], "extension_tools": ["a,b"]}, r"extension_tools\[0\]: 'a,b' is not a tool"),
        ({"extensions": ["e.ts"], "extension_tools": ["fork"]}, r"extension_tools\[0\]: 'fork' launches"),
        ({"extensions": ["e.ts"], "extension_tools": "x"}, r"profile\.extension_tools: must be a list"),
    ],
)
def test_extension_tools_is_checked_like_tools(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        parse_profile(profile_toml(**fields), "p.toml")


@pytest.mark.real_pi
def test_the_built_in_tool_list_is_the_installed_pis() -> None:
    """PI_BUILTIN_TOOLS holds pi's own `allToolNames`: a pi that adds a tool fails here first."""
    from pi_support import pi_bin

    from pi_tmux_matrix.dispatch.profile import PI_BUILTIN_TOOLS

    binary = Path(pi_bin()).resolve()
    cli = binary if binary.name == "cli.js" else None
    if cli is None:  # install-pi's wrapper names cli.js
        named = re.search(r'"([^"]*pi-coding-agent/dist/cli\.js)"', binary.read_text(encoding="utf-8"))
        assert named is not None, f"{binary} is neither pi's cli.js nor a wrapper naming it"
        cli = Path(named.group(1))
    index = cli.parent / "core" / "tools" / "index.js"
    found = re.search(r"allToolNames = new Set\(\[([^\]]*)\]\)", index.read_text(encoding="utf-8"))
    assert found is not None, f"pi's allToolNames is gone from {index}"
    installed = set(json.loads(f"[{found.group(1).strip().rstrip(',')}]"))
    assert installed <= set(PI_BUILTIN_TOOLS), installed - set(PI_BUILTIN_TOOLS)
    assert {"read", "bash", "edit", "write", "grep", "find", "ls"} <= installed


def test_the_issue_example_message_for_tools_on_claude() -> None:
    text = profile_toml(name="claude", provider="claude", command=["claude"], tools=["read"])
    with pytest.raises(ProfileError) as caught:
        parse_profile(text, "launch_profiles/claude.toml")
    assert str(caught.value) == (
        "launch_profiles/claude.toml: profile.tools: pi-only field on provider 'claude'; "
        "remove it (the claude CLI owns its own tools)"
    )


@pytest.mark.parametrize("provider", ["claude", "codex", "opencode", "agy", "custom"])
def test_rpc_mode_is_pi_only(provider: str) -> None:
    with pytest.raises(ProfileError, match=r"profile\.mode: rpc is pi-only"):
        parse_profile(profile_toml(provider=provider, command=["x", "y"], mode="rpc"), "f.toml")


def test_print_mode_is_refused_on_custom_only() -> None:
    with pytest.raises(ProfileError, match=r"profile\.mode: print needs"):
        parse_profile(profile_toml(provider="custom", command=["x", "y"], mode="print"), "f.toml")
    for provider in ("pi", "claude", "codex", "opencode"):
        assert parse_profile(profile_toml(provider=provider, mode="print"), "f.toml").mode is Mode.PRINT


def test_unknown_keys_are_refused_naming_the_key_and_the_allowed_ones() -> None:
    with pytest.raises(
        ProfileError, match=r"f\.toml: profile\.toolz: unknown key; the allowed keys are: name, "
    ):
        parse_profile(profile_toml(toolz=["read"]), "f.toml")
    with pytest.raises(ProfileError, match=r"f\.toml: extra: unknown top-level key"):
        parse_profile(profile_toml() + "[extra]\na = 1\n", "f.toml")
    with pytest.raises(ProfileError, match=r"f\.toml: profile: missing; start the file with \[profile\]"):
        parse_profile("", "f.toml")
    with pytest.raises(ProfileError, match=r"profile\.command: missing"):
        parse_profile('[profile]\nname = "p"\nprovider = "pi"\n', "f.toml")
    with pytest.raises(ProfileError, match=r"team\.members\[0\]\.role: unknown key"):
        parse_team(
            '[team]\nname = "t"\n[[team.members]]\nprofile = "p"\nsuffix = "a"\nrole = "x"\n', "t.toml"
        )


@pytest.mark.parametrize(
    ("fields", "pattern"),
    [
        ({"name": 3}, r"profile\.name: 3 is not a valid id"),
        ({"provider": ["pi"]}, r"profile\.provider: \('pi',\) is not a provider; use one of: pi, claude"),
        (
            {"command": "pi"},
            r"profile\.command: must be a list of strings, not a string; write it as command = \[",
        ),
        ({"command": ["pi", 3]}, r"profile\.command\[1\]: must be a string, not an integer"),
        ({"command": []}, r"profile\.command: is empty"),
        ({"description": 5}, r"profile\.description: must be a string, not an integer"),
        ({"mode": 1}, r"profile\.mode: must be a string, not an integer"),
        ({"mode": "batch"}, r"profile\.mode: 'batch' is not a mode; use one of: interactive, print, rpc"),
        ({"model": True}, r"profile\.model: must be a string, not a boolean"),
        ({"model": "--evil"}, r"profile\.model: '--evil' starts with '-'"),
        ({"model": "two words"}, r"profile\.model: 'two words' is not a model id"),
        ({"thinking": "max"}, r"profile\.thinking: 'max' is not a thinking level; use one of: off, minimal"),
        ({"tools": "read"}, r"profile\.tools: must be a list of strings, not a string"),
        ({"tools": ["read,bash"]}, r"profile\.tools\[0\]: 'read,bash' is not a tool name"),
        ({"resource_profile": "../x"}, r"profile\.resource_profile: '\.\./x' is not a valid id"),
        ({"extensions": ["-x"]}, r"profile\.extensions\[0\]: '-x' starts with '-'"),
        ({"append_system_prompt": ""}, r"profile\.append_system_prompt: is empty"),
        (
            {"deadline": "20m"},
            r"profile\.deadline: must be a number of seconds, not '20m'; write e\.g\. deadline",
        ),
        ({"deadline": True}, r"profile\.deadline: must be a number of seconds, not True"),
        ({"deadline": 0.5}, r"profile\.deadline: 0\.5 s is outside 1\.\.86400; give 1 to 86400 seconds"),
        ({"deadline": 86401}, r"profile\.deadline: 86401 s is outside 1\.\.86400"),
        ({"deadline": float("inf")}, r"profile\.deadline: must be a number of seconds"),
        ({"accepts_worktree_lane": "yes"}, r"profile\.accepts_worktree_lane: must be true or false"),
        ({"env": {"lower": "x"}}, r"profile\.env\.lower: is not a variable name"),
        ({"env": {"X": 1}}, r"profile\.env\.X: must be a string, not an integer"),
    ],
)
def test_wrong_types_and_values_name_the_field_and_the_fix(fields: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ProfileError, match=r"^f\.toml: " + pattern):
        parse_profile(profile_toml(**fields), "f.toml")


def test_env_table_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(ProfileError, match=r"profile\.env: must be a table, not a string"):
        parse_profile('[profile]\nname = "p"\nprovider = "pi"\ncommand = ["pi"]\nenv = "A=1"\n', "f.toml")


@pytest.mark.parametrize("name", ["../etc", ".hidden", "a b", "", "x" * 129, "a/b"])
def test_bad_names_are_refused(name: str) -> None:
    with pytest.raises(ProfileError, match=r"profile\.name: .* is not a valid id; use 1-128 characters"):
        parse_profile(profile_toml(name=name), "f.toml")


@pytest.mark.parametrize(
    "key",
    [
        "PI_PARENT_PID",
        "PI_PARENT_SESSION",
        "PI_ORCHESTRATION_AGENT_ID",
        "PI_TASK_REF",
        "PI_WORKER_ALLOWED_PATHS",
        "PI_WORKTREE_LANE",
        "PI_MATRIX_DONE_MARKER",
        "PI_MATRIX_STATE_DIR",
    ],
)
def test_env_may_not_carry_authority(key: str) -> None:
    with pytest.raises(ProfileError, match=rf"profile\.env\.{key}: is set by the dispatcher.*cannot grant"):
        parse_profile(profile_toml(env={key: "1"}), "f.toml")


def test_env_and_deadline_load() -> None:
    profile = parse_profile(profile_toml(env={"MY_VAR": "x", "_B2": ""}, deadline=60), "f.toml")
    assert profile.env == (("MY_VAR", "x"), ("_B2", ""))
    assert profile.deadline_s == 60.0 and isinstance(profile.deadline_s, float)
    assert parse_profile(profile_toml(deadline=86400), "f.toml").deadline_s == 86400
    assert parse_profile(profile_toml(deadline=1), "f.toml").deadline_s == 1
    assert parse_profile(profile_toml(), "f.toml").deadline_s == 1200.0


def test_task_placeholder_only_on_custom_and_never_as_the_program() -> None:
    with pytest.raises(ProfileError, match=r"profile\.command: uses \{task\} on a known provider"):
        parse_profile(profile_toml(command=["pi", "{task}"]), "f.toml")
    with pytest.raises(ProfileError, match=r"profile\.command\[0\]: is the \{task\} placeholder"):
        parse_profile(profile_toml(provider="custom", command=["{task}", "x"]), "f.toml")


def test_worktree_lane_flag_is_refused_on_clis_without_it() -> None:
    with pytest.raises(ProfileError, match=r"profile\.accepts_worktree_lane: the codex CLI has no"):
        parse_profile(profile_toml(provider="codex", accepts_worktree_lane=True), "f.toml")
    with pytest.raises(ProfileError, match=r"profile\.accepts_worktree_lane: the agy CLI has no"):
        parse_profile(profile_toml(provider="agy", accepts_worktree_lane=True), "f.toml")
    with pytest.raises(ProfileError, match=r"profile\.tools: pi-only field on provider 'agy'"):
        parse_profile(profile_toml(provider="agy", command=["agy"], tools=["read"]), "f.toml")


def test_constructing_a_profile_in_code_is_checked_too() -> None:
    with pytest.raises(ProfileError, match=r"^x\.toml: profile\.thinking: pi-only field on provider 'codex'"):
        make(provider="codex", command=("codex",), thinking="low", source="x.toml")
    with pytest.raises(ProfileError, match=r"profile\.command: must be a list of strings, not a list"):
        make(command=["pi"])


# --- write paths --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("relative/dir", "is relative"),
        ("{workdir}", "is relative"),
        ("{worktree}x", "is relative"),
        ("{worktree}/../..", "'..' part"),
        ("/a/./b", "'.' or '..' part"),
    ],
)
def test_write_paths_must_be_absolute_or_placeholders(path: str, problem: str) -> None:
    with pytest.raises(ProfileError, match=rf"profile\.write_paths\[0\]: .*{problem}"):
        parse_profile(profile_toml(write_paths=[path]), "f.toml")


def test_write_path_placeholders_resolve_absolute_and_normalised(tmp_path: Path) -> None:
    profile = make(write_paths=("{worktree}", "{cwd}/out", "/opt//data/", "{worktree}/src/", "{cwd}"))
    cwd, worktree = str(tmp_path / "cwd"), str(tmp_path / "wt")
    assert resolve_write_paths(profile, cwd=cwd, worktree=worktree) == (
        worktree,
        f"{cwd}/out",
        "/opt/data",
        f"{worktree}/src",
        cwd,
    )
    # No worktree: {worktree} means the cwd (and duplicates go).
    assert resolve_write_paths(profile, cwd=cwd, worktree=None) == (
        cwd,
        f"{cwd}/out",
        "/opt/data",
        f"{cwd}/src",
    )
    assert resolve_write_paths(make(), cwd=cwd, worktree=worktree) == ()
    assert resolve_write_paths(make(write_paths=()), cwd=cwd, worktree=worktree) == ()
    relative = resolve_write_paths(profile, cwd="rel", worktree=None)
    assert relative[0] == os.path.abspath("rel")


# --- teams --------------------------------------------------------------------------------------------
def test_team_rules() -> None:
    member = '[[team.members]]\nprofile = "p"\nsuffix = "{}"\n'
    with pytest.raises(ProfileError, match=r"t\.toml: team\.members: has 0 members"):
        parse_team('[team]\nname = "t"\nmembers = []\n', "t.toml")
    with pytest.raises(ProfileError, match=r"team\.members: has 9 members"):
        parse_team('[team]\nname = "t"\n' + "".join(member.format(f"m{i}") for i in range(9)), "t.toml")
    with pytest.raises(ProfileError, match=r"team\.members\[1\]\.suffix: 'a' is used twice"):
        parse_team('[team]\nname = "t"\n' + member.format("a") * 2, "t.toml")
    with pytest.raises(ProfileError, match=r"team\.members\[0\]\.suffix: '\.\.' is not a valid id"):
        parse_team('[team]\nname = "t"\n' + member.format(".."), "t.toml")
    long = "x" * 4001
    with pytest.raises(ProfileError, match=r"team\.members\[0\]\.instructions: is 4001 characters long"):
        parse_team(f'[team]\nname = "t"\n{member.format("a")}instructions = "{long}"\n', "t.toml")
    with pytest.raises(ProfileError, match=r"team\.members: missing"):
        parse_team('[team]\nname = "t"\n', "t.toml")
    with pytest.raises(ProfileError, match=r"team\.members\[0\]\.suffix: missing"):
        parse_team('[team]\nname = "t"\n[[team.members]]\nprofile = "p"\n', "t.toml")
    team = parse_team('[team]\nname = "t"\ndescription = "d"\n' + member.format("a"), "t.toml")
    assert team == TeamTemplate("t", (TeamMember("p", "a", ""),), "d", "t.toml")


def test_profile_set_checks_members_when_built_in_code() -> None:
    team = TeamTemplate("t", (TeamMember("ghost", "a"),), source="t.toml")
    with pytest.raises(ProfileError, match=r"t\.toml: team\.members\[0\]\.profile: no launch profile named"):
        ProfileSet(profiles={}, teams={"t": team})


# --- argv per provider --------------------------------------------------------------------------------
def test_pi_argv_in_every_mode() -> None:
    full = make(
        model="anthropic/claude-x",
        thinking="high",
        tools=("read", "grep"),
        extensions=("/ext/a.ts", "b.ts"),
        append_system_prompt="be brief",
        accepts_worktree_lane=True,
    )
    tail = [
        "--session", "/s/f.jsonl", "--model", "anthropic/claude-x", "--thinking", "high", "--tools",
        "read,grep", "--no-extensions", "-e", "/ext/a.ts", "-e", "b.ts", "--append-system-prompt", "be brief",
        "--worktree-lane", "lane-1",
    ]  # fmt: skip
    build = agent_command
    assert build(full, task="T", session_file="/s/f.jsonl", lane="lane-1").argv == ("pi", *tail, "T")
    printing = attrs.evolve(full, mode=Mode.PRINT)
    assert build(printing, task="T", session_file="/s/f.jsonl", lane="lane-1").argv == (
        "pi",
        "-p",
        *tail,
        "T",
    )
    rpc = build(attrs.evolve(full, mode=Mode.RPC), task="T", session_file="/s/f.jsonl", lane="lane-1")
    assert rpc == AgentCommand(("pi", "--mode", "rpc", *tail), rpc_prompt="T")
    assert build(make(), task=None, session_file=None).argv == ("pi", "--no-extensions")
    bare = build(make(tools=()), task="T", session_file=None).argv
    assert bare == ("pi", "--no-tools", "--no-extensions", "T")
    # The lane flag only when the CLI takes it and there is a lane.
    assert "--worktree-lane" not in build(make(), task="T", session_file=None, lane="l").argv
    assert "--worktree-lane" not in build(full, task="T", session_file=None).argv


@pytest.mark.parametrize(
    ("provider", "interactive", "printing"),
    [
        ("claude", ["--model", "M", "T"], ["-p", "--model", "M", "T"]),
        ("codex", ["--model", "M", "T"], ["exec", "--model", "M", "T"]),
        ("opencode", ["--model", "M", "--prompt", "T"], ["run", "--model", "M", "T"]),
        ("agy", ["--model", "M", "--prompt-interactive", "T"], ["--model", "M", "-p", "T"]),
    ],
)
def test_other_providers_argv(provider: str, interactive: list[str], printing: list[str]) -> None:
    profile = make(provider=provider, command=(provider,), model="M")
    # The session file and lane are pi's; the other CLIs keep their own sessions.
    built = agent_command(profile, task="T", session_file="/s/f.jsonl", lane="l")
    assert built == AgentCommand((provider, *interactive))
    built = agent_command(attrs.evolve(profile, mode=Mode.PRINT), task="T", session_file=None)
    assert built.argv == (provider, *printing)
    plain = [w for w in interactive if w not in ("--model", "M")]
    assert agent_command(attrs.evolve(profile, model=None), task="T", session_file=None).argv == (
        provider,
        *plain,
    )
    assert agent_command(profile, task=None, session_file=None).argv == (provider, "--model", "M")


def test_custom_argv_fills_placeholders_or_appends_the_task() -> None:
    slot = make(provider="custom", command=("{python}", "run.py", "--task", "{task}", "--again", "{task}"))
    assert agent_command(slot, task="T", session_file="/s", python="/py").argv == (
        "/py", "run.py", "--task", "T", "--again", "T",
    )  # fmt: skip
    assert agent_command(slot, task=None, session_file=None, python="/py").argv == (
        "/py",
        "run.py",
        "--task",
        "--again",
    )
    appended = make(provider="custom", command=("tool", "go"), accepts_worktree_lane=True)
    assert agent_command(appended, task="-T", session_file=None, lane="l").argv == (
        "tool", "go", "--worktree-lane", "l", "-T",
    )  # fmt: skip


def test_a_one_word_argv_for_a_task_is_refused() -> None:
    # tmux would run a one-word command through `sh -c`. Loading refuses the only way to get
    # one (a custom command that is just "{task}"), so this forges a profile past its checks.
    profile = make(provider="custom", command=("{python}", "x"))
    object.__setattr__(profile, "command", ("{task}",))
    with pytest.raises(ProfileError, match=r"test\.toml: profile\.command: builds a one-word argv"):
        agent_command(profile, task="T", session_file=None)
    assert agent_command(make(), task=None, session_file=None).argv == ("pi", "--no-extensions")  # no task


def test_python_placeholder_defaults_to_this_interpreter() -> None:
    profile = make(command=("{python}", "-m", "x"))
    assert agent_command(profile, task="T", session_file=None).argv[0] == sys.executable


@pytest.mark.parametrize("task", HOSTILE_TASKS)
@pytest.mark.parametrize("provider", ["pi", "claude", "codex", "opencode", "agy", "custom"])
def test_hostile_task_text_is_one_argv_word_verbatim(provider: str, task: str) -> None:
    profile = make(provider=provider, command=(provider, "x") if provider == "custom" else (provider,))
    argv = agent_command(profile, task=task, session_file=None).argv
    assert argv[-1] == task and argv.count(task) == 1


@pytest.mark.parametrize("task", HOSTILE_TASKS)
def test_hostile_task_reaches_a_real_process_unchanged(task: str, agent_dir: Path) -> None:
    argv = agent_command(load_profiles().profile("custom"), task=task, session_file=None).argv
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.strip() == repr([task])


def test_rpc_prompt_carries_the_task_outside_argv() -> None:
    profile = make(mode=Mode.RPC)
    task = "-starts with a dash and @has an at\n$(id)"
    command = agent_command(profile, task=task, session_file="/s.jsonl")
    argv = ("pi", "--mode", "rpc", "--session", "/s.jsonl", "--no-extensions")
    assert command == AgentCommand(argv, rpc_prompt=task)
    assert agent_command(profile, task=None, session_file=None).rpc_prompt is None


@pytest.mark.parametrize("provider", ["pi", "claude", "codex", "opencode", "agy"])
def test_a_task_a_cli_would_read_as_a_flag_is_refused(provider: str) -> None:
    profile = make(provider=provider, command=(provider,))
    with pytest.raises(
        ContractError, match=rf"^task: starts with '-' \(the {provider} CLI would read it as a flag"
    ):
        agent_command(profile, task="--help", session_file=None)


def test_pi_refuses_a_task_it_would_read_as_a_file_and_bad_inputs() -> None:
    with pytest.raises(ContractError, match=r"task: starts with '@' \(pi reads it as a file to attach\)"):
        agent_command(make(), task="@secrets.txt", session_file=None)
    assert (
        agent_command(make(provider="claude", command=("claude",)), task="@x", session_file=None).argv[-1]
        == "@x"
    )
    with pytest.raises(ContractError, match=r"task: contains a NUL"):
        agent_command(make(), task="a\0b", session_file=None)
    with pytest.raises(ContractError, match=r"task: is \d+ bytes, over"):
        agent_command(make(), task="x" * (128 * 1024), session_file=None)
    with pytest.raises(ContractError, match=r"sessionFile: 'rel\.jsonl' is relative"):
        agent_command(make(), task="T", session_file="rel.jsonl")
    with pytest.raises(ContractError, match=r"lane: '\.\./x' is not a valid id"):
        agent_command(make(), task="T", session_file=None, lane="../x")
    with pytest.raises(ContractError, match=r"task: missing for print-mode profile 'p'"):
        agent_command(make(mode=Mode.PRINT), task=None, session_file=None)


# --- the stand-in under the pi argv builder -----------------------------------------------------------
def standin_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PI_MATRIX_")}
    env.update(STANDIN_STEP_S="0.01", STANDIN_STEPS="2", **extra)
    return env


def test_the_standin_takes_pi_flags_and_prints_the_done_marker(tmp_path: Path, agent_dir: Path) -> None:
    stand_in = attrs.evolve(
        load_profiles().profile("stand-in"),
        mode=Mode.PRINT,
        model="m/x",
        thinking="low",
        tools=("read", "grep"),
        extensions=("a.ts", "b.ts"),
        append_system_prompt="be brief",
        accepts_worktree_lane=True,
    )
    session = tmp_path / "s.jsonl"
    argv = agent_command(stand_in, task="quick job", session_file=str(session), lane="lane-1").argv
    assert {"--model", "--thinking", "--tools", "-e", "--append-system-prompt", "--worktree-lane"} <= set(
        argv
    )
    done = subprocess.run(
        argv,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env=standin_env(PI_MATRIX_DONE_MARKER="DONE:n0nce"),
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "stand-in: working on: quick job" in lines  # no flag value leaked into the task
    assert lines[-2:] == ["DONE", "DONE:n0nce"]
    assert '"done: quick job\\nDONE:n0nce"' in session.read_text()

    no_tools = agent_command(attrs.evolve(stand_in, tools=()), task="again", session_file=None).argv
    assert "--no-tools" in no_tools
    done = subprocess.run(
        no_tools, check=False, capture_output=True, text=True, timeout=60, env=standin_env()
    )
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "DONE"  # no marker env: as before


def test_the_standin_prints_the_blocked_marker_with_a_reason(agent_dir: Path) -> None:
    argv = agent_command(
        attrs.evolve(load_profiles().profile("stand-in"), mode=Mode.PRINT),
        task="BLOCKED on x",
        session_file=None,
    ).argv
    env = standin_env(PI_MATRIX_DONE_MARKER="DONE:k", PI_MATRIX_BLOCKED_MARKER="BLOCKED:k")
    done = subprocess.run(
        [*argv, "--no-session"], check=False, capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("BLOCKED:k ") and len(lines[-1]) > len("BLOCKED:k ")
    assert "DONE:k" not in lines


def test_standin_follow_up_prompts_switch_the_markers(capsys: pytest.CaptureFixture[str]) -> None:
    agent = standin.Agent(standin.Session(None), emit_rpc=False)
    agent.step_s = 0.0
    agent.done_marker, agent.blocked_marker = "DONE:one", "BLOCKED:one"
    assert agent.turn("first") == 0
    assert agent.turn("second\n\nwhen done print...\n[pi-matrix] marker code two\n") == 0
    assert agent.turn("third") == 0
    assert agent.turn("BLOCKED fourth") == 2
    lines = capsys.readouterr().out.splitlines()
    markers = [line for line in lines if line.startswith(("DONE:", "BLOCKED:"))]
    assert markers == ["DONE:one", "DONE:two", "DONE:two", "BLOCKED:two the task says BLOCKED"]


def test_standin_interactive_takes_markers_from_a_mailbox_follow_up(tmp_path: Path, agent_dir: Path) -> None:
    mailbox = tmp_path / "mailbox.jsonl"
    mailbox.touch()
    argv = agent_command(load_profiles().profile("stand-in"), task="start", session_file=None).argv
    env = standin_env(PI_MATRIX_DONE_MARKER="DONE:r1", PI_MATRIX_MAILBOX=str(mailbox))
    child = subprocess.Popen(
        [*argv, "--no-session"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, env=env
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert child.stdout is not None
        for line in child.stdout:
            lines.put(line.rstrip("\n"))

    threading.Thread(target=pump, daemon=True).start()

    def wait_line(wanted: str) -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            try:
                if lines.get(timeout=0.5) == wanted:
                    return
            except queue.Empty:
                continue
        raise AssertionError(f"no line {wanted!r} within 30 s")

    def post(kind: str, message: str) -> None:
        with open(mailbox, "a", encoding="utf-8") as handle:
            handle.write(json.dumps({"type": kind, "message": message}) + "\n")

    try:
        wait_line("DONE:r1")
        post("prompt", "more work\n\nWhen finished, print ...\n[pi-matrix] marker code r2")
        wait_line("DONE:r2")
        post("prompt", "and more")  # no marker line: the last round's markers again
        wait_line("DONE:r2")
        post("shutdown", "")
        assert child.wait(timeout=30) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


# --- packaging ----------------------------------------------------------------------------------------
def test_the_shipped_dir_is_the_installed_resource_package() -> None:
    import pi_tmux_matrix.launch_profiles as package

    assert Path(str(shipped_dir())) == Path(package.__file__).parent
    assert sorted(p.name for p in Path(str(shipped_dir())).glob("*.toml")) == [
        f"{n}.toml" for n in SHIPPED_PROFILES
    ]


def test_pyproject_lists_every_subpackage() -> None:
    # packages is an explicit list (for the launch_profiles mapping): a new one must be listed.
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    on_disk = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "pi_tmux_matrix").rglob("__init__.py")
    }
    assert on_disk <= set(config["packages"])
    assert config["package-dir"]["pi_tmux_matrix.launch_profiles"] == "launch_profiles"


def test_a_built_wheel_ships_the_profiles_and_loads_them_outside_the_checkout(tmp_path: Path) -> None:
    # A normal (non-editable) install: build the wheel from a copy of the sources (so no build/
    # lands in the checkout), unpack it, and import it from outside the checkout.
    source = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("pi_tmux_matrix", "launch_profiles"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    build = subprocess.run(  # noqa: PLW1510 - the returncode is asserted with pip's stderr
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(wheels),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if build.returncode != 0 and "satisfies the requirement setuptools" in build.stderr:
        pytest.skip("the build backend (setuptools from PyPI) cannot be fetched here")
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(tmp_path / "site")
    assert "pi_tmux_matrix/launch_profiles/stand-in.toml" in names
    assert "pi_tmux_matrix/launch_profiles/teams/impl-review.toml" in names
    assert not any(name.startswith("launch_profiles/") for name in names)
    probe = (
        "import json, pi_tmux_matrix\n"
        "from pi_tmux_matrix.dispatch.profile import load_profiles, shipped_dir\n"
        "s = load_profiles()\n"
        "print(json.dumps([pi_tmux_matrix.__file__, str(shipped_dir()), s.names(), s.team_names()]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    module, shipped, names, teams = json.loads(out.stdout)
    assert module.startswith(str(tmp_path / "site")) and shipped.startswith(str(tmp_path / "site"))
    assert names == SHIPPED_PROFILES and teams == SHIPPED_TEAMS


def test_profiles_say_plainly_what_is_confined_and_bash_is_never_confined() -> None:
    """Issue 16.5: every shipped profile whose tools include bash says so in its description, and
    ``profiles --json`` (the tool's list_profiles) carries the confinement of each."""
    shipped = load_profiles(None)
    for name in shipped.names():
        profile = shipped.profile(name)
        if profile.tools is not None and "bash" in profile.tools:
            assert "full rights" in profile.description, name
    assert shipped.profile("pi-worker").confinement == "confined: paths (bash not confined)"
    assert shipped.profile("pi-reviewer").confinement == "confined: paths and tools"
    assert shipped.profile("claude").confinement == "not confined"
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "profiles", "--json"],
        capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    rows = {row["name"]: row for row in json.loads(done.stdout)["profiles"]}
    assert rows["pi-rpc-worker"]["confined"] == "confined: paths (bash not confined)"
