"""Ready is a fact (issue 29.8): the entry's ``readyAt`` is when the agent's pi bridge reported in
(pi loaded), shown by ``show``, ``ls``, ``jobs`` and ``top``; ``fire --wait-ready`` waits for it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers import make_entry, make_identity, read_events
from labs import Lab
from pilabs import PiPair
from waiting import wait_for

from pi_tmux_matrix.cli.listing import describe
from pi_tmux_matrix.identity import ProcessIdentity
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.codec import (
    DecodeError,
    decode_entry,
    encode_entry,
    entry_document,
    structure_strictly,
    unstructure_entry,
)
from pi_tmux_matrix.matrix.model import Entry, ExitKind, ExitRecord, Status
from pi_tmux_matrix.testing.fake_model import Reply

# --- the record -----------------------------------------------------------------------------------


def strictly(data: bytes, key: str) -> tuple[Entry, dict[str, object]]:
    """The reference loader: the envelope, then the fields by the converter alone."""
    raw = entry_document(data, key)
    return structure_strictly(raw, Entry), raw


def test_ready_at_round_trips_alike_through_the_strict_and_the_fast_loader() -> None:
    entry = make_entry(ready_at=1796200001234)
    data = encode_entry(entry)
    assert json.loads(data)["readyAt"] == 1796200001234
    strict, strict_raw = strictly(data, entry.key)
    fast, fast_raw = decode_entry(data, entry.key)
    assert strict == fast == entry and strict_raw == fast_raw
    # An entry written before the field (or by a host whose bridge never reported) reads as None.
    doc = unstructure_entry(entry)
    del doc["readyAt"]
    older = json.dumps(doc).encode()
    assert strictly(older, entry.key)[0].ready_at is None
    assert decode_entry(older, entry.key)[0].ready_at is None


def test_a_ready_at_that_is_no_integer_is_refused_alike_naming_the_field() -> None:
    entry = make_entry()
    doc = unstructure_entry(entry)
    doc["readyAt"] = "soon"
    data = json.dumps(doc).encode()
    with pytest.raises(DecodeError) as strict:
        strictly(data, entry.key)
    with pytest.raises(DecodeError) as fast:
        decode_entry(data, entry.key)
    assert "readyAt" in strict.value.reason and fast.value.reason == strict.value.reason


def test_the_first_report_makes_the_entry_ready_and_later_ones_keep_that_time() -> None:
    entry = make_entry()
    ready = lifecycle.ready(entry, 1000, "/s/s1.jsonl")
    assert ready is not None and ready.ready_at == 1000 and ready.identity.session_file == "/s/s1.jsonl"
    assert lifecycle.ready(ready, 2000, "/s/s1.jsonl") is None  # nothing new: no write
    moved = lifecycle.ready(ready, 3000, "/s/other.jsonl")  # a later report only completes the identity
    assert moved is not None and moved.ready_at == 1000 and moved.identity.session_file == "/s/other.jsonl"
    # A report that lands after the agent's end does not make it ready.
    ended = make_entry(status=Status.TERMINAL)
    assert lifecycle.ready(ended, 1000, None) is None
    # A session switch's new entry carries the readiness of the same, still loaded, pi.
    child = ProcessIdentity(10, 20, "b")
    assert lifecycle.with_child(make_entry(), child, 1000).ready_at == 1000
    assert lifecycle.with_child(ready, child).ready_at == 1000


def test_the_views_say_ready_loading_or_why_there_is_no_readiness() -> None:
    loading = make_entry()
    assert loading.readiness == "loading" and loading.status_text == "running (loading)"
    assert "  ready        not yet (pi loading)" in describe(loading, True, [], None)
    ready = attrs.evolve(loading, ready_at=loading.created_at + 900)
    assert ready.readiness == "ready" and ready.status_text == "running (ready)"
    assert any(
        line.startswith("  ready        ") and "(0.9s after it registered)" in line
        for line in describe(ready, True, [], None)
    )
    other = make_entry(identity=make_identity("s1", provider="claude"))
    assert other.readiness is None and other.status_text == "running"
    assert "  ready        - (claude has no bridge to report it: ready once running)" in describe(
        other, True, [], None
    )
    ended = make_entry(
        status=Status.TERMINAL, reason="exited", exit=ExitRecord(kind=ExitKind.EXITED, code=1, at=1)
    )
    assert ended.readiness is None and ended.status_text == "terminal (exited)"
    assert "  ready        - (pi's bridge never reported in)" in describe(ended, False, [], None)


# --- fire --wait-ready ------------------------------------------------------------------------------


def _cli(lab: Lab, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pi_tmux_matrix", *argv], env=lab.env, cwd=lab.work, text=True,
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip


def _fire(lab: Lab, profile: str, wait: str, task: str) -> subprocess.CompletedProcess[str]:
    assert lab.master is not None
    return _cli(
        lab, "fire", "--profile", profile, "--path", str(lab.work), "--socket", lab.socket,
        "--parent-pid", str(lab.master.pid), "--parent-session", lab.master.identity.session_id,
        "--wait-ready", wait, "--json", "--", task,
    )  # fmt: skip


def test_wait_ready_fails_naming_the_agent_whose_pi_ends_before_it_loads(lab: Lab, tmp_path: Path) -> None:
    # A "pi" that exits at once: its process started (fire's own confirmation passes), it never loads.
    quitter = tmp_path / "quitter"
    quitter.write_text("#!/bin/sh\nexit 3\n")
    quitter.chmod(0o755)
    lab.env["PI_MATRIX_PI_COMMAND"] = json.dumps([str(quitter)])
    lab.start_master()
    done = _fire(lab, "pi-worker", "20", "Say hello.")
    assert done.returncode == 1, done.stdout + done.stderr
    launched = json.loads(done.stdout)
    (agent,) = launched["agents"]
    assert launched["ready"][agent["agentId"]]["readyAt"] is None
    assert f"{agent['agentId']} ({agent['key']}): ended before it was ready" in done.stderr
    assert "fire --wait-ready" in done.stderr and "not ready" in done.stderr
    entry = lab.store.get(agent["key"])
    assert entry.ready_at is None and entry.status in (Status.TERMINAL, Status.CLOSED)


def test_wait_ready_refuses_a_time_that_is_not_positive_before_launching(lab: Lab) -> None:
    lab.start_master()
    done = _fire(lab, "stand-in", "0", "Say hello.")
    assert done.returncode == 2 and "--wait-ready" in done.stderr and "positive" in done.stderr
    assert [e for e in lab.store.list().entries if e.key.startswith("worker-")] == []


@pytest.mark.real_pi
def test_fire_waits_until_a_real_pi_is_ready_and_every_view_says_so(pilab: PiPair) -> None:
    lab, llm = pilab
    llm.script(Reply(text="hello", delay_s=6.0))  # the round stays open while the views are read
    lab.start_master()
    done = _fire(lab, "pi-worker", "60", "Say hello.")
    assert done.returncode == 0, done.stdout + done.stderr
    launched = json.loads(done.stdout)
    (agent,) = launched["agents"]
    ready_at = launched["ready"][agent["agentId"]]["readyAt"]
    assert isinstance(ready_at, int)

    shown: dict[str, Any] = json.loads(_cli(lab, "show", agent["key"], "--json").stdout)
    assert shown["readyAt"] == ready_at >= shown["createdAt"]
    # Ready is the bridge's report (pi's session_start), recorded by the host.
    assert read_events(lab.state, agent["key"], "bridge_ready")
    text = _cli(lab, "show", agent["key"]).stdout
    assert "  ready        " in text and "after it registered" in text and "not yet" not in text
    assert "running (ready)" in _cli(lab, "ls").stdout
    jobs = _cli(lab, "jobs").stdout
    assert "working (ready)" in jobs, jobs
    (job,) = json.loads(_cli(lab, "jobs", "--json").stdout)
    assert job["agents"][0]["readyAt"] == ready_at


def test_a_session_switch_keeps_the_ready_time_of_the_same_loaded_agent(lab: Lab) -> None:
    from pi_tmux_matrix.matrix.mailbox import Inbox

    lab.start_master()
    fired = lab.fire("Say hello.")  # the stand-in reports in as the pi bridge does (-e …/bridge.ts)
    (agent,) = fired.job.agents
    ready_at = wait_for(
        "the report", lambda: e.ready_at if (e := lab.store.find(agent.key)) is not None else None
    )
    Inbox(lab.store, agent.key).post("switch", json.dumps({"sessionId": "next-1"}), sender="test")
    moved = wait_for(
        "the switched entry with its agent",
        lambda: e if (e := lab.store.find("worker-next-1")) is not None and e.child_pid else None,
    )
    assert moved.ready_at == ready_at  # the same pi, still loaded: not "loading" again
    old = lab.store.get(agent.key)
    assert old.reason == "session_switched" and old.ready_at == ready_at


def test_an_agent_with_no_bridge_is_ready_once_running_and_no_view_says_loading(lab: Lab) -> None:
    lab.start_master()
    assert lab.master is not None
    agent_json = json.dumps({"provider": "custom", "name": "plain", "command": "sleep 60"})
    done = _cli(
        lab, "fire", "--agent", agent_json, "--path", str(lab.work), "--socket", lab.socket,
        "--parent-pid", str(lab.master.pid), "--parent-session", lab.master.identity.session_id,
        "--wait-ready", "20", "--", "30",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "ready  " in done.stdout and "running (no bridge to report more)" in done.stdout
    (entry,) = [e for e in lab.store.list().entries if e.key.startswith("worker-")]
    assert entry.ready_at is None and entry.readiness is None
    assert "loading" not in _cli(lab, "ls").stdout
    assert "has no bridge to report it: ready once running" in _cli(lab, "show", entry.key).stdout
