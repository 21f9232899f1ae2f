"""What wakes a master's handoff delivery at once rather than on its heartbeat (issue 19).

A worker's host writes its handoff into its own entry (an atomic rename in the state dir); the
master's host follows the state dir by inotify, as ``top`` does, and looks at only the entries
whose files changed. When pi takes a handoff, its bridge's report lands in the master's inbox
(also inotify): the handoffs it names are acknowledged then, not at the next heartbeat. The
heartbeat's full pass stays as the safety net (no inotify, a lost event, an overflowed queue).
"""

from __future__ import annotations

import logging

from ..identity import KEY_PATTERN
from ..inotify import DirWatch
from ..inotify import available as inotify_available
from ..matrix.statedir import SUFFIX

__all__ = ["EntryFeed"]

log = logging.getLogger(__name__)


class EntryFeed:
    """The entry files written in a state dir since the last look, by key."""

    def __init__(self, root: str, own_key: str) -> None:
        self.own_key = own_key
        self._watch: DirWatch | None = None
        if inotify_available():
            try:
                self._watch = DirWatch(root)
            except OSError as exc:
                log.info("handoffs follow the heartbeat only: cannot watch %s: %s", root, exc)

    @property
    def fd(self) -> int | None:
        return self._watch.fd if self._watch is not None else None

    def changed(self) -> set[str] | None:
        """Keys of the entries written since the last call (our own left out); None when events
        were lost and every entry must be looked at."""
        if self._watch is None:
            return set()
        keys: set[str] = set()
        for name in self._watch.names():
            if name == "":
                return None
            key = name[: -len(SUFFIX)] if name.endswith(SUFFIX) and not name.startswith(".") else ""
            if key != self.own_key and KEY_PATTERN.fullmatch(key):
                keys.add(key)
        return keys

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
