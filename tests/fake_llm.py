"""A fake OpenAI-compatible LLM for the real-pi tests: stdlib only, 127.0.0.1, scripted replies.

pi always asks ``POST /v1/chat/completions`` with ``stream: true`` and reads server-sent events.
Replies come from a script (a queue); when it is empty, the default answers a dispatcher task
with its completion marker (``DONE:<nonce>``, the nonce read from the instruction) or ``ok``.
Every request body is logged for the tests to read.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MARKER_CODE = re.compile(r"DONE, a colon and the code ([0-9a-f]{6,32})")


@dataclass
class Reply:
    """One scripted answer."""

    text: str = ""
    tool: str | None = None  # a tool call instead of text: the tool's name
    arguments: dict[str, Any] = field(default_factory=dict)
    # The tool call's arguments as the model's raw JSON text, sent as is instead of ``arguments``
    # (a structure Python's encoder would refuse, e.g. nested thousands deep).
    raw_arguments: str | None = None
    delay_s: float = 0.0  # before the first byte
    chunk_delay_s: float = 0.0  # between streamed chunks (a slow stream)
    # Stream the text in pieces of this many characters (a long answer in many deltas); 0: in
    # words when ``chunk_delay_s`` is set, else in one piece.
    chunk_chars: int = 0
    status: int = 200  # an HTTP error instead of a stream


def _text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def default_reply(request: dict[str, Any]) -> Reply:
    """Answer a dispatcher task with its marker; anything else with ``ok``."""
    messages = request.get("messages") or []
    user = [_text_of(m) for m in messages if isinstance(m, dict) and m.get("role") == "user"]
    last = user[-1] if user else ""
    found = MARKER_CODE.search(last)
    if found:
        return Reply(text=f"Done with the task.\nDONE:{found.group(1)}")
    return Reply(text="ok")


class FakeLLM:
    """``with FakeLLM() as llm: llm.base_url``; ``llm.script(Reply(...))``; ``llm.requests``."""

    def __init__(self, responder: Callable[[dict[str, Any]], Reply] = default_reply) -> None:
        self.responder = responder
        self.requests: list[dict[str, Any]] = []
        self.arrived: list[float] = []  # time.monotonic() of each request, in order
        self.authorizations: list[str | None] = []  # each request's Authorization header, in order
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control ------------------------------------------------------------------------------------
    def script(self, *replies: Reply) -> None:
        with self._lock:
            self._script.extend(replies)

    def next_reply(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self.requests.append(request)
            self.arrived.append(time.monotonic())
            if self._script:
                return self._script.pop(0)
        return self.responder(request)

    def user_texts(self) -> list[str]:
        """The text of every user message of every request, in order (what pi sent)."""
        with self._lock:
            requests = list(self.requests)
        return [_text_of(m) for r in requests for m in r.get("messages", []) if m.get("role") == "user"]

    def timed_requests(self) -> list[tuple[float, dict[str, Any]]]:
        """Each request with the ``time.monotonic()`` it arrived at, in order."""
        with self._lock:
            return list(zip(self.arrived, self.requests, strict=True))

    @property
    def base_url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    # -- lifecycle ----------------------------------------------------------------------------------
    def __enter__(self) -> FakeLLM:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, *args: object) -> None:  # quiet
                return

            def do_GET(self) -> None:
                body = json.dumps({"data": [{"id": "fake-model", "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                with owner._lock:
                    owner.authorizations.append(self.headers.get("authorization"))
                try:
                    request = json.loads(self.rfile.read(length) or b"{}")
                except (ValueError, RecursionError):  # e.g. a conversation holding a deep tool call
                    request = {}
                reply = owner.next_reply(request)
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.status != 200:
                    body = json.dumps(
                        {"error": {"message": "scripted failure", "type": "server_error"}}
                    ).encode()
                    self.send_response(reply.status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for event in _events(reply):
                    self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                    self.wfile.flush()
                    if reply.chunk_delay_s:
                        time.sleep(reply.chunk_delay_s)
                self.wfile.write(b"data: [DONE]\n\n")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-llm", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _events(reply: Reply) -> list[dict[str, Any]]:
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if reply.tool is not None:
        arguments = reply.raw_arguments if reply.raw_arguments is not None else json.dumps(reply.arguments)
        call = {
            "index": 0,
            "id": f"call_{int(time.time() * 1000)}",
            "type": "function",
            "function": {"name": reply.tool, "arguments": arguments},
        }
        return [
            {
                "choices": [
                    {"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}, "finish_reason": None}
                ]
            },
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "usage": usage},
        ]
    if reply.chunk_chars > 0:
        size = reply.chunk_chars
        pieces = [reply.text[i : i + size] for i in range(0, len(reply.text), size)]
    else:
        words = reply.text.split(" ") if reply.chunk_delay_s else [reply.text]
        pieces = [word if i == 0 else " " + word for i, word in enumerate(words)]
    events: list[dict[str, Any]] = []
    for piece in pieces:
        events.append({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage})
    return events


def write_pi_agent_dir(agent_dir: Path, base_url: str) -> None:
    """``models.json`` + ``settings.json`` for pi against the fake (retries off: errors are quick)."""
    agent_dir.mkdir(parents=True, exist_ok=True)
    models = {
        "providers": {
            "fake": {
                "baseUrl": base_url,
                "api": "openai-completions",
                "apiKey": "fake-key",
                "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                "models": [{"id": "fake-model", "contextWindow": 128000, "maxTokens": 4096}],
            }
        }
    }
    (agent_dir / "models.json").write_text(json.dumps(models))
    settings_path = agent_dir / "settings.json"
    settings: dict[str, Any] = json.loads(settings_path.read_text()) if settings_path.exists() else {}
    settings.update(
        {
            "defaultProvider": "fake",
            "defaultModel": "fake-model",
            "quietStartup": True,
            "retry": {"enabled": False, "provider": {"maxRetries": 0}},
        }
    )
    settings_path.write_text(json.dumps(settings))


# === reading and scripting the model's side =======================================================
def _tool_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)


def last_tool_result(request: dict[str, Any]) -> str:
    """The text of the last tool result in ``request`` (what the model read last), or ``""``."""
    for message in reversed(request.get("messages") or []):
        if message.get("role") == "tool":
            return _tool_text(message)
    return ""


def tool_results(llm: FakeLLM) -> list[str]:
    """The text of every tool result in pi's last request, in order (what the model read)."""
    messages = llm.requests[-1].get("messages", []) if llm.requests else []
    return [_tool_text(m) for m in messages if m.get("role") == "tool"]


def last_conversation(llm: FakeLLM) -> list[str]:
    """The user-side messages of the model's latest request: the whole conversation it was sent."""
    request = llm.requests[-1] if llm.requests else {}
    return [_text_of(m) for m in request.get("messages", []) if m.get("role") == "user"]


class Scripted:
    """Replies computed from what pi sent: each step sees the previous tool result."""

    def __init__(self, *steps: Callable[[str], Reply]) -> None:
        self.steps = list(steps)

    def __call__(self, request: dict[str, Any]) -> Reply:
        step = self.steps.pop(0) if self.steps else (lambda _r: Reply(text="ok"))
        return step(last_tool_result(request))


def tool(**arguments: Any) -> Callable[[str], Reply]:
    """A :class:`Scripted` step: call the bridge's ``tmux_agent_manager`` with ``arguments``."""
    return lambda _previous: Reply(tool="tmux_agent_manager", arguments=arguments)
