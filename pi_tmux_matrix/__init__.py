"""pi_tmux_matrix: a durable process matrix and tmux dispatcher for pi coding agents.

The public face re-exports only; see ``docs/`` for the concepts and the on-disk format. A plugin
author or an orchestrator imports from here, never from the submodules (which move).
"""

from __future__ import annotations

__version__ = "0.1.0.dev0"

import importlib
from typing import TYPE_CHECKING, Any, Final

from .errors import (
    AdoptionRefused,
    AgentNotFound,
    Ambiguous,
    Conflict,
    ContractError,
    CorruptEntry,
    DispatchError,
    EntryExists,
    IllegalTransition,
    InvalidId,
    JobNotFound,
    LaneError,
    LockUnavailable,
    NoMaster,
    NoSuch,
    NotConfirmed,
    NotFound,
    PiMatrixError,
    ProfileError,
    ProfileNotFound,
    ResumeRefused,
    RunNotFound,
    StateDirError,
    StoreError,
    TmuxUnavailable,
    UsageError,
)

# Loaded on first access (PEP 562): ``pi-matrix`` imports this package on every start, and each
# verb imports only what it uses (the dispatcher pulls in pluggy, subprocess and the TOML profile
# loader; the store attrs and cattrs: docs/decisions.md#a-verb-loads-only-what-it-uses). The one place to
# update when a module moves: public name -> "module" (relative to this package), or
# "module:attribute" when the public name differs from the attribute. Mirror it in the
# TYPE_CHECKING block below (tests/test_public_api.py checks that the two agree).
_LAZY: Final[dict[str, str]] = {
    "AgentIdentityContract": ".identity",
    "Entry": ".matrix.model",
    "Facts": ".matrix.reconcile",
    "LaunchContract": ".launch_contract",
    "MatrixSettings": ".settings",
    "MatrixStore": ".matrix.store",
    "Mode": ".identity",
    "Plan": ".matrix.reconcile",
    "ProcessIdentity": ".identity",
    "Role": ".identity",
    "Status": ".matrix.model",
    "entry_key": ".identity",
    "load_settings": ".settings",
    "now_ms": ".matrix.tokens",
    "parse_env": ".launch_contract",
    "reconcile": ".matrix.reconcile",
    "resolve_state_dir": ".paths",
    "AgentLaunch": ".dispatch.model",
    "AgentResult": ".dispatch.model",
    "Dispatcher": ".dispatch.manager",
    "FireRequest": ".dispatch.request",
    "FireResult": ".dispatch.manager",
    "Job": ".dispatch.model",
    "JobAgent": ".dispatch.model",
    "PlannedAgent": ".dispatch.model",
    "ProfileSet": ".dispatch.profile",
    "Relaunch": ".dispatch.model",
    "ResultKind": ".dispatch.model",
    "TmuxServer": ".dispatch.tmux",
    "WorkerLaunchProfile": ".dispatch.profile",
    "current_process": ".procs:current",
    "hookimpl": ".dispatch.hookspecs",
    "load_profiles": ".dispatch.profile",
    "new_entry": ".matrix.lifecycle",
}

if TYPE_CHECKING:  # what mypy and IDEs see for the lazy names; never executed
    from .dispatch.hookspecs import hookimpl
    from .dispatch.manager import Dispatcher, FireResult
    from .dispatch.model import AgentLaunch, AgentResult, Job, JobAgent, PlannedAgent, Relaunch, ResultKind
    from .dispatch.profile import ProfileSet, WorkerLaunchProfile, load_profiles
    from .dispatch.request import FireRequest
    from .dispatch.tmux import TmuxServer
    from .identity import AgentIdentityContract, Mode, ProcessIdentity, Role, entry_key
    from .launch_contract import LaunchContract, parse_env
    from .matrix.lifecycle import new_entry
    from .matrix.model import Entry, Status
    from .matrix.reconcile import Facts, Plan, reconcile
    from .matrix.store import MatrixStore
    from .matrix.tokens import now_ms
    from .paths import resolve_state_dir
    from .procs import current as current_process
    from .settings import MatrixSettings, load_settings

__all__ = [
    "AdoptionRefused",
    "AgentIdentityContract",
    "AgentLaunch",
    "AgentNotFound",
    "AgentResult",
    "Ambiguous",
    "Conflict",
    "ContractError",
    "CorruptEntry",
    "DispatchError",
    "Dispatcher",
    "Entry",
    "EntryExists",
    "Facts",
    "FireRequest",
    "FireResult",
    "IllegalTransition",
    "InvalidId",
    "Job",
    "JobAgent",
    "JobNotFound",
    "LaneError",
    "LaunchContract",
    "LockUnavailable",
    "MatrixSettings",
    "MatrixStore",
    "Mode",
    "NoMaster",
    "NoSuch",
    "NotConfirmed",
    "NotFound",
    "PiMatrixError",
    "Plan",
    "PlannedAgent",
    "ProcessIdentity",
    "ProfileError",
    "ProfileNotFound",
    "ProfileSet",
    "Relaunch",
    "ResultKind",
    "ResumeRefused",
    "Role",
    "RunNotFound",
    "StateDirError",
    "Status",
    "StoreError",
    "TmuxServer",
    "TmuxUnavailable",
    "UsageError",
    "WorkerLaunchProfile",
    "__version__",
    "current_process",
    "entry_key",
    "hookimpl",
    "load_profiles",
    "load_settings",
    "new_entry",
    "now_ms",
    "parse_env",
    "reconcile",
    "resolve_state_dir",
]


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module_name, _, attribute = target.partition(":")
    value = getattr(importlib.import_module(module_name, __name__), attribute or name)
    globals()[name] = value  # cached: later lookups are plain attribute reads, no __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
