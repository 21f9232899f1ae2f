"""The real-pi rows of benchmarks/bench_handoff.py: a worker's answer to the handoff in the
master's pi conversation, with the real pi CLI on both ends
(docs/decisions.md#the-rounds-answer-is-the-one-that-holds-the-marker).

A real interactive ``pi-matrix master -- pi`` runs in a private tmux server (``tmux -L``, never
the user's); a real interactive ``pi-worker`` is fired through the dispatcher with that master
as its parent; both talk to a fake OpenAI-compatible model started here on 127.0.0.1 (the wire
format of pi_tmux_matrix.testing.fake_model, with a hold the benchmark releases; the tests use
that one itself).
The model holds the worker's first request until the benchmark releases it: that instant is
"the answer". The figure ends at the first request of the master's pi whose messages hold
``[pi-matrix handoff]`` and the worker's key: the handoff is in the master's conversation.

Two cases, each in a lab of its own (state dir, agent dir, tmux server, model):
fresh, the master stays up; re-adopted, the master's host and its pi are killed (SIGKILL) while
the worker thinks, a new master starts on the same session file and re-adopts the worker, and
only then is the worker's answer released (~10 s before commit 624b2f4).

Settings are the defaults (a 30 s heartbeat), as a user gets them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from _wait import wait_for

from pi_tmux_matrix import procs
from pi_tmux_matrix.contract import ENV_STATE_DIR, NEVER_INHERITED
from pi_tmux_matrix.dispatch.manager import Dispatcher
from pi_tmux_matrix.dispatch.request import FireRequest
from pi_tmux_matrix.dispatch.tmux import TmuxServer
from pi_tmux_matrix.identity import ProcessIdentity
from pi_tmux_matrix.matrix.model import Entry
from pi_tmux_matrix.matrix.store import MatrixStore
from pi_tmux_matrix.settings import load_settings

GOAL_MS = 2000.0  # a round in the master's conversation within 2 s of its answer
SESSION = "bench"
MASTER_KEY = f"master-{SESSION}"
HANDOFF_TAG = "[pi-matrix handoff]"
# How the dispatcher asks for the completion marker (dispatch/request.py: marker_instruction);
# the marker itself never appears in the task, so the model must read the code from this.
MARKER_CODE = re.compile(r"DONE, a colon and the code ([0-9a-f]{6,32})")
CASES = ("fresh", "re-adopted")
WAIT_S = 60.0  # for any one step of a lab; a slow shared machine starts pi in 2-5 s


def find_pi(repo: Path) -> tuple[str | None, str]:
    """The pi binary (``$PI_MATRIX_PI_BIN``, else ``<repo>/.pi-cli/bin/pi``), or None and why."""
    configured = os.environ.get("PI_MATRIX_PI_BIN")
    path = Path(configured) if configured else repo / ".pi-cli" / "bin" / "pi"
    if not os.access(path, os.X_OK):
        return None, f"no pi at {path} (run 'bash scripts/install-pi' or set PI_MATRIX_PI_BIN)"
    if shutil.which("tmux") is None:
        return None, "tmux is not installed"
    return str(path), ""


# === the fake model ==============================================================================
def _text_of(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _stream(text: str) -> bytes:
    """One assistant message as pi reads it: server-sent chat-completion chunks, then [DONE]."""
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage},
    ]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


class FakeModel:
    """An OpenAI-compatible ``/v1/chat/completions`` on 127.0.0.1 that answers a dispatcher task
    with its marker and anything else with ``ok``; the first task request waits for
    :meth:`release`. Every request is kept with the ``time.monotonic()`` it arrived at."""

    def __init__(self) -> None:
        self.asked = threading.Event()  # the worker's task reached the model
        self._go = threading.Event()
        self._lock = threading.Lock()
        self._requests: list[tuple[float, dict[str, Any]]] = []
        self.released_at = 0.0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-model", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def release(self) -> None:
        """The worker answers now (its held request gets its marker reply)."""
        self.released_at = time.monotonic()
        self._go.set()

    def answer(self, request: dict[str, Any]) -> str:
        with self._lock:
            self._requests.append((time.monotonic(), request))
        messages = [m for m in request.get("messages") or [] if isinstance(m, dict)]
        users = [_text_of(m) for m in messages if m.get("role") == "user"]
        found = MARKER_CODE.search(users[-1]) if users else None
        if found is None:
            return "ok"
        if not self.asked.is_set():
            self.asked.set()
            self._go.wait(2 * WAIT_S)  # released, or the lab gives up on it
        return f"Done with the task.\nDONE:{found.group(1)}"

    def requests(self) -> int:
        with self._lock:
            return len(self._requests)

    def handoff_seen(self, key: str, after: float) -> float | None:
        """When the master's pi (the one request with the dispatcher's tool) first sent a
        conversation holding ``key``'s handoff, after ``after``; None while it has not."""
        with self._lock:
            requests = list(self._requests)
        for at, request in requests:
            said = str(request.get("messages"))
            masters = "tmux_agent_manager" in str(request.get("tools"))
            if at > after and masters and HANDOFF_TAG in said and key in said:
                return at
        return None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        model = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: object) -> None:  # quiet: the table is the output
                return

            def do_GET(self) -> None:
                self._send(200, "application/json", json.dumps({"data": [{"id": "fake-model"}]}).encode())

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                try:
                    request = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    request = {}
                self._send(200, "text/event-stream", _stream(model.answer(request)))

            def _send(self, status: int, kind: str, body: bytes) -> None:
                self.send_response(status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        return Handler

    def __enter__(self) -> FakeModel:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._go.set()  # a request still held ends, so its thread does
        self._server.shutdown()
        self._server.server_close()


def write_agent_dir(agent_dir: Path, base_url: str) -> None:
    """pi's ``models.json`` and ``settings.json`` against the fake (retries off: errors are quick);
    no ``processMatrix`` key, so pi-matrix runs with its defaults."""
    agent_dir.mkdir(parents=True, exist_ok=True)
    provider = {
        "baseUrl": base_url,
        "api": "openai-completions",
        "apiKey": "fake-key",
        "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
        "models": [{"id": "fake-model", "contextWindow": 128000, "maxTokens": 4096}],
    }
    (agent_dir / "models.json").write_text(json.dumps({"providers": {"fake": provider}}))
    settings = {
        "defaultProvider": "fake",
        "defaultModel": "fake-model",
        "quietStartup": True,
        "retry": {"enabled": False, "provider": {"maxRetries": 0}},
    }
    (agent_dir / "settings.json").write_text(json.dumps(settings))


# === a lab: state dir, agent dir, private tmux server ============================================
class Lab:
    """Everything one case starts, stopped by :meth:`cleanup`: each process by its identity (pid
    and start time), then this lab's own tmux server."""

    # What the master's pane needs from the lab's environment (tmux gives a pane the server's).
    PASSED = ("PATH", "HOME", "TMPDIR", "PI_OFFLINE", "NO_PROXY", "PI_CODING_AGENT_DIR", ENV_STATE_DIR,
              "PI_MATRIX_PI_COMMAND", "PI_MATRIX_TMUX_SOCKET", "PYTHONPATH", "VIRTUAL_ENV")  # fmt: skip

    def __init__(self, root: Path, pi: str, base_url: str) -> None:
        self.pi = pi
        self.socket = f"pm-bench-{os.getpid()}-{root.name}"
        self.state = root / "state"
        self.store = MatrixStore(self.state)
        self.work = root / "work"
        agent_dir, home, tmp = root / "agent", root / "home", root / "tmp"
        for folder in (self.work, home, tmp):
            folder.mkdir(parents=True, exist_ok=True)
        write_agent_dir(agent_dir, base_url)
        # Nothing of a pi-matrix agent this may run in (its key, its mailbox), nor its tmux.
        dropped = NEVER_INHERITED | {"TMUX", "TMUX_PANE"}
        env = {name: value for name, value in os.environ.items() if name not in dropped}
        env.update({
            ENV_STATE_DIR: str(self.state), "PI_CODING_AGENT_DIR": str(agent_dir), "HOME": str(home),
            "TMPDIR": str(tmp), "PI_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost",
            "PI_MATRIX_PI_COMMAND": json.dumps([pi]), "PI_MATRIX_TMUX_SOCKET": self.socket,
        })  # fmt: skip
        # The panes run in the lab's work dir: a relative PYTHONPATH (``PYTHONPATH=..``) would
        # import nothing there, and every host would end before starting its agent.
        if env.get("PYTHONPATH"):
            paths = env["PYTHONPATH"].split(os.pathsep)
            env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in paths if p)
        self.env = env
        self.started: list[ProcessIdentity] = []

    def start_master(self, *pi_args: str) -> None:
        """``pi-matrix master --session-id bench -- pi …``, interactive, in a window of the lab's tmux."""
        master = [sys.executable, "-m", "pi_tmux_matrix", "master", "--session-id", SESSION]
        argv = [*master, "--", self.pi, *pi_args]
        tmux = ["tmux", "-L", self.socket]
        has = subprocess.run([*tmux, "has-session", "-t", "=m"], capture_output=True, check=False)
        if has.returncode == 0:
            where = ["new-window", "-t", "=m:"]
        else:
            where = ["new-session", "-d", "-s", "m", "-x", "160"]
        # The server may already run (the workers' windows): pass the pane what pi and the host need.
        passed = [w for name in self.PASSED if name in self.env for w in ("-e", f"{name}={self.env[name]}")]
        subprocess.run([*tmux, *where, *passed, "-c", str(self.work), "--", *argv], env=self.env, check=True)

    def master(self, other_than: int | None = None) -> Entry:
        """The master once its pi runs (a new one: ``other_than`` the old host's pid)."""

        def running() -> Entry | None:
            entry = self.store.find(MASTER_KEY)
            up = entry is not None and entry.pid != other_than and entry.child_pid
            return entry if up else None

        entry = wait_for("the master's pi", running, WAIT_S)
        self.started += [i for i in (entry.process, entry.child_process) if i is not None]
        return entry

    def fire(self, master: Entry) -> str:
        """One interactive ``pi-worker`` fired through the dispatcher as ``master``'s worker: its key."""
        request = FireRequest(
            task="Say hello.", profile="pi-worker", path=str(self.work), socket=self.socket,
            parent_pid=master.pid, parent_session=SESSION,
        )  # fmt: skip
        dispatcher = Dispatcher(self.store, load_settings(self.work, self.env), env=self.env)
        (agent,) = dispatcher.fire(request).job.agents
        if agent.host is not None:
            self.started.append(agent.host)
        return agent.key

    def kill(self, entry: Entry) -> None:
        """A crash: the host and its pi, SIGKILL (no goodbye written)."""
        for identity in (entry.child_process, entry.process):
            if identity is not None:
                procs.send_signal(identity, signal.SIGKILL)
                procs.wait_for_exit(identity, 10)

    def cleanup(self) -> None:
        targets = list(self.started)
        for entry in self.store.list().entries:
            targets += [i for i in (entry.process, entry.child_process) if i is not None]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for identity in targets:
                procs.send_signal(identity, sig)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(procs.is_alive(t) for t in targets):
                time.sleep(0.05)
        TmuxServer(self.socket).kill_server()  # this lab's server only: its panes and pipes


@contextmanager
def lab(root: Path, pi: str) -> Iterator[tuple[Lab, FakeModel]]:
    with FakeModel() as model:
        the_lab = Lab(root, pi, model.base_url)
        try:
            yield the_lab, model
        finally:
            the_lab.cleanup()


# === one measurement =============================================================================
def status(the_lab: Lab, key: str) -> str:
    return the_lab.store.get(key).status.value


def posted_at(the_lab: Lab, handoff_id: str) -> int | None:
    """When the master's host first posted the handoff to its pi's bridge (Unix ms): the notice
    in ``mailbox/master-bench.agent.jsonl`` (the new master's file is the old one's: same key)."""
    notices = the_lab.state / "mailbox" / f"{MASTER_KEY}.agent.jsonl"
    for line in notices.read_text().splitlines() if notices.exists() else []:
        notice = json.loads(line)
        if notice.get("type") == "handoff" and json.loads(notice["message"]).get("id") == handoff_id:
            return int(notice["at"])
    return None


def one_round(root: Path, pi: str, case: str) -> dict[str, Any]:
    """One worker's round in ``case``: the answer -> the master's conversation, in ms."""
    began = time.monotonic()
    with lab(root, pi) as (the_lab, model):
        the_lab.start_master("Begin.")
        master = the_lab.master()
        wait_for("the master's first turn", model.requests, WAIT_S)  # so it waits idle, as a master does
        key = the_lab.fire(master)
        wait_for("the worker's task at the model", model.asked.is_set, WAIT_S)
        worker_pid = the_lab.store.get(key).pid
        if case == "re-adopted":
            session_file = master.identity.session_file
            if not session_file:
                raise RuntimeError("the master's pi reported no session file to start the new master on")
            the_lab.kill(master)
            wait_for("the worker to lose its parent", lambda: status(the_lab, key) == "resumable", WAIT_S)
            the_lab.start_master("--session", session_file)
            master = the_lab.master(other_than=master.pid)
            new_pid = master.pid
            wait_for(
                "the worker re-adopted by the new master",
                lambda: the_lab.store.get(key).parent_pid == new_pid and status(the_lab, key) == "running",
                WAIT_S,
            )
            if the_lab.store.get(key).pid != worker_pid:
                raise RuntimeError(f"{key} was relaunched, not re-adopted")
        wait_for("the master's pi ready", lambda: the_lab.store.get(MASTER_KEY).ready_at, WAIT_S)
        setup_s = time.monotonic() - began
        released_ms = time.time() * 1000
        model.release()
        reached = wait_for("the handoff in the master's conversation",
                           lambda: model.handoff_seen(key, model.released_at), WAIT_S)  # fmt: skip
        handoffs = the_lab.store.get(key).handoffs
        posted = posted_at(the_lab, handoffs[0].id) if handoffs else None
    # The round's own answer, not the worker's words on the adoption notices it took after it.
    right = len(handoffs) == 1 and handoffs[0].summary == "Done with the task."
    # Where the time goes (wall clock, as the store writes it): the worker's host writes the
    # handoff, the master's host posts it to its pi's bridge, the bridge puts it to the model.
    return {
        "case": case,
        "ms": (reached - model.released_at) * 1000,
        "written_ms": handoffs[0].created_at - released_ms if handoffs else None,
        "posted_ms": posted - released_ms if posted is not None else None,
        "handoff_ok": right and handoffs[0].outcome.value == "done",
        "setup_s": round(setup_s, 1),
    }


def run(repo: Path, root: Path, repeats: int, enabled: bool) -> dict[str, Any]:
    """Every case ``repeats`` times: ``{"skipped": why or None, "runs": [...], "errors": [...]}``.
    A case that fails is an error listed with its reason, never an exception out of here."""
    if not enabled:
        return {"skipped": "not asked (--no-real-pi)", "runs": [], "errors": []}
    pi, why = find_pi(repo)
    if pi is None:
        return {"skipped": why, "runs": [], "errors": []}
    runs, errors = [], []
    for n in range(repeats):
        for case in CASES:  # interleaved, so a busy spell of the machine does not hit one case only
            try:
                runs.append(one_round(root / f"{case}-{n}", pi, case))
            except Exception as exc:  # noqa: BLE001  (a broken case is reported; the table still prints)
                errors.append({"case": case, "error": f"{type(exc).__name__}: {exc}"})
    return {"skipped": None, "runs": runs, "errors": errors, "pi": pi}


def rows(real: dict[str, Any], durable_ms: float) -> list[dict[str, Any]]:
    """Table rows: fresh against the durable write timed in the same run, re-adopted against the
    fresh case of the same run (as fast as a fresh worker); p50 and max each."""
    by_case = {case: sorted(r["ms"] for r in real["runs"] if r["case"] == case) for case in CASES}
    fresh = by_case["fresh"]
    out = []
    for case in CASES:
        values = by_case[case]
        ok = all(r["handoff_ok"] for r in real["runs"] if r["case"] == case)
        broken = any(e["case"] == case for e in real["errors"])
        for stat in ("p50", "max"):
            figure = f"answer -> master's pi {stat}, real pi {case}"
            row: dict[str, Any] = {"figure": figure, "goal": f"< {GOAL_MS:.0f} ms"}
            if not values:
                why = real["skipped"] or "; ".join(e["error"] for e in real["errors"] if e["case"] == case)
                row.update(ours="skipped" if real["skipped"] else "error", baseline=why, ratio=None,
                           met="-" if real["skipped"] else "NO")  # fmt: skip
                out.append(row)
                continue
            value = statistics.median(values) if stat == "p50" else values[-1]
            if case == "fresh":
                base, base_text = durable_ms, f"{durable_ms:.2f} ms durable write"
            elif fresh:
                base = statistics.median(fresh) if stat == "p50" else fresh[-1]
                base_text = f"{base:.0f} ms fresh {stat}"
            else:
                base, base_text = durable_ms, f"{durable_ms:.2f} ms durable write"
            flags = ("" if ok else " (WRONG handoff)") + (" (some runs failed)" if broken else "")
            row.update(
                figure=figure + flags,
                ours=f"{value:.0f} ms", baseline=base_text, ratio=round(value / base, 1),
                met="yes" if value < GOAL_MS and ok and not broken else "NO",
            )  # fmt: skip
            out.append(row)
    return out
