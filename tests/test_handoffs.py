"""Issue 19: handoffs and mailbox messages reach pi's conversation exactly once, in order, and are
acknowledged only after pi took them. Real pi against the fake LLM; the fake's request log (what
the model was sent) is the evidence."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from fake_llm import FakeLLM
from test_dispatch import Lab, wait_for
from test_master_tool import Scripted, master_window, mlab  # noqa: F401  (the fixture)
from test_real_pi import pilab  # noqa: F401  (the fixture)

from pi_tmux_matrix import procs
from pi_tmux_matrix.matrix.model import Entry, Status

MLab = tuple[Lab, FakeLLM, Scripted]


def _texts(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def last_conversation(llm: FakeLLM) -> list[str]:
    """The user-side messages of the model's latest request: the whole conversation it was sent."""
    request = llm.requests[-1] if llm.requests else {}
    return [_texts(m) for m in request.get("messages", []) if m.get("role") == "user"]


def notices_posted(lab: Lab, key: str, kind: str) -> list[dict[str, Any]]:
    path = lab.state / "mailbox" / f"{key}.agent.jsonl"
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [n for n in lines if n.get("type") == kind]


def handoff_order(lab: Lab) -> list[str]:
    """The worker keys in the order the master's host first posted their handoffs."""
    keys: list[str] = []
    for notice in notices_posted(lab, "master-boss", "handoff"):
        text = json.loads(notice["message"])["text"]
        key = next(w for w in text.split() if w.startswith("worker-")).strip("(),")
        if key not in keys:
            keys.append(key)
    return keys


def idle_pi_master(lab: Lab, llm: FakeLLM) -> Entry:
    """An interactive pi master in tmux that has answered its first prompt and waits."""
    master_window(lab, "Begin.")
    entry = wait_for(
        "the master's pi", lambda: (e := lab.store.find("master-boss")) and e.child_pid and e, timeout=30
    )
    wait_for("its first turn", lambda: len(llm.requests) >= 1, timeout=60)
    lab.master = entry
    lab.started.extend(i for i in (entry.process, entry.child_process) if i is not None)
    return entry


def finish_workers_while_held(lab: Lab, master: Entry, count: int) -> list[str]:
    """``count`` workers end while the master's host is stopped, so their handoffs are pending
    together when it runs again (as after a burst of workers ending in one second)."""
    assert master.process is not None
    procs.send_signal(master.process, signal.SIGSTOP)
    keys: list[str] = []
    try:
        for n in range(count):
            fired = lab.fire(f"Say hello {n}.", profile="standin-print")
            keys += [a.key for a in fired.job.agents]
        for key in keys:
            wait_for(f"{key}'s handoff recorded", lambda k=key: lab.store.get(k).undelivered, timeout=60)
    finally:
        procs.send_signal(master.process, signal.SIGCONT)
    return keys


def test_two_handoffs_at_an_idle_master_both_reach_the_conversation_once_in_order(mlab: MLab) -> None:  # noqa: F811
    lab, llm, _script = mlab
    master = idle_pi_master(lab, llm)
    keys = finish_workers_while_held(lab, master, 2)

    def both_seen() -> bool:
        said = "\n".join(last_conversation(llm))
        return all(key in said for key in keys)

    wait_for("both handoffs in the model's conversation", both_seen, timeout=30,
             detail=lambda: "\n---\n".join(last_conversation(llm)))  # fmt: skip
    for key in keys:
        wait_for(f"{key} delivered", lambda k=key: lab.store.get(k).status is Status.CLOSED, timeout=30)
    conversation = last_conversation(llm)
    for key in keys:
        assert sum(key in text for text in conversation) == 1, f"{key} not exactly once"
    at = [next(i for i, text in enumerate(conversation) if key in text) for key in handoff_order(lab)]
    assert at == sorted(at), "the handoffs reached the conversation in the order they were posted"


def send(lab: Lab, key: str, *words: str) -> None:
    argv = [sys.executable, "-m", "pi_tmux_matrix", "send", key, *words]
    done = subprocess.run(argv, env=lab.env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr


def test_two_prompts_in_a_row_to_an_idle_pi_worker_both_reach_the_model_once_in_order(
    pilab: tuple[Lab, FakeLLM],  # noqa: F811
) -> None:
    lab, llm = pilab
    lab.start_master()
    fired = lab.fire("Say hello.", profile="pi-worker")
    (agent,) = fired.job.agents
    entry = lab.worker(agent.key)
    wait_for("the DONE result", lambda: lab.result(fired.job.id, agent.agent_id), timeout=60)
    assert entry.child_process is not None
    # pi is held while both arrive, so its bridge finds them together (two sends in one poll).
    procs.send_signal(entry.child_process, signal.SIGSTOP)
    try:
        send(lab, agent.key, "--prompt", "first follow-up ALPHA")
        send(lab, agent.key, "--prompt", "second follow-up BRAVO")
        wait_for("both notices", lambda: len(notices_posted(lab, agent.key, "prompt")) == 2, timeout=20)
    finally:
        procs.send_signal(entry.child_process, signal.SIGCONT)

    def both_seen() -> bool:
        said = "\n".join(last_conversation(llm))
        return "ALPHA" in said and "BRAVO" in said

    wait_for("both prompts in the model's conversation", both_seen, timeout=30,
             detail=lambda: "\n---\n".join(last_conversation(llm)))  # fmt: skip
    conversation = last_conversation(llm)
    alpha = [i for i, text in enumerate(conversation) if "ALPHA" in text]
    bravo = [i for i, text in enumerate(conversation) if "BRAVO" in text]
    assert len(alpha) == 1 and len(bravo) == 1 and alpha[0] < bravo[0]
    taken = wait_for(
        "pi's acknowledgements",
        lambda: len(e := [x for x in _events(lab, agent.key) if x.get("event") == "notice_taken"]) >= 2 and e,
        timeout=20,
    )
    assert [t["kind"] for t in taken] == ["prompt", "prompt"]


def _events(lab: Lab, key: str) -> list[dict[str, Any]]:
    path = Path(lab.state) / "events" / f"{key}.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
