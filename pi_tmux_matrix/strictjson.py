"""Strict, bounded JSON parsing for everything that crosses a trust boundary.

Entry files, settings files and the allowed-paths env value all go through here, so the same
rules hold everywhere: a size cap checked before parsing, a nesting cap, no NaN/Infinity, and
no duplicate keys (a duplicate key is how a hand-edited or spliced file hides a second value).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["StrictJSONError", "loads"]

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


def _depth_ok(text: str | bytes, limit: int) -> bool:
    # A cheap scan before parsing: brackets inside strings can only overcount, which errs on
    # the side of rejecting, and the real parser never sees a structure that could exhaust
    # the interpreter's recursion limit.
    if isinstance(text, bytes):
        opens = text.count(b"[") + text.count(b"{")
    else:
        opens = text.count("[") + text.count("{")
    if opens <= limit:
        return True
    depth = 0
    in_string = False
    escaped = False
    data = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
    for ch in data:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > limit:
                return False
        elif ch in "]}":
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
