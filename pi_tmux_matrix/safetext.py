"""Worker-controlled text made safe to show: below every layer that shows it.

A worker's words reach a person two ways: the CLI's tables and lines, and a handoff to its
master (supervise/handoff_text.py), framed for pi or printed on a terminal. Both go through
:func:`printable`, so it lives at the bottom, importing nothing (``ls`` loads it too).
"""

from __future__ import annotations

__all__ = ["printable"]


def printable(text: str) -> str:
    """Worker-controlled text made safe for a person's terminal: every control character shown
    as ``cat -v`` does (``^[`` for ESC, ``^G`` for BEL, ``M-^[`` for the 8-bit CSI), so an agent's
    output can never retitle the window, move the cursor or rewrite what is above it."""
    out: list[str] = []
    for char in text:
        code = ord(char)
        if code < 0x20 or code == 0x7F:
            out.append("^" + chr(code ^ 0x40))
        elif 0x80 <= code < 0xA0:
            out.append("M-^" + chr((code - 0x80) ^ 0x40))
        else:
            out.append(char)
    return "".join(out)
