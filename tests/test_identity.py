"""Ids at the boundary and the agent identity contract.

The property that matters: an id the allowlist accepts can only ever name a file directly inside
the state dir, whatever text it started from.
"""

from __future__ import annotations

import os
import tempfile

import attrs
import pytest
from helpers import make_identity
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pi_tmux_matrix.errors import ContractError, InvalidId
from pi_tmux_matrix.identity import (
    MAX_PATH_CHARS,
    MAX_RESOURCE_POINTERS,
    AgentIdentityContract,
    Mode,
    Role,
    entry_key,
    parse_key,
    validate_id,
    validate_task_ref,
)

HYPOTHESIS = settings(
    max_examples=600,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

ACCEPTED_IDS = [
    "a",
    "Z",
    "0",
    "s1",
    "orch-lane-1.worker",
    "a.b_c-d",
    "a..b",  # ".." inside a name is just part of the file name, never a path component
    "a.",
    "9-",
    "x" * 128,
    "019a3c1e-7f0b-7c5d-8e2a-1b2c3d4e5f60",
]

REJECTED_IDS = [
    "",
    ".",
    "..",
    "...",
    ".hidden",
    "-flag",
    "_a",
    "a/b",
    "/abs",
    "../etc",
    "a\\b",
    "a\0b",
    "\0",
    "a\n",
    "a\nb",
    "\na",
    "a\r",
    "a b",
    " a",
    "a\t",
    "a:b",
    "a*",
    "x" * 129,
    "x" * 10_000,
    # unicode lookalikes of allowed characters
    "\u0430gent",  # Cyrillic a
    "\uff41",  # fullwidth a
    "\uff10",  # fullwidth 0
    "\u0663",  # Arabic-Indic digit three
    "a\u2024b",  # one dot leader
    "a\u2215b",  # division slash
    "a\uff0fb",  # fullwidth solidus
    "a\u2010b",  # hyphen
    "a\u00a0",  # no-break space
    "\u212a",  # Kelvin sign (a K under case folding)
    "e\u0301",  # combining accent
    "a\ud800",  # lone surrogate
]

NON_STR = [None, 1, 1.5, True, b"abc", bytearray(b"abc"), ["a"], ("a",), {"a": 1}, object()]


@pytest.mark.parametrize("value", ACCEPTED_IDS)
def test_validate_id_accepts(value: str) -> None:
    assert validate_id(value, "sessionId") == value


@pytest.mark.parametrize("value", REJECTED_IDS + NON_STR)
def test_validate_id_rejects(value: object) -> None:
    with pytest.raises(InvalidId) as info:
        validate_id(value, "sessionId")
    assert info.value.field == "sessionId"
    assert str(info.value).startswith("sessionId: ")
    assert isinstance(info.value, ContractError)
    assert isinstance(info.value, ValueError)


def test_validate_id_error_message_is_bounded() -> None:
    with pytest.raises(InvalidId) as info:
        validate_id("/" * 100_000, "agentId")
    assert len(str(info.value)) < 400


@pytest.mark.parametrize(
    "value",
    ["goal-1", "goal:123#step@v+1/x", "a/b/c", "G", "x" * 256, "owner/repo#12", "t.1_2-3"],
)
def test_validate_task_ref_accepts(value: str) -> None:
    assert validate_task_ref(value) == value


@pytest.mark.parametrize(
    "value",
    [
        "",
        "x" * 257,
        "/goal",
        "..",
        ".hidden",
        ":a",
        "#a",
        "a\0",
        "a\n",
        "a b",
        "a\\b",
        "\uff41",
        "a\u2215b",
        *NON_STR,
    ],
)
def test_validate_task_ref_rejects(value: object) -> None:
    with pytest.raises(InvalidId) as info:
        validate_task_ref(value)
    assert info.value.field == "taskRef"


def test_validate_task_ref_names_given_field() -> None:
    with pytest.raises(InvalidId) as info:
        validate_task_ref("", "PI_TASK_REF")
    assert info.value.field == "PI_TASK_REF"


@pytest.mark.parametrize("role", list(Role))
@pytest.mark.parametrize("session", ACCEPTED_IDS)
def test_entry_key_round_trips_through_parse_key(role: Role, session: str) -> None:
    key = entry_key(role, session)
    assert key == f"{role.value}-{session}"
    assert parse_key(key) == (role, session)


def test_entry_key_accepts_role_value_strings() -> None:
    assert entry_key(Role("master"), "abc") == "master-abc"
    assert entry_key(Role.WORKER, "abc123") == "worker-abc123"


@pytest.mark.parametrize("session", REJECTED_IDS + NON_STR)
def test_entry_key_rejects_bad_session(session: object) -> None:
    with pytest.raises(InvalidId) as info:
        entry_key(Role.WORKER, session)  # type: ignore[arg-type]
    assert info.value.field == "sessionId"


@pytest.mark.parametrize(
    "key",
    [
        "",
        "worker",
        "worker-",
        "master-",
        "worker-..",
        "worker-.hidden",
        "worker-a/b",
        "worker-a\n",
        "worker-a\0",
        "worker-" + "x" * 129,
        "boss-a",
        "Worker-a",
        "MASTER-a",
        "workera",
        "worker_a",
        " worker-a",
        "worker-a ",
        "../worker-a",
        "worker-\uff41",
        *NON_STR,
    ],
)
def test_parse_key_rejects(key: object) -> None:
    with pytest.raises(InvalidId) as info:
        parse_key(key)
    assert info.value.field == "key"


def test_parse_key_accepts_longest_session() -> None:
    key = "worker-" + "x" * 128
    assert parse_key(key) == (Role.WORKER, "x" * 128)


def test_parse_key_splits_on_first_dash_only() -> None:
    assert parse_key("worker-master-a") == (Role.WORKER, "master-a")
    # "a.json" is itself a valid session id, so this is a strange but harmless key.
    assert parse_key("worker-a.json") == (Role.WORKER, "a.json")


# --- the containment property ----------------------------------------------------------------

ROOT = "/state/process-matrix"

# Whole unicode range, surrogates included, plus an alphabet biased towards path syntax.
any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=140)
hostile_text = st.text(st.sampled_from(list("./\\-_:aZ9\0\n\r\t \u2024\u2215\uff0f\u0430~$*")), max_size=140)
texts = st.one_of(any_text, hostile_text, st.from_regex(r"[A-Za-z0-9._/-]{0,130}", fullmatch=True))


def _assert_directly_inside(root: str, name: str) -> None:
    joined = os.path.join(root, name + ".json")
    normal = os.path.normpath(joined)
    assert normal == joined, "an accepted id must need no normalisation"
    assert os.path.dirname(normal) == root
    assert os.path.basename(normal) == name + ".json"
    assert not os.path.basename(normal).startswith(".")


@HYPOTHESIS
@given(text=texts)
def test_any_text_is_rejected_or_names_a_file_inside_root(text: str) -> None:
    try:
        accepted = validate_id(text, "sessionId")
    except InvalidId:
        return
    assert accepted == text
    assert len(text) <= 128
    assert text.isascii()
    _assert_directly_inside(ROOT, text)


@HYPOTHESIS
@given(text=texts, role=st.sampled_from(list(Role)))
def test_any_key_is_rejected_or_names_a_file_inside_root(text: str, role: Role) -> None:
    try:
        key = entry_key(role, text)
    except InvalidId:
        return
    _assert_directly_inside(ROOT, key)
    assert parse_key(key) == (role, text)


@HYPOTHESIS
@given(text=texts)
def test_parse_key_on_any_text_is_rejected_or_inside_root(text: str) -> None:
    for candidate in (text, "worker-" + text, "master-" + text):
        try:
            role, session = parse_key(candidate)
        except InvalidId:
            continue
        assert entry_key(role, session) == candidate
        _assert_directly_inside(ROOT, candidate)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=texts, role=st.sampled_from(list(Role)))
def test_accepted_key_creates_exactly_one_file_in_a_real_dir(text: str, role: Role) -> None:
    try:
        key = entry_key(role, text)
    except InvalidId:
        return
    with tempfile.TemporaryDirectory() as parent:
        root = os.path.join(parent, "state")
        os.mkdir(root)
        fd = os.open(os.path.join(root, key + ".json"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        assert os.listdir(root) == [key + ".json"]
        assert os.listdir(parent) == ["state"]


@HYPOTHESIS
@given(session=st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", fullmatch=True))
def test_every_allowlisted_id_is_accepted(session: str) -> None:
    assert validate_id(session, "sessionId") == session
    for role in Role:
        assert parse_key(entry_key(role, session)) == (role, session)


@HYPOTHESIS
@given(text=texts)
def test_task_ref_is_rejected_or_allowlisted(text: str) -> None:
    try:
        validate_task_ref(text)
    except InvalidId:
        return
    assert 1 <= len(text) <= 256
    assert text.isascii()
    assert text[0].isalnum()
    assert not set(text) & {"\0", "\n", "\r", " ", "\\"}


# --- AgentIdentityContract --------------------------------------------------------------------


def test_identity_minimal_and_key() -> None:
    ident = AgentIdentityContract(agent_id="agent-1", session_id="s1")
    assert ident.key(Role.WORKER) == "worker-s1"
    assert ident.key(Role.MASTER) == "master-s1"
    assert ident.resource_pointers == ()
    assert ident.is_pi


def test_identity_full() -> None:
    ident = AgentIdentityContract(
        agent_id="agent-1",
        session_id="s1",
        session_file="/home/u/.pi/agent/sessions/s1.jsonl",
        cwd="/work/repo",
        worktree="/work/repo-lane",
        lane="lane-1",
        profile="default",
        provider="pi",
        mode=Mode.RPC,
        resource_pointers=["/work/repo/NOTES.md", "/tmp/ctx"],
    )
    assert ident.resource_pointers == ("/work/repo/NOTES.md", "/tmp/ctx")
    assert ident.resume_complete


@pytest.mark.parametrize("field", ["agent_id", "session_id"])
@pytest.mark.parametrize("value", ["", "..", "a/b", "a\0", "x" * 129, "\uff41", None, 5])
def test_identity_rejects_bad_required_ids(field: str, value: object) -> None:
    fields: dict[str, object] = {"agent_id": "a", "session_id": "s"}
    fields[field] = value
    with pytest.raises(InvalidId) as info:
        AgentIdentityContract(**fields)  # type: ignore[arg-type]
    assert info.value.field == {"agent_id": "agentId", "session_id": "sessionId"}[field]


@pytest.mark.parametrize(
    ("field", "name"), [("lane", "lane"), ("profile", "profile"), ("provider", "provider")]
)
@pytest.mark.parametrize("value", ["", "..", ".x", "a/b", "a\n", "x" * 129, 3])
def test_identity_rejects_bad_optional_ids(field: str, name: str, value: object) -> None:
    with pytest.raises(InvalidId) as info:
        make_identity(**{field: value})
    assert info.value.field == name


@pytest.mark.parametrize(
    ("field", "name"), [("session_file", "sessionFile"), ("cwd", "cwd"), ("worktree", "worktree")]
)
@pytest.mark.parametrize(
    "value",
    ["relative/path", "./x", "x", "~/x", "", "/a\0b", "\0", "/" + "x" * MAX_PATH_CHARS, 7, b"/x"],
)
def test_identity_rejects_bad_paths(field: str, name: str, value: object) -> None:
    with pytest.raises(InvalidId) as info:
        make_identity(**{field: value})
    assert info.value.field == name


@pytest.mark.parametrize("field", ["session_file", "cwd", "worktree"])
def test_identity_accepts_longest_path(field: str) -> None:
    value = "/" + "x" * (MAX_PATH_CHARS - 1)
    assert getattr(make_identity(**{field: value}), field) == value


def test_identity_resource_pointer_limit() -> None:
    pointers = [f"/p/{i}" for i in range(MAX_RESOURCE_POINTERS)]
    assert len(make_identity(resource_pointers=pointers).resource_pointers) == MAX_RESOURCE_POINTERS
    with pytest.raises(InvalidId) as info:
        make_identity(resource_pointers=[*pointers, "/p/extra"])
    assert info.value.field == "resourcePointers"


@pytest.mark.parametrize(
    "pointers", [["relative"], ["/ok", "rel"], ["/a\0"], [""], [5], ["/" + "x" * MAX_PATH_CHARS]]
)
def test_identity_rejects_bad_resource_pointers(pointers: list[object]) -> None:
    with pytest.raises(InvalidId) as info:
        make_identity(resource_pointers=pointers)
    assert info.value.field == "resourcePointers"


def test_identity_is_frozen_and_evolve_revalidates() -> None:
    ident = make_identity()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ident.cwd = "/x"  # type: ignore[misc]
    with pytest.raises(InvalidId):
        attrs.evolve(ident, cwd="relative")
    with pytest.raises(InvalidId):
        attrs.evolve(ident, session_id="../x")


@pytest.mark.parametrize(
    ("changes", "complete"),
    [
        ({"session_file": "/s.jsonl", "cwd": "/w"}, True),
        ({"session_file": "/s.jsonl", "cwd": "/w", "provider": "pi"}, True),
        ({"session_file": "/s.jsonl", "cwd": "/w", "provider": "claude"}, False),
        ({"session_file": "/s.jsonl"}, False),
        ({"cwd": "/w"}, False),
        ({}, False),
        ({"session_file": "/s.jsonl", "cwd": "/w", "worktree": "/wt", "lane": "l"}, True),
    ],
)
def test_resume_complete(changes: dict[str, str], complete: bool) -> None:
    ident = make_identity(**changes)
    assert ident.resume_complete is complete
    assert ident.is_pi is (changes.get("provider") in (None, "pi"))
