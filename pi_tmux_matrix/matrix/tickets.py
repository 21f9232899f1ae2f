"""Launch tickets: who may act on one launch, the host it started or the launcher that gave up.

A launcher cannot know whether a tmux server that did not answer in time will still make the
pane later (a stalled server does, once it runs again). So every launch carries a ticket, and
the first of two parties to take it wins, by one exclusive file creation
(``launches/<ticket>``, ``O_EXCL``):

* the host takes it before it registers or starts anything, naming itself (pid, start ticks,
  boot id);
* a launcher whose start failed takes it as *abandoned*.

If the launcher's take lands first, a host that appears later finds the ticket abandoned and
starts nothing; if the host's lands first, the launcher learns exactly which process it is and
stops it (identity-checked) or uses it. Either way no agent runs without its launcher knowing.
Tickets are small; abandoned ones are kept a day (a stalled server may wake late), then pruned.
"""

from __future__ import annotations

import os
from typing import Final

import attrs

from ..errors import PiMatrixError
from ..identity import ProcessIdentity
from .fsio import DIR_FLAGS, durable_write, read_bounded
from .store import MatrixStore, now_ms

__all__ = ["ABANDONED", "LaunchTickets", "Taken", "check_ticket", "new_ticket"]

ABANDONED: Final = "abandoned"
KEEP_MS: Final = 24 * 3600 * 1000
_MAX_BYTES: Final = 4096
_TICKET_CHARS: Final = frozenset("0123456789abcdef")


def new_ticket() -> str:
    """A fresh ticket: 32 hex digits, never reused."""
    return os.urandom(16).hex()


def check_ticket(ticket: str) -> str:
    """``ticket`` if it is one of ours (it names a file: nothing else may pass)."""
    if len(ticket) != 32 or not set(ticket) <= _TICKET_CHARS:
        raise PiMatrixError(f"--launch-ticket: {ticket!r} is not a launch ticket (32 hex digits)")
    return ticket


@attrs.frozen
class Taken:
    """Who holds a ticket: a host (its identity) or a launcher that gave up (``reason``)."""

    host: ProcessIdentity | None
    reason: str = ""

    @property
    def abandoned(self) -> bool:
        return self.host is None

    def encode(self) -> bytes:
        if self.host is None:
            return f"{ABANDONED} {self.reason}\n".encode()
        return f"host {self.host.pid} {self.host.start_ticks} {self.host.boot_id}\n".encode()

    @classmethod
    def decode(cls, data: bytes) -> Taken:
        text = data.decode("utf-8", "replace").strip()
        word, _, rest = text.partition(" ")
        if word == "host":
            pid, ticks, boot = [*rest.split(), "", "", ""][:3]
            if pid.isdigit() and ticks.isdigit() and boot:
                return cls(ProcessIdentity(int(pid), int(ticks), boot))
        # Anything else (a launcher's note, a damaged file) means no host may start on it.
        return cls(None, rest if word == ABANDONED else text)


class LaunchTickets:
    """``<state dir>/launches/``: one file per launch that carried a ticket."""

    def __init__(self, store: MatrixStore) -> None:
        self.store = store

    def take(self, ticket: str, taker: Taken) -> Taken | None:
        """Take ``ticket`` for ``taker``; None if it is now ours, else whoever took it first."""
        name = check_ticket(ticket)
        root = self.store.side_dir("launches")
        fd = os.open(root, DIR_FLAGS)
        try:
            try:
                # No lock is held (the host and the launcher race by design): each taker writes
                # its own temp file, and the exclusive link decides who took the ticket.
                tmp = f".{name}.{os.urandom(4).hex()}.tmp"
                durable_write(fd, name, taker.encode(), exclusive=True, path=str(root / name), tmp=tmp)
                return None
            except FileExistsError:
                pass
            try:
                return Taken.decode(read_bounded(fd, name, str(root / name), _MAX_BYTES))
            except (FileNotFoundError, PiMatrixError) as exc:
                # Pruned or unreadable: refuse, never guess that the way is free.
                return Taken(None, f"the ticket is unreadable ({exc})")
        finally:
            os.close(fd)

    def prune(self, now: int | None = None) -> None:
        """Forget tickets older than a day (best effort: a leftover costs one small file)."""
        cutoff = (now_ms() if now is None else now) - KEEP_MS
        root = self.store.side_dir("launches")
        try:
            names = os.listdir(root)
        except OSError:
            return
        for name in names:
            path = root / name
            try:
                if os.lstat(path).st_mtime * 1000 < cutoff:
                    os.unlink(path)
            except OSError:
                continue
