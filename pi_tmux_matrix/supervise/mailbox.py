"""Deprecated: moved to :mod:`pi_tmux_matrix.matrix.mailbox` (a pure part of the matrix, used by
supervise/ and dispatch/ alike). This alias is removed in 0.2."""

from __future__ import annotations

from .._deprecated import alias
from ..matrix import mailbox as _moved

alias(__name__, _moved)
