"""The rpc-mode pipe to a ``pi --mode rpc`` child: commands as JSON lines on its stdin (the first
prompt, follow-up prompts, steer lines, abort), and its JSON event stream read back from its
stdout, each event recorded and shown in the pane the way a person reads it.

In any other mode there is no pipe: ``send`` answers False and there is nothing to read.

Everything the child writes is hostile input (pi echoes the model's tool calls): each line is
held to :data:`LINE_MAX_BYTES` (an endless line without a newline never grows the buffer past
it) and parsed with the project's bounded parser (size and :data:`MAX_DEPTH`); a line that fails
is recorded raw (truncated) and supervision goes on. What is recorded is bounded too: pi's
streaming ``message_update`` (the whole message so far, every time) is not recorded, the final
``message_end`` is, and every recorded event's long strings and lists are cut with a marker
(:func:`loggable`), so the events file grows with what happened, not with its square.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
from collections.abc import Callable
from contextlib import suppress
from typing import IO, Any, Final, Literal

from .. import strictjson
from ..matrix.mailbox import MAX_MESSAGE_BYTES
from ..strictjson import JSONObject

__all__ = ["RPC_TAG", "RpcPipe", "Tell", "command_for", "loggable"]

RPC_TAG: Final = "rpc"  # the selector's tag for the child's stdout
READ_BYTES: Final = 65536
LAST_MESSAGE_CHARS: Final = 2000  # of the assistant's latest text, kept as the run's summary
RAW_LINE_CHARS: Final = 2000  # of a line that is not JSON, recorded as it came
# One line of pi's event stream at most. Real lines are the size of a message or a run's
# messages (agent_end carries them all; pi cuts each tool result to 50 KB), so this is far
# above them; a longer line is recorded raw (its head) and skipped to its newline.
LINE_MAX_BYTES: Final = 16 * 1024 * 1024
# Nesting of one event at most: pi's own structure is about 6 deep around a tool call's
# arguments, so this leaves the model's arguments ~58 levels and never lets the parser recurse
# towards the interpreter's limit (a call nested 3,000 deep killed the host with RecursionError).
MAX_DEPTH: Final = 64
# pi writes "type" first: a streaming update is known, and dropped, without parsing it (each
# carries the whole message so far, twice: parsing them all costs the square of the answer).
_STREAMING_UPDATE: Final = b'{"type":"message_update"'
# What one recorded event may hold: strings and lists cut with a marker, nesting cut below
# RECORD_DEPTH; a record still over RECORD_BYTES is cut harder, then reduced to its type.
RECORD_CHARS: Final = 4000
RECORD_ITEMS: Final = 64
RECORD_DEPTH: Final = 16
RECORD_BYTES: Final = 32 * 1024

# What the host tells its agent; a bridged interactive pi gets the same as a mailbox notice.
Tell = Literal["steer", "prompt", "abort", "shutdown", "fork_result"]


def command_for(kind: Tell, text: str) -> JSONObject:
    """The rpc command that carries what a bridged pi would get as a notice of ``kind``."""
    if kind == "steer":
        return {"type": "steer", "message": text}
    if kind == "prompt":
        # A prompt to an agent mid-run waits for its run to end instead of interrupting it.
        return {"type": "prompt", "message": text, "streamingBehavior": "followUp"}
    if kind == "fork_result":
        # rpc has no custom messages: the result's labelled text, as a follow-up prompt.
        return {"type": "prompt", "message": fork_result_text(text), "streamingBehavior": "followUp"}
    return {"type": "abort"}  # abort and shutdown alike: pi's rpc stops the run it is in


def fork_result_text(payload: str) -> str:
    """The labelled text of a ``fork_result`` notice (its JSON payload's ``text``)."""
    try:
        value = strictjson.loads(payload, max_bytes=MAX_MESSAGE_BYTES)
    except strictjson.StrictJSONError:  # RecursionError too: the payload comes through the mailbox
        return payload
    text = value.get("text") if isinstance(value, dict) else None
    return text if isinstance(text, str) else payload


def _bounded(value: Any, chars: int, items: int, depth: int) -> Any:
    """``value`` with every string cut to ``chars``, every list and object to ``items``, and
    nothing nested deeper than ``depth`` more levels; each cut says how much it left out."""
    if isinstance(value, str):
        return value if len(value) <= chars else f"{value[:chars]}…[{len(value) - chars} more chars]"
    if isinstance(value, (dict, list)) and depth <= 0:
        return "…[nested deeper]"
    if isinstance(value, dict):
        out: JSONObject = {}
        for n, (key, item) in enumerate(value.items()):
            if n == items:
                out["…"] = f"{len(value) - items} more keys"
                break
            out[key[:chars]] = _bounded(item, chars, items, depth - 1)
        return out
    if isinstance(value, list):
        kept = [_bounded(item, chars, items, depth - 1) for item in value[:items]]
        if len(value) > items:
            kept.append(f"…[{len(value) - items} more items]")
        return kept
    return value  # a number, true/false or null


def loggable(event: JSONObject) -> JSONObject | None:
    """What of one rpc event goes to the events file: None for a streaming ``message_update``
    (its final state comes as ``message_end``), else the event bounded to :data:`RECORD_BYTES`."""
    kind = event.get("type")
    if kind == "message_update":
        return None
    for chars, items in ((RECORD_CHARS, RECORD_ITEMS), (RECORD_CHARS // 10, RECORD_ITEMS // 4)):
        record = _bounded(event, chars, items, RECORD_DEPTH)
        size = len(json.dumps(record))  # ASCII-escaped: never fewer bytes than the line written
        if size <= RECORD_BYTES:
            return record  # type: ignore[no-any-return]
    return {"type": _bounded(kind, 200, 1, 1), "truncated": f"an event of {size}+ bytes once bounded"}


class RpcPipe:
    """Our end of the child's stdin and stdout (both None unless the child runs in rpc mode)."""

    def __init__(self, out: IO[str], record: Callable[[JSONObject], None]) -> None:
        self.out = out
        self._record = record  # the host's event log at the time of each event (it follows switches)
        self._stdin: IO[bytes] | None = None
        self._stdout: IO[bytes] | None = None
        self._line = bytearray()  # the line being read (never more than LINE_MAX_BYTES)
        self._skipping = False  # the rest of an over-long line, read and dropped up to its newline
        self.last_message = ""  # the assistant's latest text: the summary of the run when it ends

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        self._stdin, self._stdout = child.stdin, child.stdout

    def watch(self, selector: selectors.BaseSelector) -> None:
        """Have the loop wake on the child's output (read without blocking)."""
        if self._stdout is not None:
            os.set_blocking(self._stdout.fileno(), False)
            selector.register(self._stdout.fileno(), selectors.EVENT_READ, RPC_TAG)

    # -- to the child -------------------------------------------------------------------------------
    def send(self, command: JSONObject) -> bool:
        """One command line; False when there is no pipe or the child no longer reads it."""
        stdin = self._stdin
        if stdin is None or stdin.closed:
            return False
        try:
            stdin.write((json.dumps(command) + "\n").encode())
            stdin.flush()
        except (BrokenPipeError, OSError):
            return False
        return True

    def close(self) -> bool:
        """Close the child's stdin (pi --mode rpc exits at once on EOF: the cleanest stop it offers);
        False when there was no pipe to close."""
        if self._stdin is None:
            return False
        with suppress(OSError):
            self._stdin.close()
        return True

    # -- from the child -----------------------------------------------------------------------------
    def read(self, fd: int) -> bool:
        """Consume what the rpc child wrote; False at EOF."""
        try:
            chunk = os.read(fd, READ_BYTES)
        except BlockingIOError:
            return True
        if not chunk:
            return False
        self._consume(chunk)
        return True

    def drain(self) -> None:
        """Everything the child wrote before it exited, so its last events are recorded."""
        stdout = self._stdout
        if stdout is None or stdout.closed:
            return
        while True:
            try:
                chunk = os.read(stdout.fileno(), READ_BYTES)
            except (BlockingIOError, OSError, ValueError):
                return
            if not chunk:
                return
            self._consume(chunk)

    def _consume(self, chunk: bytes) -> None:
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            if not self._skipping:
                if len(self._line) + len(piece) > LINE_MAX_BYTES:
                    head = bytes(self._line[:RAW_LINE_CHARS]) + piece[:RAW_LINE_CHARS]
                    self._bad(head, f"a line over {LINE_MAX_BYTES} bytes, skipped to its end")
                    self._line.clear()
                    self._skipping = True
                else:
                    self._line += piece
            if end < 0:
                return
            if self._skipping:
                self._skipping = False
            else:
                line = bytes(self._line)
                self._line.clear()
                self._take(line)
            start = end + 1

    def _take(self, line: bytes) -> None:
        """One whole line: parsed with bounds, recorded (bounded) and shown; a bad one recorded raw."""
        if line.startswith(_STREAMING_UPDATE):
            return
        text = line.decode("utf-8", "replace").strip()
        if not text:
            return
        try:
            event = strictjson.loads(text, max_bytes=LINE_MAX_BYTES, max_depth=MAX_DEPTH)
        except strictjson.StrictJSONError as exc:
            self._bad(line, str(exc))
            return
        if isinstance(event, dict):
            record = loggable(event)
            if record is not None:
                self._record(record)
            self._show(event)

    def _bad(self, line: bytes, why: str) -> None:
        """A line that is not an event we take: its head, as it came, and why."""
        text = line[: RAW_LINE_CHARS * 4].decode("utf-8", "replace").strip()[:RAW_LINE_CHARS]
        self._record({"raw": text, "error": why[:200]})

    def _show(self, event: JSONObject) -> None:
        """What a person (and the dispatcher's watcher) reads in the pane: the assistant's text as
        lines of its own, and one line per run boundary, instead of the raw JSON stream."""
        kind = event.get("type")
        shown: str | None = None
        message = event.get("message")
        if kind == "message_end" and isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(
                    str(p.get("text", "")) for p in content if isinstance(p, dict) and p.get("type") == "text"
                )
            if isinstance(content, str) and content:
                self.last_message = content[-LAST_MESSAGE_CHARS:]
                shown = content
        elif kind in ("agent_start", "agent_end"):
            shown = f"[pi-matrix rpc] {kind}"
        elif kind == "response" and event.get("success") is False:
            shown = f"[pi-matrix rpc] {event.get('command')} failed: {str(event.get('error'))[:200]}"
        if shown is None:
            return
        with suppress(OSError, ValueError):
            self.out.write(shown + "\n")
            self.out.flush()
