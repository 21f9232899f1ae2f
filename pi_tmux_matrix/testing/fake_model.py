"""A fake OpenAI-compatible model on 127.0.0.1: real pi, offline, with no key (docs/offline.md).

Standard library only. pi asks ``POST /v1/chat/completions`` with ``stream: true`` and reads
server-sent events; ``GET /v1/models`` lists the one model. Replies come from a script (a queue);
when it is empty, :func:`default_reply` answers a dispatcher task with its completion marker
(``DONE:<code>``, the code read from the instruction) and anything else with ``ok``. Every request
is kept for whoever started it to read (a test, or ``pi-matrix fake-model``'s log line).

:func:`write_pi_agent_dir` points a pi agent dir at it (``models.json`` and ``settings.json``);
:func:`check_agent_dir` says first whether that would overwrite a provider that is not ours.
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Final

from ..errors import ContractError

__all__ = [
    "API_KEY",
    "BACKUP_SUFFIX",
    "HOST",
    "MARKER_CODE",
    "MODEL",
    "PROVIDER",
    "FakeModel",
    "Reply",
    "Request",
    "check_agent_dir",
    "default_reply",
    "is_ours",
    "text_of",
    "write_pi_agent_dir",
]

HOST: Final = "127.0.0.1"  # never another interface: it answers anyone who asks
PROVIDER: Final = "fake"
MODEL: Final = "fake-model"
API_KEY: Final = "fake-key"  # pi requires a key; the fake never reads it
# The dispatcher's instruction names the marker without spelling it (dispatch/request.py's
# marker_instruction), so an echo of it is never taken for an answer; this reads its code back.
MARKER_CODE: Final = re.compile(r"DONE, a colon and the code ([0-9a-f]{6,32})")
# Where ``--force`` keeps a foreign models.json or settings.json it replaces.
BACKUP_SUFFIX: Final = ".before-fake-model"

Request = dict[str, object]


@dataclass(frozen=True)
class Reply:
    """One answer: text, a tool call, or an HTTP error, streamed as pi expects."""

    text: str = ""
    tool: str | None = None  # a tool call instead of text: the tool's name
    arguments: dict[str, object] = field(default_factory=dict)
    # The tool call's arguments as the model's raw JSON text, sent as is instead of ``arguments``
    # (a structure Python's encoder would refuse, e.g. nested thousands deep).
    raw_arguments: str | None = None
    delay_s: float = 0.0  # before the first byte
    chunk_delay_s: float = 0.0  # between streamed chunks (a slow stream)
    # Stream the text in pieces of this many characters; 0: in words when ``chunk_delay_s`` is
    # set, else in one piece.
    chunk_chars: int = 0
    status: int = 200  # an HTTP error instead of a stream


def text_of(message: object) -> str:
    """The text of one chat message (a string, or the text parts of a list)."""
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _user_texts(request: Request) -> list[str]:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return []
    return [text_of(m) for m in messages if isinstance(m, dict) and m.get("role") == "user"]


def default_reply(request: Request) -> Reply:
    """A dispatcher task's last prompt gets its marker; anything else ``ok``."""
    users = _user_texts(request)
    found = MARKER_CODE.search(users[-1] if users else "")
    if found:
        return Reply(text=f"Done with the task.\nDONE:{found.group(1)}")
    return Reply(text="ok")


class FakeModel:
    """``with FakeModel() as model: model.base_url``; ``model.script(Reply(...))``;
    ``model.requests``. ``on_reply(request, reply)`` is called for every answer, from the
    serving thread."""

    def __init__(
        self,
        responder: Callable[[Request], Reply] = default_reply,
        *,
        port: int = 0,
        on_reply: Callable[[Request, Reply], None] | None = None,
    ) -> None:
        self.responder = responder
        self.port = port
        self.on_reply = on_reply
        self.requests: list[Request] = []
        self.arrived: list[float] = []  # time.monotonic() of each request, in order
        self.authorizations: list[str | None] = []  # each request's Authorization header
        self._script: list[Reply] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- control ----------------------------------------------------------------------------------
    def script(self, *replies: Reply) -> None:
        """Answer the next requests with these, in order, before the responder again."""
        with self._lock:
            self._script.extend(replies)

    def next_reply(self, request: Request) -> Reply:
        with self._lock:
            self.requests.append(request)
            self.arrived.append(time.monotonic())
            scripted = self._script.pop(0) if self._script else None
        reply = scripted if scripted is not None else self.responder(request)
        if self.on_reply is not None:
            self.on_reply(request, reply)
        return reply

    def user_texts(self) -> list[str]:
        """The text of every user message of every request, in order (what pi sent)."""
        with self._lock:
            requests = list(self.requests)
        return [text for request in requests for text in _user_texts(request)]

    def timed_requests(self) -> list[tuple[float, Request]]:
        """Each request with the ``time.monotonic()`` it arrived at, in order."""
        with self._lock:
            return list(zip(self.arrived, self.requests, strict=True))

    @property
    def base_url(self) -> str:
        """What ``models.json``'s ``baseUrl`` says: ``http://127.0.0.1:PORT/v1``."""
        if self._server is None:
            raise RuntimeError("the fake model is not serving: start() it first")
        return f"http://{HOST}:{self._server.server_address[1]}/v1"

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> FakeModel:
        """Listen on 127.0.0.1 and serve from a daemon thread; an ``OSError`` when the port cannot
        be had (in use, or below 1024 for a user)."""
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: object) -> None:
                return  # quiet: the owner logs what it wants through on_reply

            def do_GET(self) -> None:
                self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                with owner._lock:
                    owner.authorizations.append(self.headers.get("authorization"))
                try:
                    loaded = json.loads(self.rfile.read(length) or b"{}")
                except (ValueError, RecursionError):  # e.g. a conversation holding a deep tool call
                    loaded = {}
                reply = owner.next_reply(loaded if isinstance(loaded, dict) else {})
                if reply.delay_s:
                    time.sleep(reply.delay_s)
                if reply.status != 200:
                    self._json(
                        reply.status, {"error": {"message": "scripted failure", "type": "server_error"}}
                    )
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                try:
                    for event in _events(reply):
                        self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                        self.wfile.flush()
                        if reply.chunk_delay_s:
                            time.sleep(reply.chunk_delay_s)
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    return  # pi went away mid-answer (aborted, or stopped): nothing to tell it

            def _json(self, status: int, payload: object) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer((HOST, self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-model", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def _events(reply: Reply) -> list[dict[str, object]]:
    """The chunks of one streamed chat completion, as OpenAI sends them."""
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    if reply.tool is not None:
        arguments = reply.raw_arguments if reply.raw_arguments is not None else json.dumps(reply.arguments)
        call = {
            "index": 0,
            "id": f"call_{int(time.time() * 1000)}",
            "type": "function",
            "function": {"name": reply.tool, "arguments": arguments},
        }
        delta = {"role": "assistant", "tool_calls": [call]}
        return [
            {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}], "usage": usage},
        ]
    if reply.chunk_chars > 0:
        size = reply.chunk_chars
        pieces = [reply.text[i : i + size] for i in range(0, len(reply.text), size)]
    else:
        words = reply.text.split(" ") if reply.chunk_delay_s else [reply.text]
        pieces = [word if i == 0 else " " + word for i, word in enumerate(words)]
    events: list[dict[str, object]] = [
        {"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]} for piece in pieces
    ]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": usage})
    return events


# -- the agent dir ----------------------------------------------------------------------------------
def _models(base_url: str) -> dict[str, object]:
    return {
        "providers": {
            PROVIDER: {
                "baseUrl": base_url,
                "api": "openai-completions",
                "apiKey": API_KEY,
                # The fake reads neither; a real server of this kind often rejects both.
                "compat": {"supportsDeveloperRole": False, "supportsReasoningEffort": False},
                "models": [{"id": MODEL, "contextWindow": 128000, "maxTokens": 4096}],
            }
        }
    }


def _read_json(path: Path) -> object:
    """The JSON in ``path``; None when it is absent; ``...`` when it is not JSON (or unreadable)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return ...


def is_ours(models: object) -> bool:
    """Whether a loaded ``models.json`` is one :func:`write_pi_agent_dir` wrote: the fake provider
    alone, with the fake's key, on 127.0.0.1 (rewriting it takes nothing from anyone)."""
    if not isinstance(models, dict) or set(models) != {"providers"}:
        return False
    providers = models["providers"]
    if not isinstance(providers, dict) or set(providers) != {PROVIDER}:
        return False
    provider = providers[PROVIDER]
    return (
        isinstance(provider, dict)
        and provider.get("apiKey") == API_KEY
        and str(provider.get("baseUrl", "")).startswith(f"http://{HOST}:")
    )


def check_agent_dir(agent_dir: Path, *, force: bool = False) -> list[str]:
    """What pointing ``agent_dir`` at the fake would replace that is not ours (empty: nothing).
    Raises :class:`ContractError` when it cannot be an agent dir, or when it holds what is not
    ours and ``force`` is false."""
    if agent_dir.exists() and not agent_dir.is_dir():
        raise ContractError(
            "--agent-dir", f"{agent_dir} is a file, not a folder", "name a folder (it is made if missing)"
        )
    foreign: list[str] = []
    models = _read_json(agent_dir / "models.json")
    if models is not None and not is_ours(models):
        foreign.append("models.json (another provider's)")
    settings = _read_json(agent_dir / "settings.json")
    if settings is ... or (settings is not None and not isinstance(settings, dict)):
        foreign.append("settings.json (not a JSON object)")
    elif isinstance(settings, dict) and settings.get("defaultProvider") not in (None, PROVIDER):
        foreign.append(f"settings.json (defaultProvider {settings['defaultProvider']!r})")
    if foreign and not force:
        raise ContractError(
            "--agent-dir",
            f"{agent_dir} already holds {' and '.join(foreign)}, which the fake model would replace",
            "name another folder (--agent-dir DIR), or add --force to replace them (each kept as "
            f"NAME{BACKUP_SUFFIX})",
        )
    return foreign


def write_pi_agent_dir(agent_dir: Path, base_url: str, *, force: bool = False) -> list[Path]:
    """Point pi's agent dir at the fake: ``models.json`` (the fake provider alone) and
    ``settings.json``'s default provider and model (its other keys kept; retries off, so an
    error is quick). Refuses (:class:`ContractError`, nothing written) to replace a provider
    that is not ours unless ``force``; then the replaced files are kept beside, with
    :data:`BACKUP_SUFFIX`, and returned."""
    foreign = check_agent_dir(agent_dir, force=force)
    agent_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    kept: list[Path] = []
    for name in ("models.json", "settings.json"):
        if any(f.startswith(name) for f in foreign):
            backup = agent_dir / f"{name}{BACKUP_SUFFIX}"
            shutil.copy2(agent_dir / name, backup)
            kept.append(backup)
    (agent_dir / "models.json").write_text(json.dumps(_models(base_url), indent=2) + "\n")
    settings_path = agent_dir / "settings.json"
    loaded = _read_json(settings_path)
    settings: dict[str, object] = loaded if isinstance(loaded, dict) else {}
    settings.update(
        {
            "defaultProvider": PROVIDER,
            "defaultModel": MODEL,
            "quietStartup": True,
            "retry": {"enabled": False, "provider": {"maxRetries": 0}},
        }
    )
    settings_path.write_text(json.dumps(settings, indent=2) + "\n")
    return kept
