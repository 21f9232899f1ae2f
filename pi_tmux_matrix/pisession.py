"""pi session files: the one module that names, creates and reads them.

A pi session is a JSONL file under the agent dir (``sessions/--<cwd with / as ->--/<stamp>_<id>.jsonl``)
whose first line is its header (``{"type": "session", "version": 3, "id": …, "timestamp": …,
"cwd": …}``); pi appends one entry per line after it and keeps the header's id as the session id.
Everything the product knows about a session file comes through here: where a new one goes, its
header (created with our id, so pi's session id and the matrix key agree from the first turn), its
header read back strictly (bounded, no symlink games with FIFOs: opened non-blocking), and a
snapshot of its whole lines (pi may be writing one right now).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import attrs

from . import strictjson
from .errors import ContractError
from .matrix.fsio import now_ms
from .settings import agent_dir

__all__ = [
    "MAX_HEADER_BYTES",
    "SessionHeader",
    "header_cwd",
    "new_session_file",
    "read_header",
    "session_file_of",
    "whole_lines",
    "write_header",
]

MAX_HEADER_BYTES: Final = 1024 * 1024
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


def write_header(session_file: str, session_id: str, cwd: str) -> None:
    """Create a pi session file holding only its header (pi appends to exactly that file and
    keeps the header's id), unless it exists. The folder is the agent dir's, made 0700."""
    path = Path(session_file)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + ".000Z"
    header = {"type": "session", "version": HEADER_VERSION, "id": session_id, "timestamp": stamp, "cwd": cwd}
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        return
    data = (json.dumps(header) + "\n").encode()
    try:
        while data:
            data = data[os.write(fd, data) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def read_header(session_file: str, *, field: str = "--session") -> SessionHeader:
    """The header of ``session_file``, or a :class:`ContractError` naming ``field`` and the fix."""
    try:
        fd = os.open(session_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ContractError(field, f"{session_file}: {exc.strerror}", _FIX) from None
    try:
        first = os.read(fd, MAX_HEADER_BYTES).split(b"\n", 1)[0]
    except OSError as exc:
        raise ContractError(field, f"{session_file}: {exc.strerror}", _FIX) from None
    finally:
        os.close(fd)
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
        fd = os.open(session_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        head = os.read(fd, MAX_HEADER_BYTES + 2)
    except OSError:
        return False
    finally:
        os.close(fd)
    first, _, rest = head.partition(b"\n")
    return bool(first) and bool(rest.strip())


def whole_lines(session_file: str) -> bytes:
    """The session up to its last complete line: the parent may be writing one right now."""
    with open(session_file, "rb") as handle:
        data = handle.read()
    cut = data.rfind(b"\n")
    return data[: cut + 1] if cut >= 0 else b""
