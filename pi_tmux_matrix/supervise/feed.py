"""What wakes a master's handoff delivery at once rather than on its heartbeat
(docs/decisions.md#handoffs-are-pushed-not-polled).

A worker's host writes its handoff into its own entry (an atomic rename in the state dir); the
master's host follows the state dir by inotify, as ``top`` does, and looks at only the entries
whose files changed. When pi takes a handoff, its bridge's report lands in the master's inbox
(also inotify): the handoffs it names are acknowledged then, not at the next heartbeat. The
heartbeat's full pass stays as the safety net (no inotify, a lost event, an overflowed queue).

Both watches are on the host process's one inotify instance: a master holds one instance like
any other agent, not one for its inbox and another for the state dir
(docs/decisions.md#one-inotify-instance-per-host).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..identity import KEY_PATTERN
from ..inotify import Watches
from ..matrix.statedir import SUFFIX

__all__ = ["EntryFeed"]

log = logging.getLogger(__name__)


class EntryFeed:
    """Tells ``on_change`` the keys of the entry files written in a state dir (None: events were
    lost, every entry must be looked at), as ``watches`` dispatches their events."""

    def __init__(
        self, root: str, own_key: str, watches: Watches, on_change: Callable[[set[str] | None], None]
    ) -> None:
        self.own_key = own_key
        self._watches = watches
        self._on_change = on_change
        self._token = watches.add(root, self._changed)
        if self._token is None:
            log.info("handoffs follow the heartbeat only: the state dir %s is not watched", root)

    @property
    def watched(self) -> bool:
        return self._token is not None

    def _changed(self, names: set[str]) -> None:
        keys = self.keys(names)
        if keys != set():
            self._on_change(keys)

    def keys(self, names: set[str]) -> set[str] | None:
        """The keys of the entries ``names`` are (our own left out); None when events were lost."""
        keys: set[str] = set()
        for name in names:
            if name == "":
                return None
            key = name[: -len(SUFFIX)] if name.endswith(SUFFIX) and not name.startswith(".") else ""
            if key != self.own_key and KEY_PATTERN.fullmatch(key):
                keys.add(key)
        return keys

    def close(self) -> None:
        self._watches.remove(self._token)
        self._token = None
