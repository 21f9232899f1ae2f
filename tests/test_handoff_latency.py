"""Issue 19, event-driven delivery: a worker's handoff reaches its idle master as it is written,
whatever ``heartbeatMs`` (here a minute, so a delivery riding the heartbeat misses every bound).

Real ``pi-matrix master`` hosts (a plain program's and real pi's, against the fake LLM), stand-in
workers fired through the dispatcher into a private tmux server; the master's own output and the
model's request log are the evidence."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from helpers import dead_identity, make_entry, read_events
from labs import STANDIN_PRINT, Lab
from model_script import last_conversation
from pilabs import MLab, delivered, idle_pi_master, master_window, notices_posted
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix import lifecycle
from pi_tmux_matrix.matrix.model import ExitKind, ExitRecord
from pi_tmux_matrix.matrix.store import now_ms
from pi_tmux_matrix.testing.fake_model import FakeModel

SLOW_BEAT_MS = 60_000
BOUND_S = 15.0  # far above the ≤1 s goal (a loaded CI machine), far below one heartbeat
READY_BOUND_S = 5.0  # issue 29.6: the goal is 1 s from ready; slack for a loaded 2-core machine


def slow_heartbeat(lab: Lab) -> None:
    path = lab.agent_dir / "settings.json"
    settings = json.loads(path.read_text())
    settings["processMatrix"]["heartbeatMs"] = SLOW_BEAT_MS
    path.write_text(json.dumps(settings))


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


def inotify_watches(pid: int) -> int:
    """How many paths ``pid``'s inotify instances watch (their ``inotify wd:`` lines)."""
    count = 0
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{name}") == "anon_inode:inotify":
                info = Path(f"/proc/{pid}/fdinfo/{name}").read_text()
                count += sum(line.startswith("inotify wd:") for line in info.splitlines())
        except OSError:
            continue
    return count


def test_a_plain_masters_host_prints_a_handoff_as_it_is_written_not_at_its_heartbeat(lab: Lab) -> None:
    slow_heartbeat(lab)
    lab.profile("standin-print", STANDIN_PRINT)
    out = lab.tmp / "master.out"
    plain_master(lab, out)
    assert lab.master is not None
    # Its inbox and nothing else: no worker's heartbeat wakes it (a hundred of them, every 30 s).
    # Its inbox is watched just after it registers: wait for that, then nothing more comes.
    wait_for("the master's inbox watch", lambda: inotify_watches(lab.master.pid) >= 1)
    time.sleep(0.5)
    assert inotify_watches(lab.master.pid) == 1
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
@pytest.mark.any_pi
def test_a_handoff_reaches_an_idle_pi_masters_conversation_as_it_is_written(mlab: MLab) -> None:
    lab, llm, _script = mlab
    slow_heartbeat(lab)
    idle_pi_master(lab, llm)
    (key,) = [a.key for a in lab.fire("Say hello.", profile="standin-print").job.agents]
    # Written, delivered or not yet: the bridge may take it within milliseconds of the write.
    wait_for(f"{key}'s handoff", lambda: lab.store.get(key).handoffs, timeout=60)

    def in_conversation(llm: FakeModel = llm) -> bool:
        return any(key in text for text in last_conversation(llm))

    wait_for("the handoff in the model's conversation", in_conversation, timeout=BOUND_S)
    wait_for("the handoff marked delivered", lambda: delivered(lab, key), timeout=BOUND_S)


@pytest.mark.real_pi
def test_a_handoff_written_before_the_masters_pi_is_ready_is_posted_when_its_bridge_reports_ready(
    mlab: MLab,
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


def test_a_new_handoff_tells_its_master_and_a_heartbeat_tells_nobody(tmp_path: Path) -> None:
    """The word a master's host wakes for: one message in its inbox per write that brings a new
    handoff addressed to it; none for a heartbeat (a hundred workers' beats must not wake it), none
    for a handoff it already has, and no mailbox made for a master that never made its own."""
    from pi_tmux_matrix.identity import AgentIdentityContract, Role
    from pi_tmux_matrix.matrix.mailbox import Inbox
    from pi_tmux_matrix.matrix.store import MatrixStore
    from pi_tmux_matrix.supervise.record import OwnRecord

    store = MatrixStore(tmp_path / "state")
    me = procs.current()
    boss = AgentIdentityContract(agent_id="a-boss", session_id="boss")
    store.register(lifecycle.new_entry(role=Role.MASTER, identity=boss, process=me, now=now_ms()))
    store.side_dir("mailbox", "master-boss")  # made by the master's host when it starts
    worker = AgentIdentityContract(agent_id="a-w1", session_id="w1")
    record = OwnRecord(store, "worker-w1")
    record.register(
        lifecycle.new_entry(
            role=Role.WORKER, identity=worker, process=me, now=now_ms(), parent=me, parent_session_id="boss"
        )
    )
    inbox = Inbox(store, "master-boss")
    assert inbox.take() == []
    record.write(lambda e: lifecycle.heartbeat(e, now_ms()), durable=False)
    assert inbox.take() == []  # a heartbeat wakes nobody
    ended = ExitRecord(kind=ExitKind.EXITED, code=0, at=now_ms())
    record.write(lambda e: lifecycle.record_terminal(e, ended, now_ms(), summary="done"))
    (told,) = inbox.take()
    assert (told.kind, told.text, told.sender) == ("handoff", "worker-w1", "worker-w1")
    record.write(lambda e: lifecycle.heartbeat(e, now_ms()), durable=False)
    assert inbox.take() == []  # the handoff it holds is not news

    # A worker whose master never ran here: its word goes nowhere, and no folder is made for it.
    orphan = OwnRecord(store, "worker-w2")
    lost = AgentIdentityContract(agent_id="a-w2", session_id="w2")
    orphan.register(
        lifecycle.new_entry(
            role=Role.WORKER, identity=lost, process=me, now=now_ms(), parent=me, parent_session_id="nobody"
        )
    )
    orphan.write(lambda e: lifecycle.record_terminal(e, ended, now_ms(), summary="done"))
    assert not (store.root / "mailbox" / "master-nobody").exists()
