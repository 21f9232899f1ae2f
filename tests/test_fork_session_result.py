"""Seed 003's session-result fallback (issue 23): a fork child that ended without its
``result.json`` has its final output, usage and model read back from its own ``session.jsonl``
(the entries pi appended after the snapshot) before a synthetic failure is recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from forklab import Caller

from pi_tmux_matrix import pisession
from pi_tmux_matrix.fork import RunStatus

HEADER = {"type": "session", "version": 3, "id": "s-1", "timestamp": "2026-12-03T00:00:00.000Z", "cwd": "/w"}


def assistant(
    text: str, *, cost: float, stop: str = "stop", model: str = "m-1", **extra: Any
) -> dict[str, Any]:
    usage = {
        "input": 10,
        "output": 5,
        "cacheRead": 1,
        "cacheWrite": 0,
        "totalTokens": 16,
        "cost": {"total": cost},
    }
    message = {
        "role": "assistant", "content": [{"type": "text", "text": text}], "provider": "fake", "model": model,
        "usage": usage, "stopReason": stop, **extra,
    }  # fmt: skip
    return {"type": "message", "id": text[:8], "parentId": None, "timestamp": "t", "message": message}


def user(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": "u",
        "message": {"role": "user", "content": [{"type": "text", "text": text}]},
    }


def lines(*records: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in records)


def test_the_outcome_is_the_runs_own_entries_after_the_snapshot(tmp_path: Path) -> None:
    session = tmp_path / "session.jsonl"
    parent = lines(HEADER, user("earlier"), assistant("the parent's answer", cost=9.0, model="parent-model"))
    tool_round = assistant("", cost=0.25, stop="toolUse")
    call = {"type": "toolCall", "id": "c1", "name": "bash", "arguments": {"command": "npm   test\n"}}
    tool_round["message"]["content"].append(call)
    session.write_bytes(
        parent + lines(user("the task"), tool_round, assistant("The fork's answer.", cost=0.5))
    )
    outcome = pisession.run_outcome(session, len(parent))
    assert outcome is not None
    assert outcome["text"] == "The fork's answer." and outcome["stopReason"] == "stop"
    assert outcome["model"] == "m-1" and outcome["provider"] == "fake"
    # Summed over the run's own assistant messages (the tool round too), never the parent's.
    assert outcome["usage"]["cost"] == {"total": 0.75}
    assert outcome["usage"]["input"] == 20 and outcome["usage"]["totalTokens"] == 32
    assert outcome["source"] == "session.jsonl"
    assert outcome["activity"] == ["bash: npm test"]  # the same lines the bridge writes


def test_no_assistant_message_a_torn_last_line_and_bad_lines(tmp_path: Path) -> None:
    session = tmp_path / "session.jsonl"
    parent = lines(HEADER, assistant("the parent's answer", cost=1.0))
    session.write_bytes(parent + lines(user("the task")))
    assert pisession.run_outcome(session, len(parent)) is None  # the child never answered
    torn = json.dumps(assistant("half", cost=1.0)).encode()[:40]
    session.write_bytes(parent + b"not json\n" + lines(assistant("whole", cost=0.1)) + torn)
    outcome = pisession.run_outcome(session, len(parent))
    assert outcome is not None and outcome["text"] == "whole"  # the torn line is pi still writing
    error = assistant("", cost=0.0, stop="error", errorMessage="429 rate limited")
    session.write_bytes(parent + lines(error))
    failed = pisession.run_outcome(session, len(parent))
    assert (
        failed is not None
        and failed["stopReason"] == "error"
        and failed["errorMessage"] == "429 rate limited"
    )
    assert pisession.run_outcome(tmp_path / "missing.jsonl", 0) is None


def _child_that_writes_only_its_session(world: Caller, record: dict[str, Any] | None) -> dict[str, str]:
    """A child command that appends ``record`` to its --session file and exits without result.json."""
    body = json.dumps(record) if record is not None else ""
    script = f"printf '%s\\n' '{body}' >> \"$2\"" if record is not None else "true"
    return dict(world.env, PI_MATRIX_PI_COMMAND=json.dumps(["/bin/sh", "-c", script, "pi"]))


def test_a_child_without_its_artifact_is_completed_from_its_session_file(caller: Caller) -> None:
    env = _child_that_writes_only_its_session(caller, assistant("Read back from the session.", cost=0.125))
    done = caller.fork("--json", "--", "answer from the file", env=env)
    run = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    assert run["status"] == "completed" and run["resultFrom"] == "session.jsonl"
    assert run["text"] == "Read back from the session." and run["model"] == "m-1"
    assert run["answer"] == "Read back from the session."  # the whole text, from the same place
    assert run["usage"]["cost"] == 0.125 and run["exitCode"] == 0
    assert not (caller.state / "runs" / run["id"] / "result.json").exists()


def test_a_child_with_neither_is_still_a_synthetic_failure(caller: Caller) -> None:
    done = caller.fork("--json", "--", "say nothing", env=_child_that_writes_only_its_session(caller, None))
    run = json.loads(done.stdout)
    assert done.returncode == 1 and run["status"] == RunStatus.FAILED.value
    assert run["error"] == "fork exited with code 0 without a result artifact" and run["resultFrom"] is None
