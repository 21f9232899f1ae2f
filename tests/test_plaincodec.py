"""The converter-free codec a host reads and writes with (issue 30.3): what it builds and writes
is the converter's, value for value, and whatever it is unsure of the converter decides, so every
refusal is the converter's, word for word."""

from __future__ import annotations

import copy
import json
from typing import Any

import attrs
import pytest
from helpers import make_entry, make_identity

from pi_tmux_matrix.dispatch.model import AgentResult, Job, JobAgent, ResultKind
from pi_tmux_matrix.dispatch.usage import ClaimedUsage, Cost, Usage
from pi_tmux_matrix.dispatch.variables import JobVariables
from pi_tmux_matrix.fork.model import ForkRun, RunMode
from pi_tmux_matrix.identity import Mode, ProcessIdentity
from pi_tmux_matrix.matrix import codec, plaincodec
from pi_tmux_matrix.matrix.model import (
    Directive,
    DirectiveKind,
    ExitKind,
    ExitRecord,
    Handoff,
    Outcome,
    ResumablePayload,
)  # fmt: skip


def _agent(**changes: Any) -> JobAgent:
    fields: dict[str, Any] = {
        "agent_id": "a1", "key": "worker-s1", "session_id": "s1", "profile": "stand-in", "provider": "pi",
        "mode": "print", "cwd": "/w", "backend": "tmux", "nonce": "n0", "round": 2, "deadline_at": 5,
        "deadline_s": 600.0, "socket": "pm", "pane_id": "%1", "host_pid": 12, "host_start": 34,
        "boot_id": "b",
    }  # fmt: skip
    fields.update(changes)
    return JobAgent(**fields)


_RICH = make_identity("s2", mode=Mode.RPC, resource_pointers=("/a", "/b"), cwd="/w")
RECORDS: list[Any] = [
    make_entry("s1"),
    make_entry(
        "s2", identity=_RICH,
        directive=Directive(kind=next(iter(DirectiveKind)), at=3, parent_pid=4),
        resumable=ResumablePayload(identity=_RICH, reason="r", at=5, checkpoint="c"),
        handoffs=[Handoff(id="h1", generation="g", parent_session_id="p", outcome=Outcome.DONE, created_at=6,
                          summary="ünïcode \ud800", usage="{}")],
        exit=ExitRecord(kind=next(iter(ExitKind)), at=7, code=0), pid=1, proc_start=2, boot_id="b",
    ),
    Job(id="j1", created_at=1, parent_pid=2, parent_session_id="boss", task="t", profile=None, team=None,
        agents=(_agent(), _agent(agent_id="a2", key="worker-s2", session_id="s2", deadline_s=3)),
        task_ref="goal"),
    AgentResult(job_id="j1", agent_id="a1", key="worker-s1", round=1, kind=ResultKind.DONE, at=9,
                usage=ClaimedUsage(claimed=Usage(input=1, total_tokens=3, cost=Cost(total=0.5, input=1)))),
    AgentResult(job_id="j1", agent_id="a1", key="worker-s1", round=1, kind=ResultKind.EXITED, at=9,
                exit_code=3, usage=ClaimedUsage(invalid="bad")),
    JobVariables(job_id="j1", values={"A": "1"}, updated_at=3),
    ForkRun(id="r1", cwd="/w", task="t", mode=next(iter(RunMode)), created_at_ms=1, updated_at_ms=2,
            argv=("pi", "-p"), process=ProcessIdentity(1, 2, "b")),
]  # fmt: skip


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: type(r).__name__)
def test_each_record_is_written_and_read_as_the_converter_does(record: Any) -> None:
    raw = plaincodec.unstructure(record)
    assert raw == codec.conv().unstructure(record)
    assert json.dumps(raw) == json.dumps(codec.conv().unstructure(record))
    cls = type(record)
    back = json.loads(json.dumps(raw))
    if cls is not JobVariables:  # a Mapping field: the converter's (plain pass unsure)
        assert plaincodec.structure(back, cls) == record
    assert codec.structure(back, cls) == codec.conv().structure(back, cls) == record


def _refusal(raw: Any, cls: type[Any]) -> str:
    """What the converter alone says of ``raw``."""
    try:
        codec.conv().structure(raw, cls)
    except Exception as exc:  # noqa: BLE001
        return codec._explain(raw, cls, exc)
    return "accepted"


def _hostile(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """``raw`` broken one field at a time, in the ways a file is wrong."""
    found = []
    for key, value in raw.items():
        for bad in ("12", 12, True, None, 1.5, [], {}, "no-such-member"):
            if bad != value or type(bad) is not type(value):
                changed = copy.deepcopy(raw)
                changed[key] = bad
                found.append(changed)
        missing = copy.deepcopy(raw)
        del missing[key]
        found.append(missing)
    found.append({**raw, "unknownField": 1})
    return found


@pytest.mark.parametrize("record", RECORDS[1:4], ids=lambda r: type(r).__name__)
def test_a_hostile_record_is_refused_by_the_converter_word_for_word(record: Any) -> None:
    cls = type(record)
    for raw in _hostile(json.loads(json.dumps(codec.conv().unstructure(record)))):
        said = _refusal(raw, cls)
        assert _ours(raw, cls) == said, raw
        if said == "accepted":
            assert codec.structure(raw, cls) == codec.conv().structure(raw, cls), raw


def _ours(raw: Any, cls: type[Any]) -> str:
    """What :func:`.codec.structure` (the plain pass first) says of ``raw``."""
    try:
        codec.structure(raw, cls)
    except codec.DecodeError as exc:
        return exc.reason
    return "accepted"


def test_an_old_outcome_spelling_and_an_int_for_a_float_are_read_as_the_converter_reads_them() -> None:
    handoff = {"id": "h", "generation": "g", "parentSessionId": "p", "outcome": "blocked", "createdAt": 1}
    for spelling in ("blocked", *codec.OUTCOME_ALIASES):
        raw = {**handoff, "outcome": spelling}
        assert codec.structure(raw, Handoff) == codec.conv().structure(raw, Handoff)
    agent = codec.conv().unstructure(_agent(deadline_s=600))
    assert codec.structure(agent, JobAgent).deadline_s == 600.0
    assert type(codec.structure(agent, JobAgent).deadline_s) is float


def test_a_kind_it_does_not_know_is_the_converters() -> None:
    @attrs.frozen
    class Odd:
        when: complex

    with pytest.raises(plaincodec.Unsure):
        plaincodec.unstructure(Odd(1j))
    with pytest.raises(plaincodec.Unsure):
        plaincodec.structure({"when": 1}, Odd)
