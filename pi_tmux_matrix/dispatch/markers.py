"""The completion marker in an agent's output: ``DONE:<nonce>`` / ``BLOCKED:<nonce> reason`` on a
line of its own, and what the round printed before it (the watcher's, :mod:`.watch`)."""

from __future__ import annotations

import codecs
import re
from collections import deque
from typing import Final

from ..matrix.mailbox import ROUND_TEXT_CHARS
from .model import ResultKind

__all__ = ["MarkerScanner"]

# Escape sequences: CSI, 7- or 8-bit (cursor moves and positioning end a visual line), OSC and
# other strings, and every other ESC sequence (charset selection like ESC ( B, save/restore ESC 7).
_CSI: Final = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*([@-~])")
_OSC: Final = re.compile(r"\x1b[\]PX^_][^\x07\x1b]*(?:\x07|\x1b\\)?")
_ESC: Final = re.compile(r"\x1b[ -/]*[0-~]")
_LINE_BREAKING_CSI: Final = frozenset("ABEFGHdf")
_DECORATION: Final = " \t\u2502\u2503|>*\u2022\u25cf"  # box rules, quote marks, bullets a TUI adds
MAX_LINE: Final = 64 * 1024
_ANY_MARKER: Final = re.compile(r"(?:DONE|BLOCKED):[0-9A-Za-z]+(?: .*)?")


class MarkerScanner:
    """Finds ``DONE:<nonce>`` / ``BLOCKED:<nonce> [reason]`` on a line of their own.

    A whole line, after escape sequences and a TUI's decoration are stripped: an instruction
    echoed back ("print DONE:… when finished") never counts, only the agent's own line does.
    It keeps the round's last lines before the marker (:attr:`round_text`, bounded): what a
    non-pi agent answered, for its handoff. An earlier round's marker starts the round anew.
    """

    def __init__(self, nonce: str) -> None:
        self.done = f"DONE:{nonce}"
        self.blocked = f"BLOCKED:{nonce}"
        self.marker = ""  # the marker line found, as printed
        self._lines: deque[str] = deque()
        self._kept = 0  # characters in _lines
        self._partial = ""
        # A multi-byte character split across two reads must not turn into two replacements.
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def feed(self, data: bytes) -> tuple[ResultKind, str] | None:
        text = self._partial + self._decoder.decode(data)
        text = _OSC.sub("", text)
        text = _CSI.sub(lambda m: "\n" if m.group(1) in _LINE_BREAKING_CSI else "", text)
        text = _ESC.sub("", text)
        lines = re.split(r"[\r\n]", text)
        self._partial = lines.pop()[-MAX_LINE:]
        for line in lines:
            found = self._match(line)
            if found is not None:
                return found
            self._keep(line)
        return None

    @property
    def round_text(self) -> str:
        """What the round printed before its marker (its last :data:`ROUND_TEXT_CHARS`)."""
        return "\n".join(self._lines).strip()[-ROUND_TEXT_CHARS:]

    def _keep(self, line: str) -> None:
        text = line.strip(_DECORATION)
        if _ANY_MARKER.match(text):
            self._lines.clear()  # an earlier round's end: this round starts after it
            self._kept = 0
            return
        if not text and (not self._lines or not self._lines[-1]):
            return  # runs of blank lines (a TUI's redraws) kept as one
        self._lines.append(line.rstrip())
        self._kept += len(line) + 1
        while self._kept > ROUND_TEXT_CHARS and self._lines:
            self._kept -= len(self._lines.popleft()) + 1

    def finish(self) -> tuple[ResultKind, str] | None:
        """The last line, when the stream ended without a newline."""
        line, self._partial = self._partial, ""
        return self._match(line)

    def _match(self, line: str) -> tuple[ResultKind, str] | None:
        text = line.strip(_DECORATION)
        if text == self.done:
            self.marker = text
            return ResultKind.DONE, ""
        if text == self.blocked or text.startswith(self.blocked + " "):
            self.marker = self.blocked
            return ResultKind.BLOCKED, text[len(self.blocked) :].strip()
        return None
