"""pi session files: the one module that names, creates and reads them.

A pi session is a JSONL file under the agent dir (``sessions/--<cwd with / as ->--/<stamp>_<id>.jsonl``)
whose first line is its header (``{"type": "session", "version": 3, "id": …, "timestamp": …,
"cwd": …}``); pi appends one entry per line after it and keeps the header's id as the session id.
Everything the product knows about a session file comes through here: where a new one goes, its
header (created with our id, so pi's session id and the matrix key agree from the first turn), its
header read back strictly (bounded, no symlink games with FIFOs: opened non-blocking), a
snapshot of its whole lines (pi may be writing one right now), and the outcome of the run pi
appended to a file after a given offset (a fork's final output, usage and model, when its
``result.json`` is missing), and its entries as a tree: each line with its parsed entry, the
branch pi continues (root to the last entry), and pi's token estimate of a message.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import attrs

from . import strictjson
from .errors import ContractError, PiMatrixError
from .matrix.fsio import open_state_file
from .matrix.tokens import now_ms
from .settings import agent_dir
from .strictjson import JSONObject

__all__ = [
    "MAX_HEADER_BYTES",
    "SessionHeader",
    "SessionLine",
    "branch_of",
    "conversation",
    "encode_entry",
    "estimate_tokens",
    "header_cwd",
    "new_session_file",
    "read_header",
    "run_outcome",
    "session_file_of",
    "session_lines",
    "sync_header",
    "whole_lines",
    "write_header",
]

MAX_HEADER_BYTES: Final = 1024 * 1024
MAX_RUN_BYTES: Final = 32 * 1024 * 1024  # of a run's entries read back (a longer run: its last part)
# Of a whole session copied for a fork: far above a real transcript, far below what would take the
# machine's memory (a session file is the agent's to write; bash can make it any size).
MAX_SESSION_BYTES: Final = 512 * 1024 * 1024
_USAGE_KEYS: Final = ("input", "output", "cacheRead", "cacheWrite", "totalTokens")
MAX_ACTIVITY: Final = 20  # lines of a run's activity: its last tool calls (as bridge/fork.ts)
ACTIVITY_CHARS: Final = 120
_ACTIVITY_KEYS: Final = ("command", "path", "pattern", "query", "task")
HEADER_VERSION: Final = 3
_FIX: Final = "pass an existing pi session file (.jsonl) whose first line is its session header"


@attrs.frozen
class SessionHeader:
    """The first line of a pi session file: its id and the cwd pi runs it in."""

    id: str
    cwd: str


def new_session_file(cwd: str, session_id: str, env: Mapping[str, str] | None = None) -> str:
    """Where pi keeps a session of ``cwd`` (``sessions/--<cwd with / as ->--/``), under our id."""
    folder = "--" + cwd.strip("/").replace("/", "-") + "--"
    stamp = now_ms()
    return str(agent_dir(env) / "sessions" / folder / f"{stamp}_{session_id}.jsonl")


def session_file_of(
    session_id: str, recorded: Iterable[str | None] = (), env: Mapping[str, str] | None = None
) -> str | None:
    """The file that holds pi session ``session_id``, so a session id never gets a second file: the
    first ``recorded`` path whose header carries that id, else the newest file in the agent dir's
    ``sessions/`` folders named for it (``<stamp>_<id>.jsonl``, as pi and
    :func:`new_session_file` name them) whose header does; None when there is none."""
    for path in recorded:
        if path and _holds(path, session_id):
            return path
    root = agent_dir(env) / "sessions"
    suffix = f"_{session_id}.jsonl"
    found: list[tuple[float, str]] = []
    try:
        folders = [entry.path for entry in os.scandir(root) if entry.is_dir(follow_symlinks=False)]
    except OSError:
        return None
    for folder in folders:
        try:
            named = [e for e in os.scandir(folder) if e.name.endswith(suffix)]
            found += [
                (e.stat(follow_symlinks=False).st_mtime, e.path)
                for e in named
                if e.is_file(follow_symlinks=False)
            ]
        except OSError:
            continue
    for _mtime, path in sorted(found, reverse=True):
        if _holds(path, session_id):
            return path
    return None


def _holds(path: str, session_id: str) -> bool:
    try:
        return read_header(path).id == session_id
    except ContractError:
        return False


def _read_session(
    session_file: str | os.PathLike[str],
    *,
    limit: int,
    start: int = 0,
    tail: bool = False,
    state_dir: bool = False,
) -> bytes:
    """The one read of a session file: opened non-blocking (a FIFO never hangs the reader), a
    regular file only (a FIFO, device or folder raises ``OSError``), at most ``limit`` bytes from
    ``start``, or the last ``limit`` bytes past ``start`` when ``tail``. A copy in the state dir (a
    fork run's ``session.jsonl``, ``state_dir``) is opened by the state dir's rules: never through
    a symlink, its own or its folder's (``CorruptEntry`` says why)."""
    if state_dir:
        fd = open_state_file(session_file)
    else:
        fd = os.open(session_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        size = info.st_size
        if tail:
            start = max(start, size - limit)
        want = min(limit, size - start)
        return os.pread(fd, want, start) if want > 0 else b""
    finally:
        os.close(fd)


def write_header(session_file: str, session_id: str, cwd: str, *, sync: bool = True) -> bool:
    """Create a pi session file holding only its header (pi appends to exactly that file and
    keeps the header's id), unless it exists; True if it was created. The folder is the agent
    dir's, made 0700. ``sync=False``: not fsynced yet, the caller does it (:func:`sync_header`)
    before it tells anyone the agent started (a fire: beside its tmux call,
    docs/decisions.md#a-fire-fsyncs-only-what-a-crash-needs)."""
    path = Path(session_file)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".000Z"
    header = {"type": "session", "version": HEADER_VERSION, "id": session_id, "timestamp": stamp, "cwd": cwd}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return False
    data = (json.dumps(header) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data) :]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return True


def sync_header(session_file: str) -> None:
    """fsync a header :func:`write_header` wrote with ``sync=False`` (an fsync through any open
    file of it flushes what the other wrote): a crash then leaves the header whole, never an
    empty file that ``resume`` would refuse as headerless."""
    # Opened to be flushed, not read (nor created: it is there); never through a symlink.
    fd = os.open(session_file, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_header(session_file: str, *, field: str = "--session") -> SessionHeader:
    """The header of ``session_file``, or a :class:`ContractError` naming ``field`` and the fix."""
    try:
        first = _read_session(session_file, limit=MAX_HEADER_BYTES).split(b"\n", 1)[0]
    except OSError as exc:
        raise ContractError(field, f"{session_file}: {exc.strerror}", _FIX) from None
    try:
        header = strictjson.loads(first, max_bytes=MAX_HEADER_BYTES)
    except strictjson.StrictJSONError:
        header = None
    if not isinstance(header, dict) or header.get("type") != "session":
        raise ContractError(field, f"{session_file}: the first line is not a pi session header", _FIX)
    session_id, cwd = header.get("id"), header.get("cwd")
    if not (isinstance(session_id, str) and session_id and isinstance(cwd, str) and os.path.isabs(cwd)):
        raise ContractError(field, f"{session_file}: the header has no id or no absolute cwd", _FIX)
    return SessionHeader(id=session_id, cwd=cwd)


def header_cwd(session_file: str) -> str | None:
    """The cwd in the session's header (pi runs the session there, not in the process cwd), or
    None when the file has no readable header."""
    try:
        return read_header(session_file).cwd
    except ContractError:
        return None


def has_transcript(session_file: str | None) -> bool:
    """Whether the session holds anything past its header (a first turn was written): False for a
    missing file and for a header-only one (an agent that died before its first turn)."""
    if session_file is None:
        return False
    try:
        head = _read_session(session_file, limit=MAX_HEADER_BYTES + 2)
    except OSError:
        return False
    first, _, rest = head.partition(b"\n")
    return bool(first) and bool(rest.strip())


def whole_lines(session_file: str, *, field: str = "--session") -> bytes:
    """The session up to its last complete line: the parent may be writing one right now. A
    :class:`ContractError` naming ``field`` for what is not a regular file or is over
    :data:`MAX_SESSION_BYTES`."""
    try:
        data = _read_session(session_file, limit=MAX_SESSION_BYTES + 1)
    except OSError as exc:
        raise ContractError(field, f"{session_file}: {exc.strerror}", _FIX) from None
    if len(data) > MAX_SESSION_BYTES:
        raise ContractError(
            field,
            f"{session_file}: larger than {MAX_SESSION_BYTES // (1024 * 1024)} MiB",
            "fork a session under that size (compact it in pi first)",
        )
    cut = data.rfind(b"\n")
    return data[: cut + 1] if cut >= 0 else b""


def _assistant_messages(data: bytes) -> list[JSONObject]:
    """The assistant messages of the session entries in ``data`` (whole lines; bad ones skipped)."""
    found: list[JSONObject] = []
    for line in data.split(b"\n"):
        if not line.strip():
            continue
        try:
            entry = strictjson.loads(line, max_bytes=MAX_RUN_BYTES)
        except strictjson.StrictJSONError:
            continue
        message = entry.get("message") if isinstance(entry, dict) and entry.get("type") == "message" else None
        if isinstance(message, dict) and message.get("role") == "assistant":
            found.append(message)
    return found


def _text(message: JSONObject) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def conversation(session_file: str) -> list[tuple[str, str]]:
    """The session's messages as ``(role, text)``, oldest first: what a person reads of an agent
    that has no pane (rpc). Bad lines and messages without text are left out."""
    told: list[tuple[str, str]] = []
    for line in session_lines(whole_lines(session_file)):
        entry = line.entry
        message = entry.get("message") if entry is not None and entry.get("type") == "message" else None
        if isinstance(message, dict) and isinstance(message.get("role"), str) and (text := _text(message)):
            told.append((str(message["role"]), text))
    return told


def _summed_usage(messages: list[JSONObject]) -> JSONObject | None:
    """pi's usage summed over the messages (every tool-call round was paid for), or None."""
    total: dict[str, Any] = dict.fromkeys(_USAGE_KEYS, 0)  # numbers as pi wrote them, int or float
    cost = 0.0
    seen = False
    for message in messages:
        usage = message.get("usage")
        if not isinstance(usage, dict):
            continue
        seen = True
        for key in _USAGE_KEYS:
            value = usage.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                total[key] += value
        spent = usage.get("cost")
        spent = spent.get("total") if isinstance(spent, dict) else spent
        if isinstance(spent, (int, float)) and not isinstance(spent, bool):
            cost += spent
    return {**total, "cost": {"total": cost}} if seen else None


def _activity(messages: list[JSONObject]) -> list[str]:
    """One line per tool call ("bash: npm test"), the last :data:`MAX_ACTIVITY`: the same lines
    the bridge writes into a fork's ``result.json``."""
    lines: list[str] = []
    for message in messages:
        content = message.get("content")
        for block in content if isinstance(content, list) else []:
            if not (isinstance(block, dict) and block.get("type") == "toolCall"):
                continue
            raw = block.get("arguments")
            args: JSONObject = raw if isinstance(raw, dict) else {}
            key = next((k for k in _ACTIVITY_KEYS if isinstance(args.get(k), str)), None)
            what = str(args[key]) if key else json.dumps(args, separators=(",", ":"))
            lines.append(f"{block.get('name') or '?'}: {' '.join(what.split())}"[:ACTIVITY_CHARS])
    return lines[-MAX_ACTIVITY:]


def run_outcome(session_file: str | os.PathLike[str], offset: int) -> JSONObject | None:
    """What the run pi appended to ``session_file`` after byte ``offset`` came to, in the shape
    of the bridge's fork ``result.json`` (``text``, ``stopReason``, ``errorMessage``, ``usage``
    summed over the run, ``model``, ``provider``, ``activity``); None when the run has no assistant message
    (or the file cannot be read). Reads at most :data:`MAX_RUN_BYTES`, the last ones. The file is
    a fork run's copy in the state dir: opened by the state dir's rules (never a symlink, a FIFO
    or a device)."""
    try:
        data = _read_session(session_file, limit=MAX_RUN_BYTES + 1, start=offset, tail=True, state_dir=True)
    except (OSError, PiMatrixError):
        return None
    if len(data) > MAX_RUN_BYTES:  # a longer run: its last MAX_RUN_BYTES, from a line's start
        data = data[1:]
        data = data.split(b"\n", 1)[1] if b"\n" in data else b""  # cut into a line: skip its rest
    data = data[: data.rfind(b"\n") + 1]  # whole lines only
    messages = _assistant_messages(data)
    if not messages:
        return None
    last = messages[-1]

    def field(name: str) -> str | None:
        value = last.get(name)
        return value if isinstance(value, str) else None

    return {
        "text": _text(last),
        "stopReason": field("stopReason"),
        "errorMessage": field("errorMessage"),
        "usage": _summed_usage(messages),
        "model": field("model"),
        "provider": field("provider"),
        "activity": _activity(messages),
        "source": "session.jsonl",
    }


@attrs.frozen
class SessionLine:
    """One line of a session file as written (``raw``, newline included) and its entry (None for
    a line that is not a JSON object: kept as it is)."""

    raw: bytes
    entry: JSONObject | None


def session_lines(data: bytes) -> list[SessionLine]:
    """The whole lines of ``data`` (a session file's bytes), each with its parsed entry."""
    found: list[SessionLine] = []
    for line in data.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break  # pi is still writing it
        try:
            entry = strictjson.loads(line, max_bytes=MAX_RUN_BYTES)
        except strictjson.StrictJSONError:
            entry = None
        found.append(SessionLine(line, entry if isinstance(entry, dict) else None))
    return found


def branch_of(entries: list[JSONObject]) -> list[JSONObject]:
    """The branch pi continues when it opens the file: from the root to the last entry (pi's
    leaf), following ``parentId``; the header and entries without an id are not on it."""
    by_id = {e["id"]: e for e in entries if isinstance(e.get("id"), str) and e.get("type") != "session"}
    leaf = next((e for e in reversed(entries) if e.get("id") in by_id), None)
    path: list[JSONObject] = []
    seen: set[str] = set()
    while leaf is not None and leaf["id"] not in seen:
        seen.add(str(leaf["id"]))  # a str: only entries with a str id are on the branch
        path.append(leaf)
        parent = leaf.get("parentId")
        leaf = by_id.get(parent) if isinstance(parent, str) else None
    return path[::-1]


def estimate_tokens(message: object) -> int:
    """pi's estimate of a message's tokens (characters / 4, rounded up), as its compaction cuts."""
    if not isinstance(message, dict):
        return 0
    role = message.get("role")
    content = message.get("content")
    chars = 0
    if role in ("branchSummary", "compactionSummary"):
        chars = len(str(message.get("summary", "")))
    elif role == "bashExecution":
        chars = len(str(message.get("command", ""))) + len(str(message.get("output", "")))
    elif isinstance(content, str):
        chars = len(content)
    elif isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                chars += len(str(block.get("text", "")))
            elif kind == "thinking" and role == "assistant":
                chars += len(str(block.get("thinking", "")))
            elif kind == "toolCall" and role == "assistant":
                arguments = json.dumps(block.get("arguments"), separators=(",", ":"))
                chars += len(str(block.get("name", ""))) + len(arguments)
            elif kind == "image" and role != "assistant":
                chars += 4800
    return -(-chars // 4)


def encode_entry(entry: JSONObject) -> bytes:
    """An entry as pi writes it: one line of compact JSON."""
    return (json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
