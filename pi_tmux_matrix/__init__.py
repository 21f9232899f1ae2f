"""pi_tmux_matrix: a durable process matrix and tmux dispatcher for pi coding agents.

The public face re-exports only; see ``docs/`` for the concepts and the on-disk format.
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"

from .contract import LaunchContract, parse_env
from .errors import (
    Conflict,
    ContractError,
    CorruptEntry,
    EntryExists,
    IllegalTransition,
    InvalidId,
    LockUnavailable,
    NotFound,
    PiMatrixError,
    StateDirError,
    StoreError,
)
from .identity import AgentIdentityContract, Mode, ProcessIdentity, Role, entry_key
from .matrix.model import Entry, Status
from .matrix.reconcile import Facts, Plan, reconcile
from .matrix.store import MatrixStore
from .settings import MatrixSettings, load_settings, resolve_state_dir

__all__ = [
    "AgentIdentityContract",
    "Conflict",
    "ContractError",
    "CorruptEntry",
    "Entry",
    "EntryExists",
    "Facts",
    "IllegalTransition",
    "InvalidId",
    "LaunchContract",
    "LockUnavailable",
    "MatrixSettings",
    "MatrixStore",
    "Mode",
    "NotFound",
    "PiMatrixError",
    "Plan",
    "ProcessIdentity",
    "Role",
    "StateDirError",
    "Status",
    "StoreError",
    "__version__",
    "entry_key",
    "load_settings",
    "parse_env",
    "reconcile",
    "resolve_state_dir",
]
