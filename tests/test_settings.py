"""``processMatrix`` settings and the state dir (seed 000, "Settings").

Settings never crash anything: out-of-bounds numbers are clamped, wrong types and unusable files
fall back to the default, each with a warning. Every test writes real files under ``tmp_path``;
the autouse fixture points ``HOME`` and ``PI_CODING_AGENT_DIR`` there.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pi_tmux_matrix.errors import StateDirError
from pi_tmux_matrix.settings import (
    BOUNDS,
    DEFAULTS,
    ForkSettings,
    MatrixSettings,
    agent_dir,
    load_settings,
    resolve_state_dir,
)

LOGGER = "pi_tmux_matrix.settings"
FIELD = {
    "enabled": "enabled",
    "heartbeatMs": "heartbeat_ms",
    "adoptionGraceMs": "adoption_grace_ms",
    "watcherPollMs": "watcher_poll_ms",
    "maxConcurrentAgents": "max_concurrent_agents",
    "maxConcurrentForks": "max_concurrent_forks",
    "eventsMaxBytes": "events_max_bytes",
    "historyRetentionDays": "history_retention_days",
    "forkEnvironment": "fork_environment",
    "masterProjectTrust": "master_project_trust",
}
DEFAULT_SOURCES = dict.fromkeys(FIELD.values(), "default")


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


@pytest.fixture
def agent_file(isolated_env: Path) -> Path:
    path = Path(os.environ["PI_CODING_AGENT_DIR"]) / "settings.json"
    path.parent.mkdir(parents=True)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / ".pi").mkdir(parents=True)
    return root


def write(path: Path, document: Any) -> Path:
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def section(**values: Any) -> dict[str, Any]:
    return {"processMatrix": values}


def assert_defaults(result: MatrixSettings) -> None:
    assert result == MatrixSettings()
    assert result.enabled is True
    assert (result.heartbeat_ms, result.adoption_grace_ms, result.watcher_poll_ms) == (
        30_000,
        300_000,
        25_000,
    )
    assert dict(result.sources) == DEFAULT_SOURCES


def test_seed_defaults_and_bounds() -> None:
    assert DEFAULTS == {
        "enabled": True,
        "heartbeatMs": 30_000,
        "adoptionGraceMs": 300_000,
        "watcherPollMs": 25_000,
        "maxConcurrentAgents": 3,
        "maxConcurrentForks": 3,
        "eventsMaxBytes": 4 * 1024 * 1024,
        "historyRetentionDays": 30,
        "forkEnvironment": {},
        "masterProjectTrust": "pi",
    }
    assert BOUNDS == {
        "heartbeatMs": (30_000, 1_000, 600_000),
        "adoptionGraceMs": (300_000, 5_000, 3_600_000),
        "watcherPollMs": (25_000, 1_000, 600_000),
        "maxConcurrentAgents": (3, 1, 256),
        "maxConcurrentForks": (3, 1, 64),
        "eventsMaxBytes": (4 * 1024 * 1024, 64 * 1024, 1024 * 1024 * 1024),
        "historyRetentionDays": (30, 1, 3650),
    }


def test_defaults_when_no_files(project: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert_defaults(load_settings(cwd=project))
    assert_defaults(load_settings(cwd=project / "does-not-exist"))
    assert warnings_of(caplog) == []


def test_agent_dir_file_applies(agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture) -> None:
    write(agent_file, section(heartbeatMs=2_000, adoptionGraceMs=6_000, watcherPollMs=3_000))
    result = load_settings(cwd=project)
    assert (result.heartbeat_ms, result.adoption_grace_ms, result.watcher_poll_ms) == (2_000, 6_000, 3_000)
    assert result.enabled is True
    assert dict(result.sources) == {
        "enabled": "default",
        "heartbeat_ms": str(agent_file),
        "adoption_grace_ms": str(agent_file),
        "watcher_poll_ms": str(agent_file),
        "max_concurrent_agents": "default",
        "max_concurrent_forks": "default",
        "events_max_bytes": "default",
        "history_retention_days": "default",
        "fork_environment": "default",
        "master_project_trust": "default",
    }
    assert warnings_of(caplog) == []


def test_project_overrides_agent_per_key(agent_file: Path, project: Path) -> None:
    write(agent_file, section(heartbeatMs=2_000, watcherPollMs=3_000, enabled=True))
    project_file = write(project / ".pi" / "settings.json", section(heartbeatMs=4_000))
    result = load_settings(cwd=project)
    assert result.heartbeat_ms == 4_000
    assert result.watcher_poll_ms == 3_000
    assert result.adoption_grace_ms == 300_000
    assert dict(result.sources) == {
        "enabled": str(agent_file),
        "heartbeat_ms": str(project_file),
        "adoption_grace_ms": "default",
        "watcher_poll_ms": str(agent_file),
        "max_concurrent_agents": "default",
        "max_concurrent_forks": "default",
        "events_max_bytes": "default",
        "history_retention_days": "default",
        "fork_environment": "default",
        "master_project_trust": "default",
    }


def test_project_file_alone(project: Path) -> None:
    project_file = write(project / ".pi" / "settings.json", section(adoptionGraceMs=10_000))
    result = load_settings(cwd=str(project))
    assert result.adoption_grace_ms == 10_000
    assert result.sources["adoption_grace_ms"] == str(project_file)


def test_cwd_defaults_to_the_process_cwd(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(project / ".pi" / "settings.json", section(watcherPollMs=7_000))
    monkeypatch.chdir(project)
    assert load_settings().watcher_poll_ms == 7_000


def test_explicit_env_mapping_is_used(tmp_path: Path, project: Path) -> None:
    other = tmp_path / "other-agent"
    other.mkdir()
    write(other / "settings.json", section(heartbeatMs=9_000))
    assert load_settings(cwd=project, env={"PI_CODING_AGENT_DIR": str(other)}).heartbeat_ms == 9_000
    home = tmp_path / "other-home"
    (home / ".pi" / "agent").mkdir(parents=True)
    write(home / ".pi" / "agent" / "settings.json", section(heartbeatMs=8_000))
    assert load_settings(cwd=project, env={"HOME": str(home)}).heartbeat_ms == 8_000


def test_same_file_for_agent_and_project_is_read_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "same"
    (root / ".pi").mkdir(parents=True)
    write(root / ".pi" / "settings.json", section(heartbeatMs=1))
    result = load_settings(cwd=root, env={"PI_CODING_AGENT_DIR": str(root / ".pi")})
    assert result.heartbeat_ms == 1_000
    assert len(warnings_of(caplog)) == 1


def test_other_top_level_keys_are_ignored(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, {"theme": "dark", "models": [1, 2], **section(heartbeatMs=5_000)})
    assert load_settings(cwd=project).heartbeat_ms == 5_000
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("document", [{}, {"processMatrix": None}, {"processMatrix": {}}, {"other": 1}])
def test_absent_or_empty_section_is_silent(
    document: Any, agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, document)
    assert_defaults(load_settings(cwd=project))
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("value", [[], [1], "on", 1, True, 1.5])
def test_section_of_wrong_type_warns(
    value: Any, agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, {"processMatrix": value})
    assert_defaults(load_settings(cwd=project))
    assert len(warnings_of(caplog)) == 1


@pytest.mark.parametrize("document", ["[]", '"x"', "1", "null", "true", '[{"processMatrix": {}}]'])
def test_top_level_not_an_object_warns(
    document: str, agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, document)
    assert_defaults(load_settings(cwd=project))
    assert len(warnings_of(caplog)) == 1


def test_unknown_key_warns_and_the_rest_applies(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, section(heartbeatMS=5_000, watcherPollMs=5_000))
    result = load_settings(cwd=project)
    assert result.heartbeat_ms == 30_000
    assert result.watcher_poll_ms == 5_000
    (record,) = warnings_of(caplog)
    assert "heartbeatMS" in record.getMessage()


# --- bounds -------------------------------------------------------------------------------------

CLAMP_CASES = [
    (key, value)
    for key, (_default, low, high) in BOUNDS.items()
    for value in [low - 1, 0, -1, -(10**18), high + 1, 10**18, 10**300]
]


@pytest.mark.parametrize(("key", "value"), CLAMP_CASES)
def test_out_of_bounds_is_clamped_with_a_warning(
    key: str, value: int, agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _default, low, high = BOUNDS[key]
    write(agent_file, section(**{key: value}))
    result = load_settings(cwd=project)
    assert getattr(result, FIELD[key]) == (low if value < low else high)
    assert result.sources[FIELD[key]] == str(agent_file)
    records = warnings_of(caplog)
    assert len(records) == 1
    assert key in records[0].getMessage()
    assert "clamped" in records[0].getMessage()


@pytest.mark.parametrize(
    ("key", "value"),
    [(key, bound) for key, (_d, low, high) in BOUNDS.items() for bound in (low, high)],
)
def test_bounds_are_inclusive(
    key: str, value: int, agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, section(**{key: value}))
    assert getattr(load_settings(cwd=project), FIELD[key]) == value
    assert warnings_of(caplog) == []


def test_integral_float_is_a_number(agent_file: Path, project: Path) -> None:
    write(agent_file, '{"processMatrix": {"heartbeatMs": 2000.0, "watcherPollMs": 1e3}}')
    result = load_settings(cwd=project)
    assert (result.heartbeat_ms, result.watcher_poll_ms) == (2_000, 1_000)


WRONG_MS = ["30000", "", True, False, None, [], [5_000], {}, {"ms": 5_000}]


@pytest.mark.parametrize("key", list(BOUNDS))
@pytest.mark.parametrize("value", WRONG_MS, ids=repr)
def test_wrong_type_for_ms_is_default_with_a_warning(
    key: str, value: Any, agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, section(**{key: value}))
    result = load_settings(cwd=project)
    assert getattr(result, FIELD[key]) == DEFAULTS[key]
    assert result.sources[FIELD[key]] == "default"
    (record,) = warnings_of(caplog)
    assert key in record.getMessage()


@pytest.mark.parametrize("key", list(BOUNDS))
def test_non_integer_float_is_default_with_a_warning(
    key: str, agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, section(**{key: 10_000.5}))
    result = load_settings(cwd=project)
    assert getattr(result, FIELD[key]) == DEFAULTS[key]
    assert len(warnings_of(caplog)) == 1


@pytest.mark.parametrize("literal", ["1e400", "-1e400"])
def test_overflowing_float_never_raises(literal: str, agent_file: Path, project: Path) -> None:
    write(agent_file, f'{{"processMatrix": {{"heartbeatMs": {literal}}}}}')
    result = load_settings(cwd=project)
    assert 1_000 <= result.heartbeat_ms <= 600_000


def test_huge_integer_literal_never_raises(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Regression: int()'s 4300-digit limit used to escape strictjson as a bare ValueError.
    write(agent_file, f'{{"processMatrix": {{"heartbeatMs": {"9" * 5000}}}}}')
    assert_defaults(load_settings(cwd=project))
    assert len(warnings_of(caplog)) == 1


@pytest.mark.parametrize("value", ["false", "true", 0, 1, None, [], {}, "", 0.0])
def test_wrong_type_for_enabled_is_default_with_a_warning(
    value: Any, agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, section(enabled=value))
    result = load_settings(cwd=project)
    assert result.enabled is True
    assert result.sources["enabled"] == "default"
    (record,) = warnings_of(caplog)
    assert "enabled" in record.getMessage()


def test_enabled_false_is_the_off_switch(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, section(enabled=False))
    result = load_settings(cwd=project)
    assert result.enabled is False
    assert result.sources["enabled"] == str(agent_file)
    assert warnings_of(caplog) == []


def test_project_can_turn_it_off_and_on(agent_file: Path, project: Path) -> None:
    project_file = project / ".pi" / "settings.json"
    write(agent_file, section(enabled=True))
    write(project_file, section(enabled=False))
    assert load_settings(cwd=project).enabled is False
    write(agent_file, section(enabled=False))
    write(project_file, section(enabled=True))
    result = load_settings(cwd=project)
    assert result.enabled is True
    assert result.sources["enabled"] == str(project_file)


def test_bad_project_value_keeps_the_agent_value(agent_file: Path, project: Path) -> None:
    write(agent_file, section(heartbeatMs=2_000))
    write(project / ".pi" / "settings.json", section(heartbeatMs="fast"))
    result = load_settings(cwd=project)
    assert result.heartbeat_ms == 2_000
    assert result.sources["heartbeat_ms"] == str(agent_file)


def test_sources_do_not_affect_equality() -> None:
    assert MatrixSettings(sources={"enabled": "/x"}) == MatrixSettings()


# --- unusable files -------------------------------------------------------------------------------

BAD_FILES: dict[str, bytes] = {
    "invalid-json": b'{"processMatrix": {"heartbeatMs": 2000,}}',
    "truncated": b'{"processMatrix": {"heartbeatMs": 2000',
    "empty": b"",
    "whitespace": b"  \n",
    "duplicate-top-level": b'{"processMatrix": {"heartbeatMs": 2000}, "processMatrix": {}}',
    "duplicate-in-section": b'{"processMatrix": {"heartbeatMs": 2000, "heartbeatMs": 3000}}',
    "nan": b'{"processMatrix": {"heartbeatMs": NaN}}',
    "infinity": b'{"processMatrix": {"heartbeatMs": Infinity}}',
    "neg-infinity": b'{"processMatrix": {"heartbeatMs": -Infinity}}',
    "not-utf8": b'{"processMatrix": {"heartbeatMs": 2000}, "x": "\xff\xfe"}',
    "utf16": '{"processMatrix": {"heartbeatMs": 2000}}'.encode("utf-16"),
    "bom": b'\xef\xbb\xbf{"processMatrix": {"heartbeatMs": 2000}}',
    "too-deep": b'{"processMatrix": {"heartbeatMs": 2000}, "x": ' + b"[" * 100 + b"]" * 100 + b"}",
    "too-big": b'{"processMatrix": {"heartbeatMs": 2000}, "x": "' + b"a" * (1024 * 1024) + b'"}',
    "nul": b'{"processMatrix": {"heartbeatMs": 2000}}\0',
    "comment": b'// settings\n{"processMatrix": {"heartbeatMs": 2000}}',
}


@pytest.mark.parametrize("content", list(BAD_FILES.values()), ids=list(BAD_FILES))
def test_unparseable_file_is_default_with_a_warning(
    content: bytes, agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent_file.write_bytes(content)
    assert_defaults(load_settings(cwd=project))
    (record,) = warnings_of(caplog)
    assert str(agent_file) in record.getMessage()


def test_unparseable_project_file_keeps_agent_values(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, section(heartbeatMs=2_000))
    (project / ".pi" / "settings.json").write_bytes(BAD_FILES["duplicate-in-section"])
    result = load_settings(cwd=project)
    assert result.heartbeat_ms == 2_000
    assert len(warnings_of(caplog)) == 1


def test_directory_named_settings_json(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent_file.mkdir()
    (project / ".pi" / "settings.json").mkdir()
    assert_defaults(load_settings(cwd=project))
    assert len(warnings_of(caplog)) == 2


def test_dangling_symlink_is_absent(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent_file.symlink_to(agent_file.parent / "missing.json")
    assert_defaults(load_settings(cwd=project))
    assert warnings_of(caplog) == []


def test_symlink_loop_warns(agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture) -> None:
    agent_file.symlink_to(agent_file)
    assert_defaults(load_settings(cwd=project))
    assert len(warnings_of(caplog)) == 1


def test_device_that_never_ends_is_capped(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent_file.symlink_to("/dev/zero")
    assert_defaults(load_settings(cwd=project))
    assert len(warnings_of(caplog)) == 1


@pytest.mark.skipif(
    hasattr(os, "geteuid") and os.geteuid() == 0,
    reason="root reads a mode-000 file anyway, so it cannot be made unreadable here",
)
def test_unreadable_file_is_default_with_a_warning(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(agent_file, section(heartbeatMs=2_000))
    agent_file.chmod(0)
    try:
        assert_defaults(load_settings(cwd=project))
    finally:
        agent_file.chmod(0o600)
    assert len(warnings_of(caplog)) == 1


def test_unreadable_parent_dir_never_raises(agent_file: Path, project: Path) -> None:
    # Whether or not root can still read through it, this must not raise.
    write(agent_file, section(heartbeatMs=2_000))
    agent_file.parent.chmod(0)
    try:
        result = load_settings(cwd=project)
    finally:
        agent_file.parent.chmod(0o700)
    assert result.heartbeat_ms in (2_000, 30_000)


def test_fifo_named_settings_json_does_not_block(agent_file: Path, project: Path) -> None:
    os.mkfifo(agent_file)
    code = (
        "import sys; from pi_tmux_matrix.settings import load_settings; "
        "print(load_settings(cwd=sys.argv[1]).heartbeat_ms)"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", code, str(project)],
            capture_output=True,
            text=True,
            timeout=3,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("load_settings blocked on a FIFO")
    assert out.stdout.strip() == "30000"


# --- hostile values, generated ----------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(values=st.dictionaries(st.sampled_from([*DEFAULTS, "other"]), json_values, max_size=5))
def test_any_values_never_raise_and_stay_in_bounds(values: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as root:
        agent = Path(root) / "agent"
        agent.mkdir()
        (agent / "settings.json").write_text(json.dumps({"processMatrix": values}))
        result = load_settings(cwd=root, env={"PI_CODING_AGENT_DIR": str(agent)})
    assert isinstance(result.enabled, bool)
    for key, (_default, low, high) in BOUNDS.items():
        value = getattr(result, FIELD[key])
        assert type(value) is int
        assert low <= value <= high
        raw = values.get(key)
        if type(raw) is int and low <= raw <= high:
            assert value == raw
    if type(values.get("enabled")) is bool:
        assert result.enabled is values["enabled"]


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(content=st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_file_content_never_raises(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as root:
        agent = Path(root) / "agent"
        agent.mkdir()
        (agent / "settings.json").write_bytes(content)
        result = load_settings(cwd=root, env={"PI_CODING_AGENT_DIR": str(agent)})
    assert isinstance(result, MatrixSettings)


# --- directories ---------------------------------------------------------------------------------


def test_agent_dir_precedence(tmp_path: Path) -> None:
    assert agent_dir({"PI_CODING_AGENT_DIR": "/x/agent", "HOME": "/h"}) == Path("/x/agent")
    assert agent_dir({"HOME": "/h"}) == Path("/h/.pi/agent")
    assert agent_dir({"PI_CODING_AGENT_DIR": "", "HOME": "/h"}) == Path("/h/.pi/agent")
    assert agent_dir() == Path(os.environ["PI_CODING_AGENT_DIR"])
    assert agent_dir({"PI_CODING_AGENT_DIR": "~/agent"}) == Path(os.environ["HOME"]) / "agent"
    assert str(tmp_path) in str(agent_dir())


def test_resolve_state_dir_precedence() -> None:
    env = {"PI_MATRIX_STATE_DIR": "/env/state", "PI_CODING_AGENT_DIR": "/agent", "HOME": "/h"}
    assert resolve_state_dir("/cli/state", env) == Path("/cli/state")
    assert resolve_state_dir(None, env) == Path("/env/state")
    with pytest.raises(StateDirError, match="--state-dir is empty"):  # issue 17.18: never the default
        resolve_state_dir("", env)
    del env["PI_MATRIX_STATE_DIR"]
    assert resolve_state_dir(None, env) == Path("/agent/state/process-matrix")
    assert resolve_state_dir(None, {**env, "PI_MATRIX_STATE_DIR": ""}) == Path("/agent/state/process-matrix")
    del env["PI_CODING_AGENT_DIR"]
    assert resolve_state_dir(None, env) == Path("/h/.pi/agent/state/process-matrix")


def test_resolve_state_dir_reads_os_environ(isolated_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = Path(os.environ["PI_CODING_AGENT_DIR"])
    assert resolve_state_dir() == agent / "state" / "process-matrix"
    monkeypatch.delenv("PI_CODING_AGENT_DIR")
    assert resolve_state_dir() == isolated_env / ".pi" / "agent" / "state" / "process-matrix"
    monkeypatch.setenv("PI_MATRIX_STATE_DIR", "/from/env")
    assert resolve_state_dir() == Path("/from/env")
    assert resolve_state_dir("/from/cli") == Path("/from/cli")


def test_resolve_state_dir_expands_user(isolated_env: Path) -> None:
    assert resolve_state_dir("~/s") == isolated_env / "s"
    assert resolve_state_dir(None, {"PI_MATRIX_STATE_DIR": "~/t"}) == isolated_env / "t"


def test_resolving_creates_nothing(isolated_env: Path) -> None:
    before = sorted(p.name for p in isolated_env.iterdir())
    resolve_state_dir()
    load_settings(cwd=isolated_env)
    assert sorted(p.name for p in isolated_env.iterdir()) == before


# --- pi-fork (seed 003's fork config; issue 23) ---------------------------------------------------------
def test_pi_fork_defaults(project: Path) -> None:
    fork = load_settings(cwd=project).fork
    assert fork == ForkSettings()
    assert (fork.cost_footer, fork.extensions, dict(fork.environment)) == (True, (), {})
    assert (fork.default_model, fork.default_thinking) == (None, None)


def test_pi_fork_project_overrides_global_field_by_field(agent_file: Path, project: Path) -> None:
    write(
        agent_file,
        {
            "pi-fork": {
                "costFooter": False,
                "defaultModel": "global/m",
                "defaultThinking": "low",
                "extensions": ["~/ext/a.ts"],
                "environment": {"FROM_GLOBAL": "1", "BOTH": "global"},
            }
        },
    )
    project_file = write(
        project / ".pi" / "settings.json",
        {"pi-fork": {"defaultModel": "project/m", "environment": {"BOTH": "project"}}},
    )
    fork = load_settings(cwd=project).fork
    assert fork.default_model == "project/m"  # the project's wins
    assert fork.default_thinking == "low" and fork.cost_footer is False  # the global's stand
    assert fork.extensions == (str(Path.home() / "ext" / "a.ts"),)
    assert dict(fork.environment) == {"BOTH": "project"}  # a project's environment replaces the global one
    assert fork.sources == {
        "extensions": str(agent_file),
        "environment": str(project_file),
        "cost_footer": str(agent_file),
        "default_model": str(project_file),
        "default_thinking": str(agent_file),
    }


def test_fork_environment_is_an_alias_of_pi_fork_environment(agent_file: Path, project: Path) -> None:
    write(agent_file, section(forkEnvironment={"OLD": "1", "BOTH": "alias"}))
    assert dict(load_settings(cwd=project).fork.environment) == {"OLD": "1", "BOTH": "alias"}
    # Both in one file: merged, pi-fork.environment winning per name.
    alias = section(forkEnvironment={"OLD": "1", "BOTH": "alias"})
    both = {**alias, "pi-fork": {"environment": {"BOTH": "new"}}}
    write(agent_file, both)
    result = load_settings(cwd=project)
    assert dict(result.fork.environment) == {"OLD": "1", "BOTH": "new"}
    assert dict(result.fork_environment) == {"OLD": "1", "BOTH": "alias"}  # the alias's own value, as before
    # A project's alias replaces a global pi-fork.environment like a project's pi-fork.environment would.
    write(project / ".pi" / "settings.json", section(forkEnvironment={"PROJECT": "1"}))
    assert dict(load_settings(cwd=project).fork.environment) == {"PROJECT": "1"}


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("costFooter", "no"),
        ("extensions", "a.ts"),
        ("extensions", ["", "b.ts"]),
        ("environment", {"BAD NAME": "1"}),
        ("defaultModel", "--api-key"),
        ("defaultModel", 3),
        ("defaultThinking", "extreme"),
        ("surprise", 1),
    ],
)
def test_pi_fork_bad_values_are_warned_and_ignored(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture, key: str, value: Any
) -> None:
    write(agent_file, {"pi-fork": {key: value}})
    assert load_settings(cwd=project).fork == ForkSettings()
    (warning,) = warnings_of(caplog)
    assert f"pi-fork.{key}" in warning.getMessage()


def test_runs_fork_settings_shows_what_is_in_force(agent_file: Path, project: Path) -> None:
    write(agent_file, {"pi-fork": {"costFooter": False, "environment": {"SECRET_TOKEN": "s3cr3t"}}})
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "runs", "--fork-settings", "--json"],
        cwd=project, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    assert shown["costFooter"] is False and shown["environment"] == ["SECRET_TOKEN"]
    assert "s3cr3t" not in done.stdout  # names only: values may be secrets


def test_events_max_bytes_is_a_size_in_bytes(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 28.3: each agent's events file rotates at ``eventsMaxBytes``; a wrong value says
    what it must be, in bytes (not milliseconds)."""
    write(agent_file, section(eventsMaxBytes=1_000_000))
    assert load_settings(cwd=project).events_max_bytes == 1_000_000
    write(agent_file, section(eventsMaxBytes="4M"))
    assert load_settings(cwd=project).events_max_bytes == 4 * 1024 * 1024
    (record,) = warnings_of(caplog)
    assert "processMatrix.eventsMaxBytes must be a whole number of bytes, not '4M'" in record.getMessage()


def test_history_retention_days_is_a_number_of_days(
    agent_file: Path, project: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 30.5: history is kept ``historyRetentionDays`` (30 by default, 1 to 3650); a wrong
    value says what it must be, in days, and one out of bounds is clamped."""
    assert load_settings(cwd=project).history_retention_days == 30
    write(agent_file, section(historyRetentionDays=7))
    assert load_settings(cwd=project).history_retention_days == 7
    write(agent_file, section(historyRetentionDays=0))
    assert load_settings(cwd=project).history_retention_days == 1
    write(agent_file, section(historyRetentionDays="1w"))
    assert load_settings(cwd=project).history_retention_days == 30
    messages = [r.getMessage() for r in warnings_of(caplog)]
    assert any("historyRetentionDays=0 is outside 1..3650; clamped to 1" in m for m in messages), messages
    assert any("must be a whole number of days, not '1w'" in m for m in messages), messages
