"""The `forks +$…` footer's events (seed 003, issue 23): a resumed session shows the sum of the
fork results already in its file at ``session_start``, before any turn; ``/tree`` recomputes it
for the branch now shown (``session_tree``); a session that shuts down clears it. Real pi 0.73.1:
the TUI read from the tmux pane for the first two, rpc mode (where ``setStatus`` is an
``extension_ui_request`` on stdout) for the clear, which no pane outlives."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pilabs import MLab, PiLab, capture, master_window
from waiting import wait_for

from pi_tmux_matrix.bridge import bridge_path
from pi_tmux_matrix.pisession import new_session_file

pytestmark = pytest.mark.real_pi  # real pi: .ci/run's oldest-pi pass runs this file too

FORK_RESULT_TYPE = "pi-matrix-fork-result"
STATUS_KEY = "fork-cost"
STAMP = "2026-12-03T00:00:00.000Z"


class SessionFile:
    """A pi session file written by the test: a header and entries linked by ``parentId``; the
    last entry written is the leaf pi resumes at."""

    def __init__(self, path: Path, session_id: str, cwd: Path) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = [
            {"type": "session", "version": 3, "id": session_id, "timestamp": STAMP, "cwd": str(cwd)}
        ]

    def add(self, parent: str | None, **record: Any) -> str:
        entry_id = f"e{len(self.records):07x}"
        self.records.append({"id": entry_id, "parentId": parent, "timestamp": STAMP, **record})
        return entry_id

    def message(self, parent: str | None, message: dict[str, Any]) -> str:
        return self.add(parent, type="message", message={"timestamp": 1796256000000, **message})

    def user(self, parent: str | None, text: str) -> str:
        return self.message(parent, {"role": "user", "content": [{"type": "text", "text": text}]})

    def assistant(self, parent: str, *content: dict[str, Any]) -> str:
        usage = {
            "input": 10, "output": 5, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 15,
            "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0},
        }  # fmt: skip
        stop = "toolUse" if any(c["type"] == "toolCall" for c in content) else "stop"
        message = {
            "role": "assistant", "content": list(content), "api": "openai-completions", "provider": "fake",
            "model": "fake-model", "usage": usage, "stopReason": stop,
        }  # fmt: skip
        return self.message(parent, message)

    def said(self, parent: str, text: str) -> str:
        return self.assistant(parent, {"type": "text", "text": text})

    def fork(self, parent: str, run_id: str, cost: float, *, background: bool = False) -> str:
        """A `fork` tool call and its result, as the bridge's tool records them."""
        call = f"call-{run_id}"
        arguments: dict[str, Any] = {"task": f"Look, {run_id}."}
        if background:
            arguments["background"] = True
        asked = self.assistant(
            parent, {"type": "toolCall", "id": call, "name": "fork", "arguments": arguments}
        )
        mode = "background" if background else "wait"
        usage = None if background else {"input": 10, "output": 5, "totalTokens": 15, "cost": cost}
        details = {"runId": run_id, "mode": mode, "status": "running" if background else "completed",
                   "model": "fake-model", "usage": usage, "activity": []}  # fmt: skip
        text = f"Fork {run_id} started in the background." if background else f"Answer of {run_id}."
        result = {
            "role": "toolResult", "toolCallId": call, "toolName": "fork",
            "content": [{"type": "text", "text": text}], "details": details, "isError": False,
        }  # fmt: skip
        return self.message(asked, result)

    def delivered(self, parent: str, run_id: str, cost: float) -> str:
        """A background fork's result, delivered as the bridge's custom message."""
        usage = {"input": 10, "output": 5, "totalTokens": 15, "cost": cost}
        return self.add(
            parent, type="custom_message", customType=FORK_RESULT_TYPE, display=True,
            content=f"[pi-matrix fork {run_id}] completed\nBackground answer of {run_id}.",
            details={"runId": run_id, "status": "completed", "usage": usage, "model": "fake-model"},
        )  # fmt: skip

    def write(self) -> Path:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("".join(json.dumps(r) + "\n" for r in self.records))
        return self.path


def boss_session(lab: PiLab) -> SessionFile:
    """The file of session ``boss`` where a master of that session finds it and resumes it."""
    return SessionFile(Path(new_session_file(str(lab.work), "boss", lab.env)), "boss", lab.work)


def footer_of(lab: PiLab) -> str:
    """The footer's last lines (where pi draws the extension statuses)."""
    return "\n".join(capture(lab).rstrip().splitlines()[-3:])


def keys(lab: PiLab, *names: str, literal: bool = False) -> None:
    flags = ["-l"] if literal else []
    subprocess.run(["tmux", "-L", lab.socket, "send-keys", "-t", "=m:", *flags, *names], check=True)


def tree_select(lab: PiLab, search: str) -> None:
    """``/tree``, then the one entry whose text has ``search``, selected."""
    keys(lab, "/tree", literal=True)
    time.sleep(0.3)  # the command's autocomplete
    keys(lab, "Enter")
    wait_for("the tree", lambda: "Type to search" in capture(lab), timeout=10, detail=lambda: capture(lab))
    keys(lab, search, literal=True)
    time.sleep(0.3)
    keys(lab, "Enter")


def test_a_resumed_session_shows_the_sum_of_its_fork_results_before_any_turn(
    mlab: MLab,
) -> None:
    lab, llm, _script = mlab
    session = boss_session(lab)
    asked = session.user(None, "Fork twice.")
    waited = session.fork(asked, "run-1", 0.02)
    more = session.said(waited, "One more, in the background.")
    started = session.fork(more, "run-2", 0.5, background=True)
    arrived = session.delivered(session.said(started, "Waiting."), "run-2", 0.05)
    session.said(arrived, "Both forks are back.")
    session.write()

    master_window(lab)  # `pi-matrix master --session-id boss`: resumes the file above
    wait_for("the resumed conversation", lambda: "Both forks are back." in capture(lab), timeout=60)
    # $0.02 waited + $0.05 delivered; the background call's own result ($0.50 here) is not counted.
    wait_for("the footer", lambda: "forks +$0.07" in footer_of(lab), timeout=30, detail=lambda: capture(lab))
    assert llm.requests == []  # no turn ran: session_start drew it


def test_navigating_the_tree_recomputes_the_footer_for_the_branch_now_shown(
    mlab: MLab,
) -> None:
    lab, llm, _script = mlab
    settings = json.loads((lab.agent_dir / "settings.json").read_text())
    settings["branchSummary"] = {"skipPrompt": True}  # /tree moves without asking for a summary
    (lab.agent_dir / "settings.json").write_text(json.dumps(settings))
    session = boss_session(lab)
    asked = session.user(None, "Try both ways.")
    session.said(session.fork(asked, "run-a", 0.02), "The alpha way is done.")
    session.said(session.fork(asked, "run-b", 0.05), "The beta way is done.")  # the leaf pi resumes at
    session.write()

    master_window(lab)
    wait_for(
        "the footer of way B",
        lambda: "forks +$0.05" in footer_of(lab),
        timeout=60,
        detail=lambda: capture(lab),
    )
    tree_select(lab, "alpha")  # way A's last answer: the leaf moves there
    wait_for("the branch of way A", lambda: "Navigated to selected point" in capture(lab), timeout=10,
             detail=lambda: capture(lab))  # fmt: skip
    shown = capture(lab)
    assert "The alpha way is done." in shown and "The beta way is done." not in shown, shown
    wait_for("the footer of way A", lambda: "forks +$0.02" in footer_of(lab), timeout=10,
             detail=lambda: capture(lab))  # fmt: skip
    assert "forks +$0.05" not in footer_of(lab)

    tree_select(lab, "both")  # the first prompt: the leaf moves before it, no fork on the branch
    wait_for("the empty branch", lambda: "The alpha way is done." not in capture(lab), timeout=10,
             detail=lambda: capture(lab))  # fmt: skip
    wait_for("no footer", lambda: "forks +$" not in footer_of(lab), timeout=10, detail=lambda: capture(lab))
    assert llm.requests == []


class RpcPi:
    """pi in rpc mode with the bridge, as a master's (under a host's env) on session ``boss``'s
    file, and what it put out on stdout (``extension_ui_request``s, responses, events)."""

    def __init__(self, lab: PiLab, file: Path) -> None:
        env = dict(
            lab.env, PI_MATRIX_KEY="master-boss",
            PI_MATRIX_MAILBOX=str(lab.state / "mailbox" / "master-boss.agent.jsonl"),
            PI_MATRIX_CLI=json.dumps([sys.executable, "-m", "pi_tmux_matrix"]),
        )  # fmt: skip
        argv = [lab.pi, "--mode", "rpc", "--extension", str(bridge_path()), "--session", str(file)]
        self.proc = subprocess.Popen(
            argv, cwd=lab.work, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self.seen: list[dict[str, Any]] = []

    def read(self, deadline: float) -> dict[str, Any] | None:
        stdout = self.proc.stdout
        assert stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            if not selector.select(max(0.0, deadline - time.monotonic())):
                return None
            line = stdout.readline()
        if not line:
            return None  # pi has exited
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = {"raw": line}
        self.seen.append(record if isinstance(record, dict) else {"raw": line})
        return self.seen[-1]

    def statuses(self, until: Callable[[dict[str, Any]], bool], timeout: float) -> list[Any]:
        """The fork-cost statuses put out (their text, None for a clear) up to the first record
        ``until`` takes, or the end of stdout."""
        deadline = time.monotonic() + timeout
        shown: list[Any] = []
        while (record := self.read(deadline)) is not None:
            if record.get("method") == "setStatus" and record.get("statusKey") == STATUS_KEY:
                shown.append(record.get("statusText"))
            if until(record):
                return shown
        assert self.proc.poll() is not None or time.monotonic() < deadline, (
            f"pi said nothing more: {self.seen}"
        )
        return shown

    def send(self, command: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)


def footer_shown(record: dict[str, Any]) -> bool:
    return (
        record.get("method") == "setStatus"
        and record.get("statusKey") == STATUS_KEY
        and bool(record.get("statusText"))
    )


def one_fork_session(lab: PiLab) -> Path:
    session = boss_session(lab)
    session.said(session.fork(session.user(None, "Fork once."), "run-1", 0.02), "Done.")
    return session.write()


def test_quitting_clears_the_footer(mlab: MLab) -> None:
    """The status is set once the settings are read, and cleared by the shutdown (reason "quit")
    that closing rpc mode's stdin starts, before pi exits."""
    lab, llm, _script = mlab
    pi = RpcPi(lab, one_fork_session(lab))
    try:
        assert pi.statuses(footer_shown, 60)[-1:] == ["forks +$0.02"], pi.seen
        assert pi.proc.stdin is not None
        pi.proc.stdin.close()
        assert pi.statuses(lambda _r: False, 30) == [None], pi.seen
        assert pi.proc.wait(30) == 0
    finally:
        pi.stop()
    assert llm.requests == []


def test_a_new_session_clears_the_old_sessions_footer_as_it_shuts_down(
    mlab: MLab,
) -> None:
    """``new_session`` (``/new``): the old session's shutdown (reason "new") clears its footer
    before pi answers the command, not only the new session's own reading, which comes later."""
    lab, llm, _script = mlab
    pi = RpcPi(lab, one_fork_session(lab))
    try:
        assert pi.statuses(footer_shown, 60)[-1:] == ["forks +$0.02"], pi.seen
        pi.send({"type": "new_session", "id": "n1"})
        answered = pi.statuses(lambda r: r.get("type") == "response" and r.get("id") == "n1", 30)
        assert answered == [None], pi.seen
        assert pi.seen[-1].get("success") is True, pi.seen[-1]
    finally:
        pi.stop()
    assert llm.requests == []
