"""The strict loader refuses every coercion cattrs would otherwise make."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import sample_document

from pi_tmux_matrix.matrix.codec import DecodeError, decode_entry, encode_entry
from pi_tmux_matrix.matrix.model import Outcome, Status


def put(doc: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    *parents, last = path.split(".")
    target: Any = doc
    for part in parents:
        target = target[int(part)] if part.isdigit() else target[part]
    target[last] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        ("pid", "10", "expected an integer or null"),
        ("pid", True, "expected an integer or null"),
        ("pid", 10.0, "expected an integer or null"),
        ("createdAt", "123", "expected an integer"),
        ("createdAt", False, "expected an integer"),
        ("generation", 5, "expected a string"),
        ("reason", 5, "expected a string or null"),
        ("identity.agentId", 7, "expected a string"),
        ("identity.resourcePointers", "/abc", "expected an array"),
        ("identity.resourcePointers", ["/a", 3], "expected a string"),
        ("identity.mode", "bogus", "expected one of"),
        ("role", "boss", "expected one of"),
        ("status", 1, "expected one of"),
        ("handoffs", {"id": "h1"}, "expected an array"),
        ("handoffs.0.outcome", "vanished", "expected one of"),
        ("identity.sessionId", "../etc", "not a valid id"),
        ("identity.cwd", "relative/dir", "relative"),
    ],
)
def test_no_coercion(path: str, value: Any, needle: str) -> None:
    doc = put(sample_document(), path, value)
    with pytest.raises(DecodeError, match=needle):
        decode_entry(json.dumps(doc).encode(), "worker-s1")


def test_error_paths_use_the_on_disk_names() -> None:
    doc = put(sample_document(), "parentPid", "x")
    with pytest.raises(DecodeError, match=r"@ \$\.parentPid"):
        decode_entry(json.dumps(doc).encode(), "worker-s1")


def test_round_trip_keeps_real_enums() -> None:
    entry, raw = decode_entry(json.dumps(sample_document()).encode(), "worker-s1")
    assert entry.status is Status.RUNNING
    assert entry.handoffs[0].outcome is Outcome.EXITED
    assert raw["key"] == "worker-s1"
    assert decode_entry(encode_entry(entry), "worker-s1")[0] == entry
