"""The env + CLI flag contract (seed 000): parsing, rendering, and hostile values.

Bad ``PI_PARENT_PID`` never crashes (one warning, the process is a master); a bad
``PI_WORKER_ALLOWED_PATHS`` always fails startup naming the variable, and is never partly taken.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pi_tmux_matrix.contract import (
    ENV_AGENT_ID,
    ENV_ALLOWED_PATHS,
    ENV_PARENT_PID,
    ENV_PARENT_SESSION,
    ENV_TASK_REF,
    ENV_WORKTREE_LANE,
)
from pi_tmux_matrix.errors import ContractError, InvalidId
from pi_tmux_matrix.identity import Role
from pi_tmux_matrix.launch_contract import (
    ALLOWED_PATHS_MAX_BYTES,
    ALLOWED_PATHS_MAX_ITEMS,
    PID_LIMIT,
    LaunchContract,
    add_contract_arguments,
    contract_from_args,
    parse_allowed_paths,
    parse_env,
    parse_parent_pid,
    path_allowed,
)

LOGGER = "pi_tmux_matrix.launch_contract"
HYPOTHESIS = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

ROUND_TRIP = settings(HYPOTHESIS, max_examples=200)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def collected() -> Iterator[list[logging.LogRecord]]:
    """Records of the contract logger, for Hypothesis tests (no function-scoped caplog)."""
    logger = logging.getLogger(LOGGER)
    handler = _Collect()
    logger.addHandler(handler)
    try:
        yield handler.records
    finally:
        logger.removeHandler(handler)


def parser() -> argparse.ArgumentParser:
    result = argparse.ArgumentParser(prog="pi")
    add_contract_arguments(result)
    return result


# --- defaults and a valid worker -------------------------------------------------------------


def test_empty_env_is_a_master_with_full_scope(caplog: pytest.LogCaptureFixture) -> None:
    contract = parse_env({})
    assert contract == LaunchContract()
    assert contract.role is Role.MASTER
    assert contract.allowed_paths == ()
    assert warnings_of(caplog) == []


def test_parse_env_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PARENT_PID, "4242")
    monkeypatch.setenv(ENV_PARENT_SESSION, "parent-s")
    monkeypatch.setenv(ENV_ALLOWED_PATHS, '["/work/repo"]')
    contract = parse_env()
    assert contract.parent_pid == 4242
    assert contract.parent_session == "parent-s"
    assert contract.allowed_paths == ("/work/repo",)


def test_valid_env_is_a_worker(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        ENV_PARENT_PID: "1234",
        ENV_PARENT_SESSION: "019a-parent",
        ENV_AGENT_ID: "orch.agent-1",
        ENV_TASK_REF: "goal:42#step@v+1/x",
        ENV_WORKTREE_LANE: "lane-1",
        ENV_ALLOWED_PATHS: '["/work/repo", "/tmp/scratch/"]',
    }
    contract = parse_env(env)
    assert contract == LaunchContract(
        parent_pid=1234,
        parent_session="019a-parent",
        agent_id="orch.agent-1",
        task_ref="goal:42#step@v+1/x",
        allowed_paths=("/work/repo", "/tmp/scratch"),
        worktree_lane="lane-1",
    )
    assert contract.role is Role.WORKER
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("raw", ["1", "12", "4194303", "0012", "0000000001", "<own pid>"])
def test_valid_parent_pid(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    # The test's own pid is filled in here, not in the id: parallel runners collect the same ids.
    raw = str(os.getpid()) if raw == "<own pid>" else raw
    contract = parse_env({ENV_PARENT_PID: raw})
    assert contract.parent_pid == int(raw)
    assert contract.role is Role.WORKER
    assert warnings_of(caplog) == []


@pytest.mark.parametrize("raw", [" 12 ", "\t12\n", "12\n"])
def test_parent_pid_surrounding_whitespace_is_stripped(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    # Current behaviour: surrounding whitespace (a stray newline from `$(cat pidfile)`) is
    # tolerated; the digits themselves must still be plain ASCII.
    assert parse_env({ENV_PARENT_PID: raw}).parent_pid == 12
    assert warnings_of(caplog) == []


MALFORMED_PIDS = [
    "abc",
    "-1",
    "0",
    "00",
    "-0",
    "1e3",
    "12.0",
    "0x10",
    "+12",
    "1_000",
    "12abc",
    "1 2",
    " ",
    "\0",
    "12\0",
    "\u0661\u0662",  # Arabic-Indic digits
    "\uff11\uff12",  # fullwidth digits
    "\u00b2",  # superscript two: str.isdigit() says True
    str(PID_LIMIT),  # 4194304
    str(PID_LIMIT + 1),
    "2147483648",
    "99999999999",
    "00000000001",  # 11 characters
    "9" * 5000,
    "1" * 10_000,
    "nan",
    "None",
    "true",
]


@pytest.mark.parametrize("raw", MALFORMED_PIDS)
def test_malformed_parent_pid_is_ignored_with_one_warning(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    contract = parse_env({ENV_PARENT_PID: raw, ENV_PARENT_SESSION: "parent-s"})
    assert contract.parent_pid is None
    assert contract.role is Role.MASTER
    # A master records no parent session, even a valid one.
    assert contract.parent_session is None
    records = warnings_of(caplog)
    assert len(records) == 1
    message = records[0].getMessage()
    assert ENV_PARENT_PID in message
    assert "master" in message
    assert len(message) < 400  # the hostile value is cut, never echoed whole


def test_empty_parent_pid_is_unset_without_warning(caplog: pytest.LogCaptureFixture) -> None:
    assert parse_env({ENV_PARENT_PID: ""}).role is Role.MASTER
    assert warnings_of(caplog) == []


def test_parse_parent_pid_names_its_source(caplog: pytest.LogCaptureFixture) -> None:
    assert parse_parent_pid("x", "--parent-pid") is None
    assert parse_parent_pid(None) is None
    (record,) = warnings_of(caplog)
    assert "--parent-pid" in record.getMessage()


@pytest.mark.parametrize("raw", ["../x", "a/b", "a\nb", "", ".hidden", "x" * 129])
def test_bad_parent_session_is_dropped_with_a_warning(raw: str, caplog: pytest.LogCaptureFixture) -> None:
    contract = parse_env({ENV_PARENT_PID: "77", ENV_PARENT_SESSION: raw})
    assert contract.parent_pid == 77
    assert contract.role is Role.WORKER
    assert contract.parent_session is None
    assert len(warnings_of(caplog)) == (0 if raw == "" else 1)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        (ENV_AGENT_ID, "../agent"),
        (ENV_AGENT_ID, "a/b"),
        (ENV_AGENT_ID, "a\nb"),
        (ENV_TASK_REF, "/goal"),
        (ENV_TASK_REF, "a b"),
        (ENV_TASK_REF, "x" * 257),
        (ENV_WORKTREE_LANE, ".."),
        (ENV_WORKTREE_LANE, "lane/1"),
    ],
)
def test_bad_ids_fail_naming_the_variable(name: str, value: str) -> None:
    with pytest.raises(InvalidId) as info:
        parse_env({name: value})
    assert info.value.field == name
    assert name in str(info.value)


# --- PI_WORKER_ALLOWED_PATHS ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, ()),
        ("", ()),
        ("[]", ()),
        (" [ ] ", ()),
        ('["/"]', ("/",)),
        ('["/work/repo"]', ("/work/repo",)),
        ('["/work/repo/"]', ("/work/repo",)),
        ('["/a", "/b/c", "/d-e/f.g"]', ("/a", "/b/c", "/d-e/f.g")),
        ('["/caf\\u00e9"]', ("/café",)),
        ('["/a b/c"]', ("/a b/c",)),
    ],
)
def test_allowed_paths_valid(raw: str | None, expected: tuple[str, ...]) -> None:
    assert parse_allowed_paths(raw) == expected
    env = {} if raw is None else {ENV_ALLOWED_PATHS: raw}
    assert parse_env(env).allowed_paths == expected


def test_allowed_paths_at_the_limits_are_accepted() -> None:
    many = [f"/p/{i}" for i in range(ALLOWED_PATHS_MAX_ITEMS)]
    assert parse_allowed_paths(json.dumps(many)) == tuple(many)
    filler = "a" * (ALLOWED_PATHS_MAX_BYTES - len('["/"]'))
    exact = json.dumps(["/" + filler])
    assert len(exact.encode()) == ALLOWED_PATHS_MAX_BYTES
    assert parse_allowed_paths(exact) == ("/" + filler,)


MALFORMED_ALLOWED = {
    "not-json": "not json",
    "bare-path": "/work/repo",
    "truncated": '["/a"',
    "trailing": '["/a"] x',
    "single-quotes": "['/a']",
    "object": '{"path": "/a"}',
    "empty-object": "{}",
    "string": '"/a"',
    "null": "null",
    "number": "1",
    "true": "true",
    "nested": '[["/a"]]',
    "nested-object": '[{"p": "/a"}]',
    "int-item": "[1]",
    "null-item": "[null]",
    "bool-item": '["/a", true]',
    "empty-item": '[""]',
    "relative": '["work/repo"]',
    "dot-relative": '["./a"]',
    "tilde": '["~/a"]',
    "dotdot": '["/a/../b"]',
    "dotdot-root": '["/.."]',
    "dotdot-tail": '["/a/.."]',
    "dot": '["/a/./b"]',
    "double-slash": '["/a//b"]',
    "leading-double-slash": '["//a"]',
    "one-bad-among-good": '["/a", "/b", "c", "/d"]',
    "escaped-nul": '["/a\\u0000b"]',
    "raw-nul": '["/a\0b"]',
    "nul-outside-string": '["/a"]\0',
    "nan": "[NaN]",
    "nan-path": '["/a", NaN]',
    "infinity": "[Infinity]",
    "neg-infinity": "[-Infinity]",
    "huge-float": "[1e400]",
    "too-deep": "[" * 40 + "]" * 40,
    "too-big": json.dumps(["/" + "a" * ALLOWED_PATHS_MAX_BYTES]),
    "too-many": json.dumps([f"/p/{i}" for i in range(ALLOWED_PATHS_MAX_ITEMS + 1)]),
    "dup-key-object": '{"a": "/x", "a": "/y"}',
    "bom": "\ufeff[]",
    "lone-bracket": "[",
}


@pytest.mark.parametrize("raw", list(MALFORMED_ALLOWED.values()), ids=list(MALFORMED_ALLOWED))
def test_malformed_allowed_paths_fail_naming_the_variable(raw: str) -> None:
    with pytest.raises(ContractError) as info:
        parse_allowed_paths(raw)
    assert info.value.field == ENV_ALLOWED_PATHS
    assert str(info.value).startswith("PI_WORKER_ALLOWED_PATHS: ")
    assert len(str(info.value)) < 600
    # The same failure at startup, through the env.
    with pytest.raises(ContractError) as again:
        parse_env({ENV_PARENT_PID: "12", ENV_ALLOWED_PATHS: raw})
    assert again.value.field == ENV_ALLOWED_PATHS


def test_allowed_paths_huge_integer_item_is_a_contract_error() -> None:
    # Regression: int()'s 4300-digit limit used to escape as a bare ValueError.
    with pytest.raises(ContractError) as info:
        parse_allowed_paths("[" + "1" * 5000 + "]")
    assert info.value.field == ENV_ALLOWED_PATHS


def test_allowed_paths_cap_is_in_bytes() -> None:
    # Regression: the cap used to count characters, so 40,000 two-byte characters passed.
    raw = json.dumps(["/" + "\u00e9" * 40_000], ensure_ascii=False)
    assert len(raw) < ALLOWED_PATHS_MAX_BYTES < len(raw.encode())
    with pytest.raises(ContractError):
        parse_allowed_paths(raw)


# --- path_allowed -----------------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    for name in ("p", "p/sub", "p-evil", "outside"):
        (tmp_path / name).mkdir()
    (tmp_path / "p" / "file").write_text("x")
    (tmp_path / "outside" / "secret").write_text("x")
    return tmp_path


def test_empty_envelope_is_full_scope(tree: Path) -> None:
    assert path_allowed("/", ())
    assert path_allowed(str(tree / "outside" / "secret"), [])


def test_path_allowed_uses_commonpath(tree: Path) -> None:
    root = str(tree / "p")
    assert path_allowed(root, [root])
    assert path_allowed(str(tree / "p" / "file"), [root])
    assert path_allowed(str(tree / "p" / "sub" / "not-yet-created"), [root])
    assert not path_allowed(str(tree / "p-evil"), [root])
    assert not path_allowed(str(tree / "p-evil" / "x"), [root])
    assert not path_allowed(str(tree), [root])
    assert not path_allowed(str(tree / "p" / ".." / "p-evil"), [root])
    assert not path_allowed(str(tree / "outside" / "secret"), [root])
    assert path_allowed(str(tree / "p" / "sub" / ".." / "file"), [root])
    # trailing slash on the root changes nothing
    assert path_allowed(str(tree / "p" / "file"), [root + "/"])
    assert not path_allowed(str(tree / "p-evil"), [root + "/"])


def test_path_allowed_any_of_several_roots(tree: Path) -> None:
    roots = [str(tree / "outside"), str(tree / "p")]
    assert path_allowed(str(tree / "p" / "file"), roots)
    assert path_allowed(str(tree / "outside" / "secret"), roots)
    assert not path_allowed(str(tree / "p-evil"), roots)


def test_symlink_escaping_an_allowed_root_is_refused(tree: Path) -> None:
    root = str(tree / "p")
    (tree / "p" / "escape").symlink_to(tree / "outside")
    (tree / "p" / "escape-file").symlink_to(tree / "outside" / "secret")
    (tree / "p" / "dangling").symlink_to(tree / "outside" / "missing")
    assert not path_allowed(str(tree / "p" / "escape"), [root])
    assert not path_allowed(str(tree / "p" / "escape" / "secret"), [root])
    assert not path_allowed(str(tree / "p" / "escape-file"), [root])
    assert not path_allowed(str(tree / "p" / "dangling"), [root])
    assert not path_allowed(str(tree / "p" / "escape" / "new-file"), [root])


def test_symlink_staying_inside_is_allowed(tree: Path) -> None:
    root = str(tree / "p")
    (tree / "p" / "alias").symlink_to(tree / "p" / "sub")
    assert path_allowed(str(tree / "p" / "alias" / "x"), [root])


def test_symlinked_root_is_compared_on_real_paths(tree: Path) -> None:
    (tree / "link-to-p").symlink_to(tree / "p")
    assert path_allowed(str(tree / "p" / "file"), [str(tree / "link-to-p")])
    assert path_allowed(str(tree / "link-to-p" / "file"), [str(tree / "p")])
    assert not path_allowed(str(tree / "p-evil"), [str(tree / "link-to-p")])


def test_symlink_from_outside_into_the_root_is_allowed(tree: Path) -> None:
    (tree / "outside" / "into-p").symlink_to(tree / "p")
    assert path_allowed(str(tree / "outside" / "into-p" / "file"), [str(tree / "p")])


# --- flags --------------------------------------------------------------------------------------


def test_flags_override_env(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        ENV_PARENT_PID: "111",
        ENV_PARENT_SESSION: "env-session",
        ENV_AGENT_ID: "env-agent",
        ENV_TASK_REF: "env-task",
        ENV_WORKTREE_LANE: "env-lane",
        ENV_ALLOWED_PATHS: '["/env"]',
    }
    args = parser().parse_args(
        [
            "--parent-pid",
            "222",
            "--parent-session",
            "flag-session",
            "--agent-id",
            "flag-agent",
            "--task-ref",
            "flag-task",
            "--worktree-lane",
            "flag-lane",
        ]
    )
    contract = contract_from_args(args, env)
    assert contract == LaunchContract(
        parent_pid=222,
        parent_session="flag-session",
        agent_id="flag-agent",
        task_ref="flag-task",
        worktree_lane="flag-lane",
        allowed_paths=("/env",),  # launch-only: env is the only channel
    )
    assert warnings_of(caplog) == []


def test_env_fills_in_missing_flags() -> None:
    env = {ENV_PARENT_PID: "111", ENV_PARENT_SESSION: "env-session", ENV_TASK_REF: "env-task"}
    contract = contract_from_args(parser().parse_args(["--lane", "l1"]), env)
    assert contract.parent_pid == 111
    assert contract.parent_session == "env-session"
    assert contract.task_ref == "env-task"
    assert contract.worktree_lane == "l1"


def test_contract_from_args_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_PARENT_PID, "31")
    assert contract_from_args(parser().parse_args([])).parent_pid == 31


def test_malformed_pid_flag_wins_over_valid_env(caplog: pytest.LogCaptureFixture) -> None:
    contract = contract_from_args(parser().parse_args(["--parent-pid", "abc"]), {ENV_PARENT_PID: "5"})
    assert contract.parent_pid is None
    assert contract.role is Role.MASTER
    (record,) = warnings_of(caplog)
    assert "--parent-pid" in record.getMessage()


def test_empty_flag_clears_env_value(caplog: pytest.LogCaptureFixture) -> None:
    contract = contract_from_args(parser().parse_args(["--parent-pid", ""]), {ENV_PARENT_PID: "5"})
    assert contract.parent_pid is None
    assert warnings_of(caplog) == []


def test_bad_flag_id_names_the_flag() -> None:
    with pytest.raises(InvalidId) as info:
        contract_from_args(parser().parse_args(["--task-ref", "/x"]), {})
    assert info.value.field == "--task-ref"
    with pytest.raises(InvalidId) as info:
        contract_from_args(parser().parse_args(["--lane", "../x"]), {})
    assert info.value.field == "--worktree-lane"


def test_contract_from_args_on_a_bare_namespace() -> None:
    assert contract_from_args(argparse.Namespace(), {ENV_PARENT_PID: "9"}).parent_pid == 9


def test_malformed_allowed_paths_fail_through_args_too() -> None:
    with pytest.raises(ContractError) as info:
        contract_from_args(parser().parse_args([]), {ENV_ALLOWED_PATHS: '["rel"]'})
    assert info.value.field == ENV_ALLOWED_PATHS


# --- rendering and round trips --------------------------------------------------------------


def test_to_env_always_sets_the_path_channel() -> None:
    assert LaunchContract().to_env() == {ENV_ALLOWED_PATHS: "[]"}
    assert LaunchContract().to_args() == []


ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,40}", fullmatch=True)
task_refs = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:#@+/-]{0,60}", fullmatch=True)
segments = st.text(st.characters(codec="utf-8", exclude_characters="/\0"), min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)
abs_paths = st.lists(segments, max_size=4).map(lambda parts: "/" + "/".join(parts))


@st.composite
def contracts(draw: st.DrawFn) -> LaunchContract:
    pid = draw(st.none() | st.integers(1, PID_LIMIT - 1))
    return LaunchContract(
        parent_pid=pid,
        parent_session=None if pid is None else draw(st.none() | ids),
        agent_id=draw(st.none() | ids),
        task_ref=draw(st.none() | task_refs),
        allowed_paths=tuple(draw(st.lists(abs_paths, max_size=5))),
        worktree_lane=draw(st.none() | ids),
    )


@ROUND_TRIP
@given(contract=contracts())
def test_env_round_trip(contract: LaunchContract) -> None:
    with collected() as records:
        assert parse_env(contract.to_env()) == contract
    assert records == []


@ROUND_TRIP
@given(contract=contracts())
def test_args_round_trip(contract: LaunchContract) -> None:
    # Flags carry what they can; launch-only values (agent id, allowed paths) stay in env.
    env = {k: v for k, v in contract.to_env().items() if k in (ENV_AGENT_ID, ENV_ALLOWED_PATHS)}
    args = parser().parse_args(contract.to_args())
    assert contract_from_args(args, env) == contract


def test_env_round_trip_through_a_real_child_process() -> None:
    contract = LaunchContract(
        parent_pid=os.getpid(),
        parent_session="parent-1",
        agent_id="agent-1",
        task_ref="goal:1#a",
        allowed_paths=("/work/repo", "/tmp/caf\u00e9"),
        worktree_lane="lane-1",
    )
    code = (
        "import json; from pi_tmux_matrix.launch_contract import parse_env; c = parse_env(); "
        "print(json.dumps([c.parent_pid, c.parent_session, c.agent_id, c.task_ref, "
        "list(c.allowed_paths), c.worktree_lane, c.role.value]))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PI_")}
    env.update(contract.to_env())
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == [
        os.getpid(),
        "parent-1",
        "agent-1",
        "goal:1#a",
        ["/work/repo", "/tmp/caf\u00e9"],
        "lane-1",
        "worker",
    ]


# --- hostile text for every variable ------------------------------------------------------------

any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=200)
digitish = st.text(st.sampled_from(list("0123456789 -+.eE_x\t\n\0\u0661\uff11\u00b2")), max_size=14)
jsonish = st.one_of(
    st.lists(
        st.one_of(any_text, st.integers(), st.none(), st.booleans(), st.floats(allow_nan=False)), max_size=5
    ).map(json.dumps),
    st.lists(st.text(st.sampled_from(list("/.a\0 \\")), max_size=8), max_size=5).map(json.dumps),
    st.recursive(st.none() | st.text(max_size=5), lambda c: st.lists(c, max_size=3), max_leaves=8).map(
        json.dumps
    ),
    st.text(st.sampled_from(list('[]{}",:/.a0NaIfiny\\u ')), max_size=30),
)


@HYPOTHESIS
@given(raw=st.one_of(any_text, digitish))
def test_any_parent_pid_never_raises(raw: str) -> None:
    with collected() as records:
        contract = parse_env({ENV_PARENT_PID: raw})
        direct = parse_parent_pid(raw)
    assert contract.parent_pid == direct
    if contract.parent_pid is None:
        assert contract.role is Role.MASTER
        assert len(records) == (0 if raw == "" else 2)  # one per parse
    else:
        assert 0 < contract.parent_pid < PID_LIMIT
        assert contract.parent_pid == int(raw.strip())
        assert contract.role is Role.WORKER
        assert records == []


@HYPOTHESIS
@given(raw=any_text)
def test_any_parent_session_never_raises(raw: str) -> None:
    contract = parse_env({ENV_PARENT_PID: "10", ENV_PARENT_SESSION: raw})
    assert contract.parent_session in (None, raw.strip())


@HYPOTHESIS
@given(name=st.sampled_from([ENV_AGENT_ID, ENV_TASK_REF, ENV_WORKTREE_LANE]), raw=any_text)
def test_any_id_variable_raises_only_contract_error(name: str, raw: str) -> None:
    error: ContractError | None = None
    try:
        contract = parse_env({name: raw})
    except ContractError as exc:
        error = exc
    if error is not None:
        assert error.field == name
        return
    value = {
        ENV_AGENT_ID: contract.agent_id,
        ENV_TASK_REF: contract.task_ref,
        ENV_WORKTREE_LANE: contract.worktree_lane,
    }[name]
    # Ids and task refs are taken trimmed (whitespace only is none); a lane as given.
    assert value == ((raw if name == ENV_WORKTREE_LANE else raw.strip()) or None)


@HYPOTHESIS
@given(raw=st.one_of(any_text, jsonish))
def test_any_allowed_paths_raises_only_contract_error(raw: str) -> None:
    error: ContractError | None = None
    try:
        paths = parse_allowed_paths(raw)
    except ContractError as exc:
        error = exc
    if error is not None:
        assert error.field == ENV_ALLOWED_PATHS
        assert "PI_WORKER_ALLOWED_PATHS" in str(error)
        return
    # Accepted: every path absolute, normalised, NUL-free; the whole array was taken.
    assert len(paths) <= ALLOWED_PATHS_MAX_ITEMS
    if raw:
        assert list(paths) == [os.path.normpath(p) for p in json.loads(raw)]
    for path in paths:
        assert path.startswith("/")
        assert "\0" not in path
        assert os.path.normpath(path) == path
