"""Owner -> host messages, host -> agent notices, and the host's events file.

Three small append-or-drop channels beside the entries (never the entries themselves):

* ``mailbox/<key>/``: one file per owner command (``send``, ``stop``), written atomically and
  taken (read, then unlinked) by the host that owns the key. The sender then wakes the host with
  an identity-checked SIGUSR2; the host also looks on every watcher tick, so a lost wake-up only
  costs latency.
* ``mailbox/<key>.agent.jsonl``: notices for the agent itself (``PI_MATRIX_MAILBOX``), read by
  the pi bridge extension and delivered into the session (each has an id the bridge
  acknowledges once pi's conversation has it: a ``notice_taken`` event).
* ``events/<key>.jsonl``: what the host saw (rpc events, steer notices, exits), for ``show``;
  each line bounded, the file rotated to ``events/<key>.jsonl.1`` past ``eventsMaxBytes``
  (one old generation kept), and read back only as a bounded tail.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import stat
from pathlib import Path
from typing import Any, Final

import attrs

from .. import strictjson
from ..errors import ContractError, CorruptEntry, PiMatrixError, StateDirError, StoreError
from ..identity import Role, entry_key
from ..settings import EVENTS_MAX_BYTES
from ..strictjson import JSONObject
from .fsio import DIR_FLAGS, durable_write, open_append, opened_dir, read_bounded, read_tail
from .layout import MAILBOX, inbox_name, notices_name
from .model import MAX_REASON, MAX_TEXT, Entry, Outcome
from .store import MatrixStore, now_ms

__all__ = [
    "MESSAGE_KINDS",
    "ROUND_TEXT_CHARS",
    "AgentNotices",
    "EventLog",
    "Inbox",
    "Message",
    "RoundEnd",
    "addressee",
    "announce_handoffs",
    "encode_message",
    "parse_round",
    "round_message",
]

log = logging.getLogger(__name__)

# Owner commands, what the pi bridge reports from inside the session (identity, result, bridge),
# the job watcher's word that a round ended with the agent's marker (round), a background fork's
# result for the session (fork_result), and a worker's word to its master that its entry holds a
# new handoff (handoff: see :func:`announce_handoffs`).
MESSAGE_KINDS: Final = frozenset(
    {
        "handoff",
        "steer",
        "prompt",
        "abort",
        "stop",
        "wake",
        "switch",
        "identity",
        "result",
        "bridge",
        "round",
        "fork_result",
    }
)
MAX_MESSAGE_BYTES: Final = 64 * 1024
ROUND_TEXT_CHARS: Final = MAX_TEXT  # of a round's own output a watcher sends its host
_ROUND_OUTCOMES: Final = {"done": Outcome.DONE, "blocked": Outcome.BLOCKED}
# One events line at most (a bigger record is replaced by a marker naming its size): what
# ``EventLog.tail`` parses, so every line written can be read back.
EVENT_LINE_BYTES: Final = 64 * 1024
# How much of the events (the newest file, then the old generation) ``EventLog.tail`` reads:
# whatever the files' size, ``show`` and its kin hold at most this much.
EVENTS_TAIL_BYTES: Final = 256 * 1024


def encode_message(
    kind: str, text: str, sender: str | None = None, *, field: str = "TEXT", to: str | None = None
) -> bytes:
    """A message as it goes on disk; a :class:`ContractError` naming ``field`` when it is not one
    a host would take (checked before anything is written, so nothing is half-done)."""
    if kind not in MESSAGE_KINDS:
        raise ContractError("kind", f"{kind!r} is not a message kind", f"use one of {sorted(MESSAGE_KINDS)}")
    record: JSONObject = {"kind": kind, "text": text, "at": now_ms(), "sender": sender}
    if to is not None:
        record["to"] = to
    body = json.dumps(record).encode()
    if len(body) > MAX_MESSAGE_BYTES:
        raise ContractError(
            field,
            f"{len(body)} bytes once encoded, over the mailbox's {MAX_MESSAGE_BYTES}",
            "put long context in a file and send its path",
        )
    return body


@attrs.frozen
class Message:
    """One owner command for a host."""

    kind: str
    text: str = ""
    at: int = 0
    sender: str | None = None
    # The host generation (its registration token) the message was addressed to: a message
    # posted to a host that died before reading it is never taken by the next host of the key.
    to: str | None = None


# -- the watcher's word that a round ended (supervise/rounds.py hands off for it) ----------------
@attrs.frozen
class RoundEnd:
    """A round the watcher saw end with the agent's marker."""

    job: str
    round: int
    outcome: Outcome
    marker: str  # the marker's word and nonce, e.g. DONE:3f2a…
    reason: str = ""  # a BLOCKED marker's reason
    text: str = ""  # what the round printed before its marker (bounded)
    path: str | None = None  # the job's result record
    usage: str = ""  # the round's usage claim as one advisory line ("" when none)


def round_message(
    *, job: str, round_: int, outcome: str, marker: str, reason: str, text: str, path: str, usage: str = ""
) -> str:
    """The ``round`` message a watcher posts to the agent's host."""
    body = {
        "job": job,
        "round": round_,
        "outcome": outcome,
        "marker": marker,
        "reason": reason[:500],
        "text": text[-ROUND_TEXT_CHARS:],
        "path": path,
        "usage": usage[:MAX_REASON],
    }
    return json.dumps(body)


def parse_round(text: str) -> RoundEnd | None:
    """A ``round`` message's body, or None when it is not one."""
    try:
        raw: Any = strictjson.loads(text, max_bytes=MAX_MESSAGE_BYTES)  # a host's input: bounded
        outcome = _ROUND_OUTCOMES[raw["outcome"]]
        path = raw.get("path")
        return RoundEnd(
            job=str(raw["job"]),
            round=int(raw["round"]),
            outcome=outcome,
            marker=str(raw["marker"]),
            reason=str(raw.get("reason") or ""),
            text=str(raw.get("text") or ""),
            path=path if isinstance(path, str) else None,
            usage=str(raw.get("usage") or "")[:MAX_REASON],
        )
    except (ValueError, KeyError, TypeError):
        return None


def _line(record: JSONObject) -> bytes:
    # A lone surrogate (JSON may escape one, e.g. "\\ud800" in a model's tool call) cannot be
    # UTF-8: written back as the same JSON escape instead of failing the whole line.
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8", "backslashreplace")


def _append_line(path: Path, record: JSONObject) -> None:
    _append(path, _line(record))


def _regular(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _append(path: Path, data: bytes, max_bytes: int | None = None) -> None:
    """The one append to a line file (the events, an agent's notices): ``data`` as one write with
    ``O_APPEND``, so concurrent appenders never interleave a line. With ``max_bytes``, a file that
    the write would take past it is first moved to ``<path>.1`` (replacing the old generation)
    and a new one started."""
    fd = open_append(path)
    try:
        info = os.fstat(fd)
        if max_bytes is not None and info.st_size and info.st_size + len(data) > max_bytes:
            old = path.with_name(path.name + ".1")
            try:
                now = os.stat(path, follow_symlinks=False)
            except FileNotFoundError:
                now = None
            # Only the file we hold: another writer (the host, a watcher) may have rotated it
            # already, and the new one it started must not become the old generation.
            if now is not None and (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
                os.replace(path, old)
            os.close(fd)
            fd = -1
            fd = open_append(path)
        os.write(fd, data)
    finally:
        if fd >= 0:
            os.close(fd)


class Inbox:
    """``mailbox/<key>/``: the host's command queue."""

    def __init__(self, store: MatrixStore, key: str) -> None:
        self.store = store
        self.key = key
        self._reported: set[str] = set()  # files left in the queue that are not messages, said once

    @property
    def path(self) -> Path:
        return self.store.root / MAILBOX / inbox_name(self.key)

    def post(self, kind: str, text: str = "", sender: str | None = None, *, to: str | None = None) -> Path:
        """Queue a command (durable: temp, fsync, rename, fsync the folder, so the host never reads
        half of it and an acknowledged message survives a crash), addressed to the host generation
        ``to`` when the sender knows it (see :class:`Message`)."""
        posted = self._post(kind, text, sender, to=to, durable=True)
        assert posted is not None  # a durable post makes the folder
        return posted

    def nudge(self, kind: str, text: str, sender: str) -> Path | None:
        """A word that only says "look now" at what is durable elsewhere: whole, not made durable
        (a crash that undoes it leaves the host's next full pass to find the same), and only into
        a mailbox its host already made (None otherwise: no folder is made for nobody)."""
        return self._post(kind, text, sender, to=None, durable=False)

    def _post(
        self, kind: str, text: str, sender: str | None, *, to: str | None, durable: bool
    ) -> Path | None:
        body = encode_message(kind, text, sender, to=to)
        name = f"{now_ms():015d}-{os.urandom(4).hex()}.json"
        directory = self.store.side_dir(MAILBOX, inbox_name(self.key)) if durable else self.path
        final = directory / name
        try:
            with opened_dir(directory, create=False) as dir_fd:
                if dir_fd is None:
                    if not durable:
                        return None  # no host made this mailbox: nobody to tell
                    raise StoreError(f"{directory}: the mailbox folder is gone", path=str(directory))
                # The one durable write of the state dir (a unique name: no lock needed).
                durable_write(dir_fd, name, body, exclusive=False, path=str(final), sync_dir=durable)
        except StateDirError:
            raise  # an unsafe mailbox folder says so itself (and exits as a usage error)
        except StoreError as exc:
            # A full disk (or any other refusal): one clear error, and no half message left to
            # read; or the message is in place but its folder's fsync failed.
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            if exc.committed:
                raise StoreError(
                    f"{self.key}: the message is queued but may not survive a crash ({why})",
                    path=str(final),
                    errno=exc.errno,
                ) from None
            raise StoreError(
                f"{self.key}: the message could not be queued ({why}); nothing was sent",
                path=str(final),
                errno=exc.errno,
            ) from None
        return final

    def take(self) -> list[Message]:
        """Every queued command, oldest first, removed from the queue.

        Read with the state dir's rules (:func:`~.fsio.read_bounded`): the folder and each message
        are never a symlink followed, a FIFO or a device is never read (it would block the host, or
        hand it another file's bytes) and is left where it is, reported once; a regular file too
        large or not a message is taken and dropped, as it always was."""
        try:
            dir_fd = os.open(self.path, DIR_FLAGS)
        except OSError as exc:
            # No mail yet; or a symlink (or a file) where the folder should be: nothing is taken
            # from it, and nothing in it deleted.
            if exc.errno != errno.ENOENT and "" not in self._reported:
                self._reported.add("")
                log.warning(
                    "%s: mail not taken: %s is not a real folder (%s)", self.key, self.path, exc.strerror
                )
            return []
        try:
            return self._take(dir_fd)
        finally:
            os.close(dir_fd)

    def _take(self, dir_fd: int) -> list[Message]:
        names = sorted(n for n in os.listdir(dir_fd) if n.endswith(".json") and not n.startswith("."))
        messages: list[Message] = []
        for name in names:
            try:
                data = read_bounded(dir_fd, name, str(self.path / name), MAX_MESSAGE_BYTES)
            except FileNotFoundError:
                continue
            except CorruptEntry as exc:
                if not _regular(dir_fd, name):
                    if name not in self._reported:
                        self._reported.add(name)
                        log.warning("%s: not taken: %s", self.key, exc.reason)
                    continue
                data = b""  # too large: taken and dropped below, never half-read
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue  # another reader took it first: it is theirs, never handled twice
            try:
                raw = strictjson.loads(data, max_bytes=MAX_MESSAGE_BYTES)
                to = raw.get("to")
                message = Message(
                    kind=str(raw["kind"]),
                    text=str(raw.get("text", "")),
                    at=int(raw.get("at", 0)),
                    sender=raw.get("sender"),
                    to=to if isinstance(to, str) else None,
                )
            except (strictjson.StrictJSONError, KeyError, TypeError, ValueError):
                continue
            if message.kind in MESSAGE_KINDS:
                messages.append(message)
        return messages


def addressee(store: MatrixStore, key: str, host_pid: int | None = None) -> str | None:
    """The registration of the host holding ``key`` now (only if its pid is ``host_pid``, when
    given): what a message to that host is addressed to. None when unknown: the message is then
    taken by whichever host reads the key."""
    try:
        entry = store.find(key)
    except PiMatrixError:
        return None
    if entry is None or (host_pid is not None and entry.pid != host_pid):
        return None
    return entry.registration


def announce_handoffs(store: MatrixStore, before: Entry | None, after: Entry) -> None:
    """After a write that gave ``after`` a handoff ``before`` did not have: a word to the inbox of
    each master it is addressed to, whose host then delivers it at once. Masters are not woken by
    every write of every worker's entry (a hundred workers' heartbeats), only by this; a word
    lost (a crash, a full disk, a master not there yet) leaves the handoff to the master's next
    full pass (docs/decisions.md#handoffs-are-pushed-not-polled)."""
    known = {h.id for h in before.handoffs} if before is not None else set()
    sessions = {h.parent_session_id for h in after.undelivered if h.id not in known and h.parent_session_id}
    for session in sorted(sessions):
        try:
            Inbox(store, entry_key(Role.MASTER, session)).nudge("handoff", after.key, sender=after.key)
        except PiMatrixError as exc:
            log.info("%s: its master %s was not told of its handoff: %s", after.key, session, exc)


class AgentNotices:
    """``mailbox/<key>.agent.jsonl``: notices the agent's bridge delivers into its session."""

    def __init__(self, store: MatrixStore, key: str) -> None:
        self.store = store
        self.key = key

    @property
    def path(self) -> Path:
        return self.store.root / MAILBOX / notices_name(self.key)

    def ensure(self) -> Path:
        self.store.side_dir(MAILBOX)
        return self.path

    def notify(self, kind: str, text: str) -> str:
        """Append one notice; returns its id (the bridge acknowledges it by this id once pi's
        conversation has it)."""
        self.ensure()
        notice_id = os.urandom(8).hex()
        _append_line(self.path, {"type": kind, "message": text, "at": now_ms(), "id": notice_id})
        return notice_id


class EventLog:
    """``events/<key>.jsonl``: the host's record of what happened, newest last.

    Bounded three ways: each line (:data:`EVENT_LINE_BYTES`), the file (rotated to
    ``<key>.jsonl.1`` past ``max_bytes``, the ``eventsMaxBytes`` setting: at most twice that on
    disk per key), and what is read back (:data:`EVENTS_TAIL_BYTES`).
    """

    def __init__(self, store: MatrixStore, key: str, max_bytes: int | None = EVENTS_MAX_BYTES) -> None:
        self.store = store
        self.key = key
        # None: a writer that does not know the setting (a job's watcher, a line per round)
        # appends without rotating; the key's host, which writes nearly everything, rotates.
        self.max_bytes = max_bytes

    @property
    def path(self) -> Path:
        return self.store.root / "events" / f"{self.key}.jsonl"

    @property
    def old_path(self) -> Path:
        """The previous generation, once the file has been rotated."""
        return self.store.root / "events" / f"{self.key}.jsonl.1"

    def write(self, event: str, /, **fields: object) -> None:
        """Append one event. Best effort: the entry is the truth and the log its story, so a full
        disk (or any refusal) costs the line, never the host that writes it."""
        at = now_ms()
        data = _line({**fields, "event": event, "at": at})
        if len(data) > EVENT_LINE_BYTES:
            # The callers bound what they record; this is the backstop that keeps every line
            # readable by tail() and the file's growth linear in what happened.
            cut = f"a {len(data)} byte record, over the {EVENT_LINE_BYTES} byte line cap"
            data = _line({"event": event, "at": at, "truncated": cut})
        try:
            self.store.side_dir("events")
            _append(self.path, data, self.max_bytes)
        except (OSError, PiMatrixError) as exc:
            log.warning("%s: event %r not recorded: %s", self.key, event, exc)

    def tail(self, count: int = 20) -> list[JSONObject]:
        """The last ``count`` events (bad lines skipped), from at most :data:`EVENTS_TAIL_BYTES`
        of the newest file and, when that is short, the old generation's end. Read with the state
        dir's own rules: never a symlink, never a FIFO (nothing blocks), only a bounded tail."""
        data = b""
        try:
            with opened_dir(self.store.root / "events", create=False) as dir_fd:
                if dir_fd is None:
                    return []
                for path in (self.path, self.old_path):
                    want = EVENTS_TAIL_BYTES - len(data)
                    try:
                        chunk = read_tail(dir_fd, path.name, str(path), want)
                    except FileNotFoundError:
                        chunk = b""
                    if len(chunk) >= want:
                        # Started mid-file: the first piece is the end of a line, not a line.
                        data = chunk.partition(b"\n")[2] + data
                        break
                    data = chunk + data
        except (OSError, PiMatrixError):
            pass  # unreadable (a FIFO, a symlink, not ours): what was read so far, if anything
        events: list[JSONObject] = []
        for line in data.splitlines()[-count:]:
            try:
                value = strictjson.loads(line, max_bytes=EVENT_LINE_BYTES)
            except strictjson.StrictJSONError:
                continue
            if isinstance(value, dict):
                events.append(value)
        return events
