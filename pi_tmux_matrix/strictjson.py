"""Strict, bounded JSON parsing for everything that crosses a trust boundary.

Entry files, settings files and the allowed-paths env value all go through here, so the same
rules hold everywhere: a size cap checked before parsing, a nesting cap, no NaN/Infinity, and
no duplicate keys (a duplicate key is how a hand-edited or spliced file hides a second value).
"""

from __future__ import annotations

import json
import re
from typing import Any, TypeAlias

__all__ = ["JSONObject", "StrictJSONError", "loads"]

# A JSON document's object as this package writes and reads it: its values are read by narrowing
# (``isinstance``) or through the codec, which structures it into its class.
JSONObject: TypeAlias = dict[str, object]

MAX_DEPTH = 32


class StrictJSONError(ValueError):
    """The text is not acceptable strict JSON; the message says why."""


def _reject_constant(name: str) -> Any:
    raise StrictJSONError(f"non-standard JSON constant {name}")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise StrictJSONError(f"duplicate key {key!r}")
            seen.add(key)
    return result


# Built once: json.loads with hooks constructs a new decoder on every call.
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)


# A JSON string (escapes included; an unterminated one runs to the end, so no text is scanned
# twice: linear time whatever the input) and a run of anything but a bracket: what the depth
# scan strips, in C, so only the structure's own brackets are left to walk in Python.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def _depth_ok(text: str | bytes, limit: int) -> bool:
    # A cheap check before parsing, so the real parser never sees a structure that could exhaust
    # the interpreter's recursion limit. Counting every bracket first is enough for most texts;
    # past the limit, strings are stripped (their brackets are text, not structure) and the
    # remaining brackets walked. The parser stops at an unterminated string, so what follows one
    # is never structure to it either.
    if isinstance(text, bytes):
        opens = text.count(b"[") + text.count(b"{")
    else:
        opens = text.count("[") + text.count("{")
    if opens <= limit:
        return True
    data = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    depth = 0
    for ch in _NOT_BRACKET.sub("", _STRING.sub("", data)):
        if ch in "[{":
            depth += 1
            if depth > limit:
                return False
        else:
            depth -= 1
    return True


def loads(text: str | bytes, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Parse ``text`` as strict JSON or raise :class:`StrictJSONError`.

    >>> loads('{"a": [1, 2]}', max_bytes=100)
    {'a': [1, 2]}
    >>> loads('{"a": 1, "a": 2}', max_bytes=100)
    Traceback (most recent call last):
    ...
    pi_tmux_matrix.strictjson.StrictJSONError: duplicate key 'a'
    """
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise StrictJSONError(f"larger than {max_bytes} bytes")
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrictJSONError(f"not UTF-8 (byte {exc.start})") from None
    if not _depth_ok(text, max_depth):
        raise StrictJSONError(f"nested deeper than {max_depth} levels")
    try:
        return _DECODER.decode(text)
    except StrictJSONError:
        raise
    except RecursionError:
        raise StrictJSONError(f"nested deeper than {max_depth} levels") from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:
        # int() refuses numbers of more than 4300 digits (CVE-2020-10735): still just bad input.
        raise StrictJSONError(f"unacceptable number ({exc})"[:200]) from None
