"""Issue 19, event-driven delivery: a worker's handoff reaches its idle master as it is written,
whatever ``heartbeatMs`` (here a minute, so a delivery riding the heartbeat misses every bound).

Real ``pi-matrix master`` hosts (a plain program's and real pi's, against the fake LLM), stand-in
workers fired through the dispatcher into a private tmux server; the master's own output and the
model's request log are the evidence."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_llm import FakeLLM
from helpers import make_entry, read_events
from test_dispatch import Lab, wait_for
from test_handoffs import MLab, delivered, idle_pi_master, last_conversation, notices_posted
from test_master import dead_identity
from test_master_tool import master_window, mlab  # noqa: F401  (the fixture)

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import ExitKind, ExitRecord
from pi_tmux_matrix.matrix.store import now_ms

SLOW_BEAT_MS = 60_000
BOUND_S = 15.0  # far above the ≤1 s goal (a loaded CI machine), far below one heartbeat
READY_BOUND_S = 5.0  # issue 29.6: the goal is 1 s from ready; slack for a loaded 2-core machine


def slow_heartbeat(lab: Lab) -> None:
    path = lab.agent_dir / "settings.json"
    settings = json.loads(path.read_text())
    settings["processMatrix"]["heartbeatMs"] = SLOW_BEAT_MS
    path.write_text(json.dumps(settings))


def print_profile(lab: Lab) -> None:
    folder = lab.agent_dir / "launch_profiles"
    folder.mkdir(exist_ok=True)
    (folder / "standin-print.toml").write_text(
        '[profile]\nname = "standin-print"\nprovider = "pi"\n'
        'command = ["{python}", "-m", "pi_tmux_matrix.testing.standin"]\nmode = "print"\ndeadline = 120\n'
    )


def plain_master(lab: Lab, out: Path) -> None:
    """``pi-matrix master`` around a program that is not pi: handoffs are printed by the host."""
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", "boss", "--task-ref", "goal-1",
             "--headless", "--", sys.executable, "-c", "import time; time.sleep(600)"],
            stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT, cwd=lab.work, env=lab.env,
            start_new_session=True,
        )  # fmt: skip
    ident = procs.identify(proc.pid)
    assert ident is not None
    lab.started.append(ident)
    lab.master = wait_for(
        "the master and its program",
        lambda: e if (e := lab.store.find("master-boss")) and e.pid == proc.pid and e.child_pid else None,
    )
    assert lab.master.child_process is not None
    lab.started.append(lab.master.child_process)


@pytest.fixture
def plab(tmp_path: Path, tmux_socket: str) -> Iterator[Lab]:
    the_lab = Lab(tmp_path, tmux_socket)
    try:
        yield the_lab
    finally:
        the_lab.cleanup()


def test_a_plain_masters_host_prints_a_handoff_as_it_is_written_not_at_its_heartbeat(plab: Lab) -> None:
    lab = plab
    slow_heartbeat(lab)
    print_profile(lab)
    out = lab.tmp / "master.out"
    plain_master(lab, out)
    (key,) = [a.key for a in lab.fire("Say hello.", profile="standin-print").job.agents]
    (handoff,) = wait_for(
        f"{key}'s handoff marked delivered",
        lambda: [h for h in lab.store.get(key).handoffs if h.delivered_at is not None],
        timeout=60 + BOUND_S,
    )
    assert handoff.delivered_at is not None
    assert handoff.delivered_at - handoff.created_at < BOUND_S * 1000
    time.sleep(1.0)
    printed = [line for line in out.read_text().splitlines() if f"handoff {key}:" in line]
    assert len(printed) == 1 and printed[0].startswith(f"handoff {key}:"), out.read_text()


@pytest.mark.real_pi
def test_a_handoff_reaches_an_idle_pi_masters_conversation_as_it_is_written(mlab: MLab) -> None:  # noqa: F811
    lab, llm, _script = mlab
    slow_heartbeat(lab)
    idle_pi_master(lab, llm)
    (key,) = [a.key for a in lab.fire("Say hello.", profile="standin-print").job.agents]
    # Written, delivered or not yet: the bridge may take it within milliseconds of the write.
    wait_for(f"{key}'s handoff", lambda: lab.store.get(key).handoffs, timeout=60)

    def in_conversation(llm: FakeLLM = llm) -> bool:
        return any(key in text for text in last_conversation(llm))

    wait_for("the handoff in the model's conversation", in_conversation, timeout=BOUND_S)
    wait_for("the handoff marked delivered", lambda: delivered(lab, key), timeout=BOUND_S)


@pytest.mark.real_pi
def test_a_handoff_written_before_the_masters_pi_is_ready_is_posted_when_its_bridge_reports_ready(
    mlab: MLab,  # noqa: F811
) -> None:
    """Issue 29.6: no entry changes once pi is up (the feed has nothing to say), so only the
    bridge's ready report can post it before the heartbeat (a minute here)."""
    lab, llm, _script = mlab
    slow_heartbeat(lab)
    dead = dead_identity()
    worker = lab.store.register(make_entry("w1", process=dead, parent_pid=dead.pid, parent_session_id="boss"))
    end = ExitRecord(kind=ExitKind.EXITED, at=now_ms(), code=0)
    lab.store.update(worker.key, lambda e: lifecycle.record_terminal(e, end, now_ms(), summary="finished"))
    master_window(lab)  # no prompt: pi starts, reports ready, and waits
    master = wait_for("the master's pi", lambda: (e := lab.store.find("master-boss")) and e.child_pid and e)
    lab.started.extend(i for i in (master.process, master.child_process) if i is not None)

    def events(name: str) -> list[dict[str, Any]]:
        return read_events(lab.state, master.key, name)

    (ready,) = wait_for("the bridge ready", lambda: events("bridge_ready"), timeout=60)
    (accepted,) = wait_for("the handoff accepted", lambda: events("handoff_accepted"), timeout=BOUND_S)
    (posted, *_) = notices_posted(lab, master.key, "handoff")
    print(f"ready -> posted {posted['at'] - ready['at']} ms, -> accepted {accepted['at'] - ready['at']} ms")
    assert accepted["at"] - ready["at"] < READY_BOUND_S * 1000
    wait_for(
        "the handoff in the model's conversation",
        lambda: any(worker.key in text for text in last_conversation(llm)),
        timeout=BOUND_S,
    )
    wait_for("the handoff marked delivered", lambda: delivered(lab, worker.key), timeout=BOUND_S)


def test_the_entry_feed_names_the_entries_written_and_nothing_else(tmp_path: Path) -> None:
    from pi_tmux_matrix.identity import AgentIdentityContract, Role
    from pi_tmux_matrix.inotify import Watches
    from pi_tmux_matrix.matrix import lifecycle
    from pi_tmux_matrix.matrix.store import MatrixStore, now_ms
    from pi_tmux_matrix.supervise.feed import EntryFeed

    store = MatrixStore(tmp_path / "state")
    me = procs.current()

    def register(session: str, role: Role) -> None:
        identity = AgentIdentityContract(agent_id=f"a-{session}", session_id=session)
        store.register(lifecycle.new_entry(role=role, identity=identity, process=me, now=now_ms()))

    register("boss", Role.MASTER)
    watches = Watches()
    told: list[set[str] | None] = []
    feed = EntryFeed(str(store.root), "master-boss", watches, told.append)
    assert feed.watched and watches.fd is not None
    watches.dispatch()
    assert told == []
    register("w1", Role.WORKER)
    register("boss", Role.MASTER)  # our own writes do not wake us
    (store.root / "notes.txt").write_text("foreign")
    watches.dispatch()
    assert told == [{"worker-w1"}]
    (store.root / "notes.txt").write_text("foreign again")  # nothing of an entry: nobody is told
    watches.dispatch()
    assert told == [{"worker-w1"}]
    feed.close()
    watches.close()
