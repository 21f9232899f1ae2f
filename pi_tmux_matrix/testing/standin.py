"""The bundled stand-in agent: behaves enough like ``pi`` to demo and test without an LLM.

``python -m pi_tmux_matrix.testing.standin [-p | --mode rpc] [--session FILE] [TASK...]``

It takes a task, prints progress, writes a pi-like JSONL session file (header line, then
messages), and ends its turn with a ``DONE`` marker (``BLOCKED`` if the task says so). Like pi:

* print mode (``-p``) does one turn and exits;
* interactive mode does the first turn, then stays for more: lines on stdin are prompts, and
  notices appended to ``$PI_MATRIX_MAILBOX`` (what the pi bridge reads) arrive as steering
  messages; a ``shutdown`` notice or SIGTERM ends it gracefully (exit 0);
* a fork child (``PI_FORK=1`` with ``PI_FORK_RESULT_PATH``) does its one turn, writes the
  result file the bridge would write, and exits;
* rpc mode speaks JSON lines on stdin/stdout (``prompt``, ``steer``, ``follow_up``, ``abort``,
  ``get_state``) and exits at stdin EOF.

Tasks may contain ``FAIL`` (exit 3), ``BLOCKED`` (marker, exit 2 in print mode) or ``HANG``
(never finishes the turn). ``STANDIN_STEPS`` and ``STANDIN_STEP_S`` set the pace;
``STANDIN_SILENT_BRIDGE=1`` makes it a pi whose bridge never reports in.

It accepts (and ignores) pi's launch flags (``--model``, ``--thinking``, ``--tools``,
``--no-tools``, ``-e``, ``--append-system-prompt``, ``--worktree-lane``), so the ``pi`` argv
builder of a launch profile can run it. Like an agent following the dispatcher's instructions,
it ends each turn with ``$PI_MATRIX_DONE_MARKER`` (done) or ``$PI_MATRIX_BLOCKED_MARKER reason``
(blocked) on a line of its own; a prompt whose last line is
``[pi-matrix] marker code <nonce>`` switches it to ``DONE:<nonce>``/``BLOCKED:<nonce>`` from then on.

``STANDIN_USAGE=<text>`` (opt-in) makes it claim its usage like a cooperative worker: at each
turn's end, before its marker, it writes ``<text>`` as is to the round's claim file
(``$PI_MATRIX_USAGE_FILE``, then the file a prompt's ``[pi-matrix] usage file <path>`` names).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import select
import signal
import stat
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Final

from ..contract import (
    ENV_AGENT_DIR,
    ENV_BLOCKED_MARKER,
    ENV_DONE_MARKER,
    ENV_FORK,
    ENV_FORK_RESULT_PATH,
    ENV_FORK_RUN_ID,
    ENV_KEY,
    ENV_MAILBOX,
    ENV_STATE_DIR,
    ENV_USAGE_FILE,
)
from ..strictjson import JSONObject

__all__ = ["ENV_SILENT_BRIDGE", "ENV_STEPS", "ENV_STEP_S", "ENV_USAGE", "KNOBS", "main"]

# The stand-in's own knobs (a test double's: no product code reads them, none is in PASS_ENV; a
# launched stand-in gets them from the environment its launcher or its tmux server started with,
# or from a dispatcher given testing.knobs.StandInKnobs).
ENV_STEPS: Final = "STANDIN_STEPS"
ENV_STEP_S: Final = "STANDIN_STEP_S"
ENV_SILENT_BRIDGE: Final = "STANDIN_SILENT_BRIDGE"
ENV_USAGE: Final = "STANDIN_USAGE"  # set by a profile's env (per agent)
KNOBS: Final = (ENV_STEPS, ENV_STEP_S, ENV_SILENT_BRIDGE)  # set by a test's env (per dispatcher)
# A follow-up round's markers, as the dispatcher appends them to the prompt's last line.
# (The code alone: a marker spelled out in a prompt could be wrapped onto a line of its own by a
# narrow pane and read by the watcher as the agent's answer.)
MARKER_LINE = re.compile(r"\[pi-matrix\] marker code ([0-9A-Za-z]+)")
# The round's usage claim file, as the marker instruction names it.
USAGE_LINE = re.compile(r"\[pi-matrix\] usage file (\S+)")
NOTICES_READ_BYTES = 1 << 20  # of the notices file per poll (the bridge reads as much)


class Session:
    """An append-only JSONL session file, the way pi keeps one."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.id = uuid.uuid4().hex
        if path is None:
            return
        if path.exists() and path.stat().st_size:
            with open(path, encoding="utf-8") as handle:
                first = handle.readline()
            with contextlib.suppress(ValueError):
                self.id = json.loads(first).get("id", self.id)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.append({"type": "session", "version": 3, "id": self.id, "cwd": os.getcwd()})

    def append(self, record: JSONObject) -> None:
        if self.path is None:
            return
        record.setdefault("timestamp", time.time())
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()


def _default_session_path() -> Path:
    agent_dir = Path(os.environ.get(ENV_AGENT_DIR) or Path.home() / ".pi" / "agent")
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
    return agent_dir / "sessions" / "stand-in" / f"{stamp}_{uuid.uuid4().hex[:12]}.jsonl"


class Agent:
    def __init__(self, session: Session, emit_rpc: bool) -> None:
        self.session = session
        self.emit_rpc = emit_rpc
        self.steps = int(os.environ.get(ENV_STEPS, "3"))
        self.step_s = float(os.environ.get(ENV_STEP_S, "0.2"))
        self.aborted = False
        self.stopping = False
        # Called while a turn runs: pi takes steering messages mid-turn, so does the stand-in.
        self.on_idle: Any = None
        self.done_marker = os.environ.get(ENV_DONE_MARKER) or None
        self.blocked_marker = os.environ.get(ENV_BLOCKED_MARKER) or None
        self.last_reply: str | None = None
        self.usage_file = os.environ.get(ENV_USAGE_FILE) or None

    def out(self, text: str) -> None:
        if not self.emit_rpc:
            print(text, flush=True)

    def event(self, record: JSONObject) -> None:
        if self.emit_rpc:
            print(json.dumps(record), flush=True)

    def _take_markers(self, task: str) -> None:
        lines = task.rstrip().splitlines()
        found = MARKER_LINE.fullmatch(lines[-1].strip()) if lines else None
        if found is not None:
            self.done_marker, self.blocked_marker = f"DONE:{found.group(1)}", f"BLOCKED:{found.group(1)}"
        for line in lines:
            named = USAGE_LINE.search(line)
            if named is not None:
                self.usage_file = named.group(1)

    def _task_words(self, task: str) -> str:
        """The task without the dispatcher's marker lines: its instruction says "print BLOCKED
        ..." on every task, which must not read as a task that asks to be blocked."""
        nonces = {m.split(":", 1)[1] for m in (self.done_marker, self.blocked_marker) if m and ":" in m}
        return "\n".join(
            line
            for line in task.splitlines()
            if not any(n in line for n in nonces) and not USAGE_LINE.search(line)
        )

    def turn(self, task: str) -> int:
        """One agent turn; returns 0 done, 2 blocked, 3 failed."""
        self._take_markers(task)
        words = self._task_words(task)
        self.session.append({"type": "message", "role": "user", "content": task})
        self.event({"type": "agent_start"})
        self.out(f"stand-in: working on: {task}")
        if "HANG" in words:
            while not self.aborted and not self.stopping:
                self._wait(0.05)
        for step in range(1, self.steps + 1):
            if self.aborted or self.stopping:
                break
            self._wait(self.step_s)
            self.out(f"stand-in: step {step}/{self.steps}")
        if "FAIL" in words:
            reply, marker, code = f"failed: {task}", "FAILED", 3
        elif "BLOCKED" in words:
            reply, marker, code = f"blocked: {task}", "BLOCKED", 2
        else:
            reply, marker, code = f"done: {task}", "DONE", 0
        # The dispatcher's marker ends the reply, the way an agent told to print it would end.
        final: str | None = None
        if code == 0 and self.done_marker:
            final = self.done_marker
        elif code == 2 and self.blocked_marker:
            final = f"{self.blocked_marker} the task says BLOCKED"
        if final is not None:
            reply = f"{reply}\n{final}"
            self._claim_usage()
        self.last_reply = reply
        message = {"role": "assistant", "content": reply}
        self.session.append({"type": "message", **message})
        self.event({"type": "message_end", "message": message})
        self.event({"type": "agent_end", "message": message})
        self.out(marker)
        if final is not None:
            self.out(final)
        return code

    def _claim_usage(self) -> None:
        """``STANDIN_USAGE``, written as is to the round's claim file before the marker shows."""
        claim = os.environ.get(ENV_USAGE)
        if claim is None or self.usage_file is None:
            return
        target = Path(self.usage_file)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            tmp.write_text(claim)
            tmp.replace(target)

    def _wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            if self.on_idle is not None:
                self.on_idle()
            left = end - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, 0.05))

    def steer(self, text: str) -> None:
        self.session.append({"type": "message", "role": "user", "steer": True, "content": text})
        self.out(f"stand-in: steering message: {text}")


def _notices(path: str | None, offset: int) -> tuple[list[JSONObject], int]:
    if not path:
        return [], offset
    # The state dir's read rules, as the pi bridge keeps them (the stand-in imports nothing of the
    # matrix, like the agent it stands in for): never a symlink, never blocked on a FIFO, bounded.
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return [], offset
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return [], offset
        data = os.pread(fd, NOTICES_READ_BYTES, offset)
    except OSError:
        return [], offset
    finally:
        os.close(fd)
    complete = data[: data.rfind(b"\n") + 1]
    found: list[JSONObject] = []
    for line in complete.splitlines():
        try:
            value = json.loads(line)
        except (ValueError, RecursionError):  # a line nested too deep is skipped like a torn one
            continue
        if isinstance(value, dict):
            found.append(value)
    return found, offset + len(complete)


def _interactive(agent: Agent, first: str | None) -> int:
    def graceful(_sig: int, _frame: object) -> None:
        agent.stopping = True

    signal.signal(signal.SIGTERM, graceful)
    mailbox = os.environ.get(ENV_MAILBOX)
    state = {"offset": 0}
    if mailbox and os.path.exists(mailbox):
        state["offset"] = os.path.getsize(mailbox)  # notices from before we started are not for us
    prompts: list[str] = []

    def poll() -> None:
        notices, state["offset"] = _notices(mailbox, state["offset"])
        for notice in notices:
            kind = notice.get("type")
            text = str(notice.get("message", ""))
            if kind == "shutdown":
                agent.stopping = True
            elif kind == "abort":
                agent.aborted = True
            elif kind == "prompt":
                prompts.append(text)
            else:
                agent.steer(text)

    agent.on_idle = poll
    if first:
        agent.turn(first)
    watch_stdin = sys.stdin is not None and not sys.stdin.closed and sys.stdin.isatty()
    while not agent.stopping:
        if watch_stdin:
            ready, _, _ = select.select([sys.stdin], [], [], 0.1)
            if ready:
                line = sys.stdin.readline()
                if not line:
                    break
                if line.strip():
                    prompts.append(line.strip())
        else:
            time.sleep(0.1)
        poll()
        while prompts and not agent.stopping:
            agent.aborted = False
            agent.turn(prompts.pop(0))
    agent.session.append({"type": "shutdown"})
    agent.out("stand-in: shutting down")
    return 0


def _rpc(agent: Agent) -> int:
    for line in sys.stdin:
        try:
            command = json.loads(line)
        except ValueError:
            agent.event({"type": "response", "success": False, "error": "not JSON"})
            continue
        kind = command.get("type")
        agent.event({"type": "response", "command": kind, "success": True, "id": command.get("id")})
        if kind in {"prompt", "follow_up"}:
            agent.turn(str(command.get("message", "")))
        elif kind == "steer":
            agent.steer(str(command.get("message", "")))
        elif kind == "abort":
            agent.aborted = True
        elif kind == "get_state":
            agent.event(
                {
                    "type": "state",
                    "sessionId": agent.session.id,
                    "sessionFile": str(agent.session.path) if agent.session.path else None,
                }
            )
    agent.session.append({"type": "shutdown"})
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stand-in", description="a stand-in coding agent")
    parser.add_argument("-p", "--print", action="store_true", dest="print_mode")
    parser.add_argument("--mode", choices=["interactive", "print", "rpc", "json"], default=None)
    parser.add_argument("--session")
    parser.add_argument("--session-dir")
    parser.add_argument("--no-session", action="store_true")
    parser.add_argument("--offline", action="store_true")
    parser.add_argument("-e", "--extension", action="append", default=[])
    parser.add_argument("--no-extensions", action="store_true")
    parser.add_argument("--model")
    # pi's launch flags, accepted so a pi launch profile can run the stand-in; they change nothing.
    parser.add_argument("--thinking")
    parser.add_argument("--tools")
    parser.add_argument("--no-tools", action="store_true")
    parser.add_argument("--append-system-prompt")
    parser.add_argument("--worktree-lane")
    parser.add_argument("--version", action="store_true")
    parser.add_argument("message", nargs="*")
    args, _unknown = parser.parse_known_args(argv)
    if args.version:  # as pi answers it: one line, at once (doctor asks every agent command)
        from .. import __version__

        print(f"stand-in {__version__}")
        return 0
    mode = args.mode or ("print" if args.print_mode else "interactive")
    if args.no_session:
        path = None
    elif args.session:
        path = Path(args.session)
    elif args.session_dir:
        path = Path(args.session_dir) / f"{uuid.uuid4().hex[:12]}.jsonl"
    else:
        path = _default_session_path()
    session = Session(path)
    bridged = any(Path(e).name == "bridge.ts" for e in args.extension)
    # STANDIN_SILENT_BRIDGE=1: like a pi whose bridge failed to load (it never reports in).
    if bridged and not os.environ.get(ENV_SILENT_BRIDGE):
        _report_like_the_bridge(session)
    agent = Agent(session, emit_rpc=mode == "rpc")
    task = " ".join(args.message) or None
    if mode == "rpc":
        return _rpc(agent)
    if _fork_child() and task and mode == "interactive":
        # Like pi with the bridge in a fork child: one run, its result.json, then exit (without
        # the bridge pi would leave no result: the parent records a synthetic failure).
        code = agent.turn(task)
        if bridged:
            _write_fork_result(agent, session, code)
        return code
    if mode == "print":
        if not task:
            print("stand-in: nothing to do (give a task)", file=sys.stderr)
            return 1
        return agent.turn(task)
    return _interactive(agent, task)


def _fork_child() -> bool:
    return os.environ.get(ENV_FORK) == "1" and bool(os.environ.get(ENV_FORK_RESULT_PATH))


def _write_fork_result(agent: Agent, session: Session, code: int) -> None:
    """The bridge's fork ``result.json``: the last reply, a stop reason, a small usage."""
    reply = agent.last_reply or ""
    result = {
        "runId": os.environ.get(ENV_FORK_RUN_ID),
        "at": int(time.time() * 1000),
        "text": reply,
        "stopReason": "stop" if code in (0, 2) else "error",
        "errorMessage": None if code in (0, 2) else reply,
        "usage": {"input": 10, "output": 5, "totalTokens": 15, "cost": {"total": 0.001}},
        "model": "stand-in",
        "sessionId": session.id,
        "sessionFile": str(session.path) if session.path else None,
    }
    target = Path(os.environ[ENV_FORK_RESULT_PATH])
    tmp = target.with_name(f".{target.name}.tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(result))
        tmp.replace(target)


def _report_like_the_bridge(session: Session) -> None:
    """With the pi bridge asked for (``-e …/bridge.ts``), report the session identity to the host
    the way the bridge does, so a stand-in agent looks like bridged pi to its host."""
    key, state = os.environ.get(ENV_KEY, ""), os.environ.get(ENV_STATE_DIR, "")
    if not key or not state:
        return
    folder = Path(state) / "mailbox" / key
    with contextlib.suppress(OSError):
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        now = int(time.time() * 1000)
        report = {"sessionId": session.id, "sessionFile": str(session.path) if session.path else None}
        body = {"kind": "identity", "text": json.dumps(report), "at": now, "sender": "bridge"}
        final = folder / f"{now:015d}-{uuid.uuid4().hex[:8]}.json"
        tmp = folder / f".{final.name}.tmp"
        tmp.write_text(json.dumps(body))
        tmp.replace(final)


if __name__ == "__main__":
    sys.exit(main())
