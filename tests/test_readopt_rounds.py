"""Issue 29.7: after a master crash, a re-adopted interactive real-pi worker's round reaches the
new master's conversation as fast as a fresh worker's (the goal: within 2 s of its answer).

Real ``pi-matrix master -- pi`` (interactive, in the lab's tmux), a real interactive ``pi-worker``
fired through the dispatcher, both against the fake LLM; the model's request log is the clock.
The master is killed while the worker is still thinking, so the worker's turn takes the host's
"parent gone" and "adopted" notices as steers, and its run's last text is its answer to them,
not the marker."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pilabs import MLab, idle_pi_master, master_window
from waiting import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.testing.fake_model import MARKER_CODE, FakeModel, Reply, default_reply

pytestmark = [pytest.mark.real_pi, pytest.mark.any_pi]  # real pi; not in the oldest-pi pass

# The goal is 2 s from the answer; benchmarks/bench_handoff.py measures it (its re-adopted real-pi
# row). A test asserts no such figure: this bound is below the 5 s the watcher and the host each
# waited for a final text before (the bug this test is for), with room for a loaded machine (2.09 s
# seen on 2 cores under four workers and a second pytest run).
ROUND_BOUND_S = 4.5


class SlowFirstTask:
    """The worker's task is answered only once the test lets it (the master dies meanwhile)."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.go = threading.Event()

    def __call__(self, request: dict[str, Any]) -> Reply:
        reply = default_reply(request)
        if MARKER_CODE.search(str(request.get("messages"))) and not self.asked.is_set():
            self.asked.set()
            self.go.wait(60)
        return reply


def _masters(request: dict[str, Any]) -> bool:
    """A request of the master's pi: only it has the dispatcher's tool."""
    return "tmux_agent_manager" in str(request.get("tools"))


def _handoff_at(llm: FakeModel, key: str, after: float) -> float | None:
    """When the master's pi first sent the model a conversation holding ``key``'s handoff."""
    for at, request in llm.timed_requests():
        said = str(request.get("messages"))
        if at > after and _masters(request) and "[pi-matrix handoff]" in said and key in said:
            return at
    return None


def test_a_readopted_interactive_pi_workers_round_reaches_the_new_master_within_2s(
    mlab: MLab,
) -> None:
    lab, llm, _script = mlab
    slow = SlowFirstTask()
    llm.responder = slow
    master = idle_pi_master(lab, llm)
    session_file = Path(master.identity.session_file or "")
    fired = lab.fire("Say hello.", profile="pi-worker")
    (agent,) = fired.job.agents
    worker = lab.worker(agent.key)
    assert slow.asked.wait(60), "the worker asked the model"

    for identity in (master.child_process, master.process):
        assert identity is not None
        procs.send_signal(identity, signal.SIGKILL)
        assert procs.wait_for_exit(identity, 10)
    wait_for("the worker to lose its parent", lambda: lab.store.get(agent.key).status.value == "resumable")
    master_window(lab, "--session", str(session_file))
    back = wait_for(
        "the new master",
        lambda: (e := lab.store.find("master-boss")) and e.pid != master.pid and e.child_pid and e,
        timeout=30,
    )
    lab.started.extend(i for i in (back.process, back.child_process) if i is not None)
    wait_for(
        "the worker re-adopted by the new master",
        lambda: (e := lab.store.find(agent.key)) and e.parent_pid == back.pid and e.status.value == "running",
        timeout=60,
    )
    assert lab.store.get(agent.key).pid == worker.pid  # the same host: re-adopted, not relaunched
    wait_for("the new master's pi ready", lambda: lab.store.get("master-boss").ready_at, timeout=30)

    answered = time.monotonic()
    slow.go.set()  # the worker answers now, its marker first, then its words on the notices
    reached = wait_for(
        "the round's handoff in the new master's conversation",
        lambda: _handoff_at(llm, agent.key, answered),
        timeout=60,
        detail=(lab.state / "events" / f"{agent.key}.jsonl").read_text,
    )
    took = reached - answered
    print(f"re-adopted round: in the master's conversation {took:.2f}s after the answer")
    assert took < ROUND_BOUND_S, (lab.state / "events" / f"{agent.key}.jsonl").read_text()
    # The round's answer, not the worker's words on the notices it took after its marker.
    (handoff,) = lab.store.get(agent.key).handoffs
    assert handoff.summary == "Done with the task." and handoff.outcome.value == "done"
