"""The host's own record: its entry, written only under its own process generation, and the side
files addressed to the same key (the events log, the inbox, the agent's notices).

One object for the host's whole life: a session switch re-keys it in place, so every room that
holds it writes to the session the agent is in now.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs

from ..errors import Conflict, PiMatrixError
from ..inotify import Watches, errno_name
from ..matrix.mailbox import AgentNotices, EventLog, Inbox, Message, announce_handoffs
from ..matrix.model import Entry
from ..matrix.store import MatrixStore
from ..settings import EVENTS_MAX_BYTES
from .timers import INBOX_POLL_S

__all__ = ["OwnRecord"]

log = logging.getLogger(__name__)


@attrs.define(eq=False)
class OwnRecord:
    """Our entry under ``key``, fenced by ``registration`` (our process generation)."""

    store: MatrixStore
    key: str
    registration: str = ""
    entry: Entry | None = None
    superseded: bool = False  # a newer process generation owns the entry: we never write it again
    # Told once when a newer generation is found (with its registration); unset, a warning is logged.
    on_superseded: Callable[[str | None], None] | None = None
    events_cap: int = EVENTS_MAX_BYTES  # the eventsMaxBytes setting: where the events file rotates
    events: EventLog = attrs.field(init=False)
    inbox: Inbox = attrs.field(init=False)
    notices: AgentNotices = attrs.field(init=False)
    # The host process's one inotify instance, shared by all its watches (our inbox; a master's
    # state dir): the kernel's 128 instances per user are one per agent, never more
    # (docs/decisions.md#one-inotify-instance-per-host).
    watches: Watches = attrs.field(init=False)
    mail_watch: int | None = attrs.field(init=False, default=None)  # its token; None: polled

    def __attrs_post_init__(self) -> None:
        self.watches = Watches(on_refused=self._inotify_refused)
        self.rekey(self.key)

    def rekey(self, key: str) -> None:
        """Follow the agent to another key (a session switch): its own events, mail and notices."""
        self.key = key
        self.events = EventLog(self.store, key, self.events_cap)
        self.inbox = Inbox(self.store, key)
        self.notices = AgentNotices(self.store, key)

    def register(
        self,
        entry: Entry,
        *,
        expected: str | None = None,
        check: Callable[[Entry | None], None] | None = None,
    ) -> Entry:
        """Write ``entry`` as a new process generation (an older same-session host loses it);
        with ``expected``, only over that exact generation (a launcher's claim); ``check`` may
        refuse it, under the lock, from the record it would replace."""
        self.entry = self.store.register(entry, expected=expected, check=check)
        self.registration = self.entry.registration
        self.superseded = False
        return self.entry

    def write(self, change: Callable[[Entry], Entry | None], *, durable: bool = True) -> Entry | None:
        """Apply ``change`` to our entry; None (and no more writes) once a newer process owns it.
        ``durable=False``: whole but not made durable (a heartbeat: see the host's beat)."""
        if self.superseded:
            return None
        known = self.entry
        before = known.status if known is not None else None
        try:
            entry = self.store.update(self.key, change, registration=self.registration, sync_dir=durable)
        except Conflict as exc:
            self._supersede(exc.found, warn=True)
            return None
        except PiMatrixError as exc:
            log.warning("%s: could not update the entry: %s", self.key, exc)
            return None
        self.entry = entry
        if entry.status is not before:
            self.events.write("status", status=entry.status.value, reason=entry.reason)
        announce_handoffs(self.store, known, entry)  # a new handoff: its master looks now
        return entry

    def read(self) -> Entry | None:
        """Our entry as it is on disk now (lock-free), or None once it is no longer ours."""
        if self.superseded:
            return None
        try:
            current = self.store.get(self.key)
        except PiMatrixError as exc:
            log.warning("%s: cannot read own entry: %s", self.key, exc)
            return None
        if current.registration != self.registration:
            self._supersede(current.registration, warn=False)
            return None
        return current

    def _supersede(self, found: str | None, *, warn: bool) -> None:
        self.superseded = True
        self.events.write("superseded", found=found)
        if self.on_superseded is not None:
            self.on_superseded(found)
        elif warn:
            log.warning(
                "%s: a newer process generation owns this entry now (%s); this host will not write it again",
                self.key,
                found,
            )

    def watch_mail(self, on_mail: Callable[[], None]) -> None:
        """Call ``on_mail`` on new mail in our inbox, by inotify; without it (refused, or no
        inotify here) nothing is watched and the host polls the inbox."""
        self.unwatch_mail()
        try:
            folder = self.store.side_dir("mailbox", self.key)
        except OSError:
            return
        self.mail_watch = self.watches.add(folder, lambda _names: on_mail())

    def unwatch_mail(self) -> None:
        self.watches.remove(self.mail_watch)
        self.mail_watch = None

    def _inotify_refused(self, exc: OSError) -> None:
        """Said once per process, in our events: the kernel refused inotify (its instances or
        watches spent: a fleet at the limit), so this host polls instead of waking at once."""
        polling = f"polling every {INBOX_POLL_S * 1000:.0f} ms"
        log.info("%s: inotify unavailable (%s: %s); %s", self.key, errno_name(exc), exc.strerror, polling)
        self.events.write("inotify_unavailable", errno=errno_name(exc), error=exc.strerror, detail=polling)

    def mail(self) -> list[Message]:
        """Our owner's messages. None once a newer generation owns the key (it reads them now);
        a message addressed to another generation of our key (a host that died before reading
        it) is dropped, never acted on: a stale stop must not stop a freshly resumed agent."""
        return self.look()[1]

    def look(self) -> tuple[Entry | None, list[Message]]:
        """Our entry as it is on disk now (as :meth:`read`) and our mail (as :meth:`mail`), from
        one read of the entry: a host's every look needs both."""
        current = self.read()  # a newer generation's mail is its own: look before taking any
        if self.superseded:
            return None, []
        kept: list[Message] = []
        for message in self.inbox.take():
            if message.to is not None and message.to != self.registration:
                self.events.write("message_dropped", kind=message.kind, to=message.to)
                continue
            kept.append(message)
        return current, kept
