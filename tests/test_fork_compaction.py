"""Virtual compaction of a fork's snapshot from pi-observational-memory entries (seed 003, issue
23): the three cases on session files the test writes, sessions without memory untouched, and a
real pi fork that reads the compacted snapshot natively."""

from __future__ import annotations

import json
from typing import Any

import pytest
from forklab import Caller
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pi_tmux_matrix import pisession
from pi_tmux_matrix.fork import RunStore
from pi_tmux_matrix.fork.compaction import OM_FOLDED, compact_snapshot
from pi_tmux_matrix.testing.fake_model import FakeModel, Reply

HEADER = {"type": "session", "version": 3, "id": "parent-1", "timestamp": "2026-12-03T00:00:00.000Z"}
USAGE = {"input": 1, "output": 1, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 2, "cost": {"total": 0}}


class Session:
    """A session file being written entry by entry, each the child of the one before."""

    def __init__(self, cwd: str = "/w") -> None:
        self.entries: list[dict[str, Any]] = [{**HEADER, "cwd": cwd}]
        self.count = 0

    def add(self, entry: dict[str, Any]) -> str:
        self.count += 1
        parent = self.entries[-1].get("id") if len(self.entries) > 1 else None
        entry = {
            "id": f"e{self.count:07d}",
            "parentId": parent,
            "timestamp": "2026-12-03T00:00:01.000Z",
            **entry,
        }
        self.entries.append(entry)
        return str(entry["id"])

    def user(self, text: str) -> str:
        return self.add(
            {
                "type": "message",
                "message": {"role": "user", "content": [{"type": "text", "text": text}], "timestamp": 1},
            }
        )

    def assistant(self, text: str) -> str:
        message = {
            "role": "assistant", "content": [{"type": "text", "text": text}], "api": "openai-completions",
            "provider": "fake", "model": "fake-model", "usage": USAGE, "stopReason": "stop", "timestamp": 1,
        }  # fmt: skip
        return self.add({"type": "message", "message": message})

    def observed(self, covers: str, *contents: str, prefix: str = "a") -> str:
        observations = [
            {"id": f"{prefix}{i:011x}", "content": c, "timestamp": "2026-12-03 10:00", "relevance": "high",
             "sourceEntryIds": [covers], "tokenCount": 5}
            for i, c in enumerate(contents)
        ]  # fmt: skip
        data = {"observations": observations, "coversUpToId": covers}
        return self.add({"type": "custom", "customType": "om.observations.recorded", "data": data})

    def reflected(self, covers: str, content: str) -> str:
        reflection = {"id": "f00000000001", "content": content, "supportingObservationIds": ["a00000000000"],
                      "tokenCount": 3}  # fmt: skip
        data = {"reflections": [reflection], "coversUpToId": covers}
        return self.add({"type": "custom", "customType": "om.reflections.recorded", "data": data})

    def dropped(self, covers: str, *ids: str) -> str:
        data = {"observationIds": list(ids), "coversUpToId": covers}
        return self.add({"type": "custom", "customType": "om.observations.dropped", "data": data})

    def data(self) -> bytes:
        return b"".join(json.dumps(e).encode() + b"\n" for e in self.entries)


def entries(data: bytes) -> list[dict[str, Any]]:
    return [line.entry for line in pisession.session_lines(data) if line.entry is not None]


def long_session() -> tuple[Session, list[str]]:
    """Three turns of ~2,500 tokens each, observed as the memory goes along."""
    session = Session()
    ids = []
    for turn in range(3):
        ids.append(session.user(f"question {turn} " + "q" * 5000))
        ids.append(session.assistant(f"answer {turn} " + "a" * 5000))
    return session, ids


def test_a_session_without_observational_memory_is_untouched() -> None:
    session, _ids = long_session()
    assert compact_snapshot(session.data(), keep_tokens=1000) == session.data()


def test_case_3_no_compaction_appends_one_made_from_the_memory_of_what_the_cut_discards() -> None:
    session, ids = long_session()
    session.observed(ids[1], "the user asked about turn 0", prefix="a")
    session.observed(ids[3], "the user asked about turn 1", "dropped later", prefix="b")
    session.dropped(ids[3], "b00000000001")
    session.observed(ids[5], "turn 2, still kept raw", prefix="c")
    before = session.data()
    after = compact_snapshot(before, keep_tokens=2000)
    assert after.startswith(before)  # the copy's lines stay byte for byte; one is appended
    compaction = entries(after)[-1]
    assert compaction["type"] == "compaction" and compaction["parentId"] == session.entries[-1]["id"]
    assert compaction["firstKeptEntryId"] == ids[4]  # the turn whose messages reach 2k tokens
    details = compaction["details"]
    assert details["type"] == OM_FOLDED and details["version"] == 1 and details["fullFold"] is False
    assert [o["content"] for o in details["observations"]] == [
        "the user asked about turn 0",
        "the user asked about turn 1",
    ]  # what covers the discarded part, the dropped one left out; turn 2's stays raw
    assert "[a00000000000] 2026-12-03 10:00 [high] the user asked about turn 0" in compaction["summary"]
    assert "turn 2, still kept raw" not in compaction["summary"]
    assert compaction["tokensBefore"] > 7000
    # A budget reached mid-turn cuts at the turn's start (never splits a turn), as here turn 1's.
    split = entries(compact_snapshot(before, keep_tokens=3000))[-1]
    assert split["firstKeptEntryId"] == ids[2]
    # Nothing would be discarded: no compaction.
    assert compact_snapshot(before, keep_tokens=100_000) == before


def test_case_1_a_compaction_with_populated_memory_details_is_left_alone() -> None:
    session, ids = long_session()
    session.observed(ids[1], "turn 0")
    folded = {"type": OM_FOLDED, "version": 1, "fullFold": False, "reflections": [],
              "observations": [{"id": "a00000000000", "content": "turn 0"}]}  # fmt: skip
    session.add({"type": "compaction", "summary": "old", "firstKeptEntryId": ids[2], "tokensBefore": 9,
                 "details": folded})  # fmt: skip
    assert compact_snapshot(session.data(), keep_tokens=10) == session.data()


def test_case_2_a_compaction_with_empty_memory_details_is_patched_in_place() -> None:
    session, ids = long_session()
    session.observed(ids[1], "turn 0 observed")
    session.reflected(ids[1], "the user prefers short answers")
    empty = {"type": OM_FOLDED, "version": 1, "fullFold": False, "observations": [], "reflections": []}
    compaction_id = session.add(
        {
            "type": "compaction",
            "summary": "nothing",
            "firstKeptEntryId": ids[4],
            "tokensBefore": 9,
            "details": empty,
        }
    )
    session.user("after the compaction")
    session.observed(ids[3], "turn 1 observed after it", prefix="b")
    before = session.data()
    after = compact_snapshot(before, keep_tokens=10)
    old, new = entries(before), entries(after)
    assert len(new) == len(old)
    changed = [n for o, n in zip(old, new, strict=True) if o != n]
    (patched,) = changed
    assert patched["id"] == compaction_id and patched["firstKeptEntryId"] == ids[4]  # the cut is kept
    assert patched["details"]["fullFold"] is True
    assert [o["content"] for o in patched["details"]["observations"]] == [
        "turn 0 observed",
        "turn 1 observed after it",
    ]
    assert "## Reflections\n[f00000000001] the user prefers short answers" in patched["summary"]
    # Every other line byte for byte.
    assert sum(a != b for a, b in zip(before.splitlines(), after.splitlines(), strict=True)) == 1
    # Another compactor's (pi's own, without memory details) is patched the same way.
    old_compaction = next(e for e in session.entries if e.get("id") == compaction_id)
    old_compaction["details"] = {"readFiles": [], "modifiedFiles": []}
    again = entries(compact_snapshot(session.data(), keep_tokens=10))
    assert next(e for e in again if e.get("id") == compaction_id)["details"]["type"] == OM_FOLDED


@pytest.mark.real_pi
def test_a_real_pi_fork_reads_the_virtual_compaction_instead_of_the_discarded_turns(
    picaller: tuple[Caller, FakeModel],
) -> None:
    caller, llm = picaller
    session = Session(cwd=str(caller.work))
    ids = []
    for turn in range(5):
        ids.append(session.user(f"OLD-QUESTION-{turn} " + "q" * 20_000))
        ids.append(session.assistant(f"OLD-ANSWER-{turn} " + "a" * 20_000))
    session.observed(ids[5], "MEMORY: the first three turns were about the parser")
    caller.session.write_bytes(session.data())
    before = caller.session.read_bytes()
    llm.script(Reply(text="The fork remembers the parser."))
    done = caller.fork("--wait", "--model", "fake/fake-model", "--json", "--", "What were we doing?")
    assert done.returncode == 0, done.stdout + done.stderr
    (request,) = llm.requests
    sent = json.dumps(request["messages"])
    assert "MEMORY: the first three turns were about the parser" in sent  # the compaction's summary
    assert "OLD-QUESTION-0" not in sent and "OLD-ANSWER-2" not in sent  # discarded
    assert "OLD-QUESTION-3" in sent and "OLD-ANSWER-4" in sent  # the recent turns, kept
    assert caller.session.read_bytes() == before  # the parent's own file is never touched
    (run,) = RunStore(caller.store).list()[0]
    assert run.status.value == "completed"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)

# A memory entry's data: covering a real entry of long_session() (so it is read), any contents.
DATA = JSON | st.fixed_dictionaries(
    {"coversUpToId": st.sampled_from([f"e{i:07d}" for i in range(1, 9)]), "observations": JSON,
     "reflections": JSON, "observationIds": JSON}
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    junk=st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["custom", "compaction", "message", "x"]),
             "customType": st.sampled_from(["om.observations.recorded", "om.reflections.recorded",
                                            "om.observations.dropped", "other"]),
             "data": DATA, "details": JSON, "message": JSON}
        ),
        max_size=6,
    )
)  # fmt: skip
@example(
    junk=[
        {"type": "custom", "customType": t, "data": {"coversUpToId": "e0000002", n: 5}}
        for t, n in [
            ("om.observations.recorded", "observations"),
            ("om.reflections.recorded", "reflections"),
            ("om.observations.dropped", "observationIds"),
        ]
    ]
)
def test_malformed_memory_entries_never_break_a_snapshot(junk: list[dict[str, Any]]) -> None:
    """Whatever a session holds, the snapshot is its data unchanged, with one line rewritten, or
    with one compaction appended: a launch never fails on it."""
    session, ids = long_session()
    session.observed(ids[1], "a real one")
    for entry in junk:
        session.add(dict(entry))
    before = session.data()
    after = compact_snapshot(before, keep_tokens=2000)
    old, new = before.splitlines(), after.splitlines()
    if len(new) == len(old):
        assert sum(a != b for a, b in zip(old, new, strict=True)) <= 1
    else:
        assert len(new) == len(old) + 1 and new[:-1] == old and json.loads(new[-1])["type"] == "compaction"
