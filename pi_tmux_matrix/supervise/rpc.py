"""The rpc-mode pipe to a ``pi --mode rpc`` child: commands as JSON lines on its stdin (the first
prompt, follow-up prompts, steer lines, abort), and its JSON event stream read back from its
stdout, each event recorded and shown in the pane the way a person reads it.

In any other mode there is no pipe: ``send`` answers False and there is nothing to read.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
from collections.abc import Callable
from contextlib import suppress
from typing import IO, Any, Final, Literal

__all__ = ["RPC_TAG", "RpcPipe", "Tell", "command_for"]

RPC_TAG: Final = "rpc"  # the selector's tag for the child's stdout
READ_BYTES: Final = 65536
LAST_MESSAGE_CHARS: Final = 2000  # of the assistant's latest text, kept as the run's summary
RAW_LINE_CHARS: Final = 2000  # of a line that is not JSON, recorded as it came

# What the host tells its agent; a bridged interactive pi gets the same as a mailbox notice.
Tell = Literal["steer", "prompt", "abort", "shutdown", "fork_result"]


def command_for(kind: Tell, text: str) -> dict[str, Any]:
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
        value = json.loads(payload)
    except ValueError:
        return payload
    text = value.get("text") if isinstance(value, dict) else None
    return text if isinstance(text, str) else payload


class RpcPipe:
    """Our end of the child's stdin and stdout (both None unless the child runs in rpc mode)."""

    def __init__(self, out: IO[str], record: Callable[[dict[str, Any]], None]) -> None:
        self.out = out
        self._record = record  # the host's event log at the time of each event (it follows switches)
        self._stdin: IO[bytes] | None = None
        self._stdout: IO[bytes] | None = None
        self._buffer = b""
        self.last_message = ""  # the assistant's latest text: the summary of the run when it ends

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        self._stdin, self._stdout = child.stdin, child.stdout

    def watch(self, selector: selectors.BaseSelector) -> None:
        """Have the loop wake on the child's output (read without blocking)."""
        if self._stdout is not None:
            os.set_blocking(self._stdout.fileno(), False)
            selector.register(self._stdout.fileno(), selectors.EVENT_READ, RPC_TAG)

    # -- to the child -------------------------------------------------------------------------------
    def send(self, command: dict[str, Any]) -> bool:
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
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace").strip()
            if not text:
                continue
            try:
                event = json.loads(text)
            except ValueError:
                event = {"raw": text[:RAW_LINE_CHARS]}
            if isinstance(event, dict):
                self._record(event)
                self._show(event)

    def _show(self, event: dict[str, Any]) -> None:
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
