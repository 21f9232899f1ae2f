"""Deprecated: fork runs moved to :mod:`pi_tmux_matrix.fork`; this alias is removed in the next release.

Every name that was imported from here is re-exported unchanged (the same objects), so old imports
keep working meanwhile; import from ``pi_tmux_matrix.fork`` instead. ``StopSignals`` is gone: the
library no longer installs signal handlers (``pi-matrix fork`` and ``pi-matrix runs --wait`` do,
and tell the waiter through :class:`pi_tmux_matrix.fork.StopRequest`).
"""

from __future__ import annotations

import warnings

from . import fork

# Star imports of each room (their __all__ are literal lists, so a type checker sees the names too).
from .fork.deliver import *  # noqa: F403
from .fork.launch import *  # noqa: F403
from .fork.model import *  # noqa: F403
from .fork.panes import *  # noqa: F403
from .fork.script import *  # noqa: F403
from .fork.store import *  # noqa: F403
from .fork.wait import *  # noqa: F403

__all__ = fork.__all__

warnings.warn(
    "pi_tmux_matrix.runs is deprecated and removed in the next release: import from pi_tmux_matrix.fork",
    DeprecationWarning,
    stacklevel=2,
)
