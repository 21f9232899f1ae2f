"""Hostile or malformed input (issue 17, cases 7, 8, 9, 12, 13, 14, 17 and 18): refused by name
before anything is written or started (exit 2, one line, no traceback), or taken for exactly what
it is, never misread.

A task starting with ``-`` is a task, not a flag; an oversized follow-up or steer, an agent id too
long for its result names, a profile nested past the parser's depth (``profiles``, ``fire``,
``resume``), a path that is not valid UTF-8 and a profile that sets tools or extensions in its
command words are refused. A record on disk that cannot be right (a job claiming a billion rounds,
a resumable payload that names another agent) is reported corrupt by every reader, never a hang,
and left where it is.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
from helpers import cli_at, make_entry, make_identity, spawn_registered_parent
from helpers import cli_at as _cli  # the name the case-13 launch-path test was written with
from helpers import end_popens as _end
from labs import Lab

from pi_tmux_matrix import procs
from pi_tmux_matrix.dispatch.jobs import JobStore
from pi_tmux_matrix.matrix.model import Status
from pi_tmux_matrix.matrix.store import MatrixStore, now_ms


def test_7_an_oversized_followup_or_steer_is_refused_before_anything_moves(sublab: Lab) -> None:
    sublab.start_master()
    fired = sublab.fire("HANG long work", backend="subprocess")
    (agent,) = fired.job.agents
    assert agent.host is not None
    sublab.started.append(agent.host)
    sublab.worker(agent.key)
    huge = "x" * 70_000
    follow = sublab.cli("followup", fired.job.id, "--", huge)
    assert follow.returncode == 2, follow.stderr
    assert "TEXT" in follow.stderr and "bytes once encoded" in follow.stderr
    assert "Traceback" not in follow.stderr
    assert JobStore(sublab.store).get(fired.job.id).agents[0].round == 1  # the round did not move
    steer = sublab.cli("send", agent.key, "--steer", huge)
    assert steer.returncode == 2 and "--steer" in steer.stderr and "Traceback" not in steer.stderr
    mailbox = sublab.state / "mailbox" / agent.key
    assert not mailbox.exists() or list(mailbox.iterdir()) == []


def test_8_a_task_starting_with_a_dash_reaches_every_team_member(sublab: Lab) -> None:
    """The task summary goes to each host as ``--task-summary=VALUE``: a task that starts with
    ``-`` is never read as a flag (each host used to die on ``--task-summary -x``)."""
    sublab.start_master()
    fired = sublab.fire("-x", profile=None, team="stand-in-pair", backend="subprocess")
    assert len(fired.job.agents) == 2
    for agent in fired.job.agents:
        assert agent.host is not None
        sublab.started.append(agent.host)
        entry = sublab.worker(agent.key)
        assert entry.task_summary == "-x"
        assert procs.is_alive(entry.process)


def test_9_an_agent_id_too_long_for_its_result_names_is_refused_before_the_job_is_written(
    sublab: Lab,
) -> None:
    master = sublab.start_master()
    done = sublab.cli(
        "fire", "--profile", "stand-in", "--backend", "subprocess", "--parent-pid", str(master.pid),
        "--parent-session", "boss", "--agent-id", "a" * 120, "--", "HANG",
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--agent-id" in done.stderr and "use at most" in done.stderr
    assert not (sublab.state / "jobs").exists() or not list((sublab.state / "jobs").glob("job-*.json"))
    assert sublab.cli("jobs").returncode == 0


def test_12_a_job_record_claiming_a_billion_rounds_is_reported_corrupt_not_a_hang(sublab: Lab) -> None:
    sublab.start_master()
    fired = sublab.fire("HANG", backend="subprocess")
    for agent in fired.job.agents:
        if agent.host is not None:
            sublab.started.append(agent.host)
    record = sublab.state / "jobs" / f"{fired.job.id}.json"
    raw = json.loads(record.read_text())
    raw["agents"][0]["round"] = 10**9
    record.write_text(json.dumps(raw))
    done = sublab.cli("jobs", "--json")
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr
    assert fired.job.id in done.stdout + done.stderr and "round" in done.stdout + done.stderr


def test_13_a_deeply_nested_profile_is_a_clear_error_not_a_recursion_crash(tmp_path: Path) -> None:
    agent = tmp_path / "agent"
    (agent / "launch_profiles").mkdir(parents=True)
    (agent / "launch_profiles" / "deep.toml").write_text(
        '[profile]\nname = "deep"\nprovider = "pi"\ncommand = ["pi"]\nx = ' + "[" * 5000 + "]" * 5000 + "\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", "profiles"], capture_output=True, text=True, timeout=60,
        check=False, env={**os.environ, "PI_CODING_AGENT_DIR": str(agent)},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "deep.toml" in done.stderr and "nested too deeply" in done.stderr
    assert "Traceback" not in done.stderr


def test_13_a_deeply_nested_profile_is_a_clear_error_from_fire_and_resume_too(tmp_path: Path) -> None:
    """``fire --profile`` and ``resume`` (dry run and real) read the profiles as ``profiles`` does:
    a hostile nesting is exit 2 naming the file, never a ``RecursionError``, and nothing starts."""
    from helpers import dead_identity

    from pi_tmux_matrix.matrix.model import ResumablePayload

    agent = Path(os.environ["PI_CODING_AGENT_DIR"])
    (agent / "launch_profiles").mkdir(parents=True)
    (agent / "launch_profiles" / "deep.toml").write_text(
        '[profile]\nname = "deep"\nprovider = "pi"\ncommand = ["pi"]\nx = ' + "[" * 5000 + "]" * 5000 + "\n"
    )
    store = MatrixStore(tmp_path / "state")
    session_file = str(tmp_path / "d13.jsonl")
    identity = make_identity("d13", cwd=str(tmp_path), profile="deep", session_file=session_file)
    payload = ResumablePayload(identity=identity, reason="parent_lost", at=now_ms())
    dead = dead_identity()
    store.register(
        make_entry("d13", status=Status.RESUMABLE, identity=identity, process=dead, resumable=payload)
    )
    master = spawn_registered_parent(store.root, "boss")
    try:
        parent = ("--parent-pid", str(master.pid), "--parent-session", "boss")
        for words in (
            ("fire", "--profile", "deep", "--backend", "subprocess", *parent, "--", "HANG"),
            ("fire", "--profile", "deep", "--dry-run", *parent, "--", "HANG"),
            ("resume", "worker-d13", "--dry-run", *parent),
            ("resume", "worker-d13", "--backend", "subprocess", *parent),
        ):
            done = _cli(store.root, *words, env=dict(os.environ), cwd=tmp_path)
            assert done.returncode == 2, (words, done.stdout, done.stderr)
            assert "deep.toml" in done.stderr and "nested too deeply" in done.stderr, (words, done.stderr)
            assert "Traceback" not in done.stderr and "RecursionError" not in done.stderr, done.stderr
        assert store.get("worker-d13").status is Status.RESUMABLE  # nothing claimed, nothing started
        assert not (store.root / "jobs").exists() or not list((store.root / "jobs").glob("job-*.json"))
    finally:
        _end(master)


def test_14_a_lone_surrogate_in_allowed_paths_is_refused_whole() -> None:
    from pi_tmux_matrix.errors import ContractError
    from pi_tmux_matrix.launch_contract import parse_allowed_paths, path_allowed

    raw = json.dumps(["/work/ok", "/work/\udcff"])
    with pytest.raises(ContractError, match="item 1 is not valid UTF-8"):
        parse_allowed_paths(raw)
    assert path_allowed("/work/\ud800/x", ["/work"]) is False  # never raises


def test_17_a_payload_must_describe_the_entry_it_sits_in(tmp_path: Path) -> None:
    """A resumable payload whose identity differs from its entry's is a corrupt entry: the loader
    reports it (naming the field) and leaves the file alone, no write can produce one, and the
    steps that change an entry's identity move its payload with it (a session file reported by
    the bridge while the worker is already resumable used to leave the payload behind)."""
    from helpers import make_entry, make_identity

    from pi_tmux_matrix.errors import CorruptEntry, InvalidId
    from pi_tmux_matrix.matrix import lifecycle
    from pi_tmux_matrix.matrix.model import ResumablePayload, Status
    from pi_tmux_matrix.matrix.store import MatrixStore, now_ms

    store = MatrixStore(tmp_path / "state")
    identity = make_identity("w17", session_file=str(tmp_path / "w17.jsonl"), cwd=str(tmp_path))
    payload = ResumablePayload(identity=identity, reason="parent_lost", at=now_ms())
    entry = make_entry("w17", status=Status.RESUMABLE, identity=identity, resumable=payload)
    store.register(entry)

    # The bridge reports pi's real session file after the payload was written.
    real = str(tmp_path / "real-w17.jsonl")
    moved = store.update(entry.key, lambda e: lifecycle.with_identity(e, session_file=real))
    assert moved.resumable is not None and moved.resumable.identity == moved.identity
    assert moved.resumable.identity.session_file == real

    # No write can make the payload name another agent.
    path = store.root / f"{entry.key}.json"
    before = path.read_bytes()
    other = attrs.evolve(moved.identity, agent_id="someone-else")
    with pytest.raises(InvalidId, match=r"resumable\.identity: .* in agentId;"):
        store.update(entry.key, lambda e: attrs.evolve(e, resumable=attrs.evolve(payload, identity=other)))
    assert path.read_bytes() == before

    # A file that holds one anyway is reported, by every reader, and never deleted.
    raw = json.loads(before)
    raw["resumable"]["identity"]["sessionFile"] = "/elsewhere/w17.jsonl"
    path.write_text(json.dumps(raw))
    with pytest.raises(CorruptEntry, match=r"resumable\.identity: .* in sessionFile;"):
        store.get(entry.key)
    listed = cli_at(store.root, "ls")
    assert listed.returncode == 0 and "Traceback" not in listed.stderr
    assert f"{path}: resumable.identity: differs from the entry's identity in sessionFile" in listed.stderr
    for words in (("show", entry.key), ("resume", entry.key, "--dry-run")):
        done = cli_at(store.root, *words)
        assert done.returncode == 1 and "resumable.identity" in done.stderr, (words, done.stderr)
        assert "Traceback" not in done.stderr
    assert json.loads(path.read_text()) == raw


@pytest.mark.parametrize(
    "command",
    [
        '["pi", "--tools", "read,tmux_agent_manager"]',
        '["pi", "--tools=read,fork"]',
        '["pi", "-e", "/tmp/evil.ts"]',
        '["opencode", "--allow", "subagent"]',
    ],
)
def test_18_a_profile_cannot_set_tools_or_extensions_in_its_command_words(command: str) -> None:
    from pi_tmux_matrix.dispatch.profile import parse_profile
    from pi_tmux_matrix.errors import ProfileError

    provider = "pi" if command.startswith('["pi"') else "opencode"
    text = f'[profile]\nname = "p"\nprovider = "{provider}"\ncommand = {command}\n'
    with pytest.raises(ProfileError, match=r"p\.toml: profile\.command\[\d\]"):
        parse_profile(text, "p.toml")
