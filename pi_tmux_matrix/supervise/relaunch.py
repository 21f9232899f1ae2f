"""What a master is handed to recover a worker it cannot adopt: the seams, typed.

A master (layer 3) starts nothing itself: its program passes in a :class:`Relauncher` (``pi-matrix
master`` passes the dispatcher's ``relaunch`` hook, whose matrix implementation is
:func:`pi_tmux_matrix.recovery.relaunch`) and a :class:`Rehoster`
(:func:`pi_tmux_matrix.recovery.rehost`). Recovery itself (the checks, the wake prompt, the plan,
the claim, the start through a backend) is one module, :mod:`pi_tmux_matrix.recovery`.
"""

from __future__ import annotations

from typing import Protocol

from ..identity import ProcessIdentity
from ..matrix.model import Entry
from ..matrix.store import MatrixStore

__all__ = ["Rehoster", "Relauncher"]


class Relauncher(Protocol):
    """Relaunch ``entry`` (resumable, dead) under ``parent``; returns the new host pid."""

    def __call__(self, entry: Entry, parent: ProcessIdentity, parent_session: str) -> int: ...


class Rehoster(Protocol):
    """Start a new host for ``entry``'s live agent (its host died) under ``parent``; the new
    host's pid. ``ResumeRefused`` when there is nothing to rehost or another launcher won."""

    def __call__(
        self, store: MatrixStore, entry: Entry, parent: ProcessIdentity, parent_session: str
    ) -> int: ...
