"""Fork runs: a child pi started from a snapshot of a session, in a pane beside the caller
(docs/decisions.md#a-fork-runs-from-a-snapshot-beside-its-caller).

``pi-matrix fork --session FILE -- TASK`` copies the session file into the run's folder, starts
``pi --session <snapshot> <task>`` (plus the parent's inherited flags and the bridge) in a pane of
a 2x2 grid beside the caller, and either waits for the result (``--wait``) or leaves it running
(``--background``). The run's folder ``<state dir>/runs/<run id>/`` holds::

    session.jsonl   the snapshot the child appends to (the parent's file is never touched)
    fork.sh         the launch script: sets the child's env, waits for ``go``, runs pi, then
                    prints the exit marker
    go              written once the run recorded its pane and process: pi starts after it
    pane.log        the pane's output (tmux pipe-pane): where the exit marker is looked for
    exit.code       the child's exit code, also kept by the script (a child that ends before
                    the pipe is attached leaves no marker in the log)
    result.json     written by the bridge on the child's agent_end (text, stop reason, usage)
    finisher.log    the run's finisher's output (it records the end; for a waited run it also
                    watches the waiter)

and its record ``runs/<run id>.json`` (status running -> completed | failed) goes through the
record store: locked, durable, strict. The end of a run is learned from, in order: the bridge's
``result.json``; the ``__PI_FORK_EXIT_<run id>__:<code>`` marker in the pane log; the death of the
pane's process. With no result a synthetic failure is recorded, never nothing.

At most ``processMatrix.maxConcurrentForks`` (default 3) runs are running per working directory,
counted under a lock after reaping runs whose process is dead or that had no update for 30
minutes. A parent's shutdown stops its running forks and marks them failed.

The rooms: :mod:`.model` (the records), :mod:`.script` (the child's command line and
``fork.sh``), :mod:`.compaction` (the snapshot compacted from observational memory; internal),
:mod:`.store` (records and run folders), :mod:`.panes` (tmux), :mod:`.launch` (:func:`start_fork`),
:mod:`.wait` (a run's end, aborts, the waiter) and :mod:`.deliver` (background results into the
parent's session).
"""

from __future__ import annotations

# Each room's __all__ is what it offers outside the package: the package's public names are theirs,
# loaded on first use (PEP 562). A host only delivers background results (``.deliver``): importing
# every room (launch, panes, the tmux dispatcher) cost it ~25 ms and ~2 MiB on every beat's first
# call. tests/test_startup.py holds this table equal to the rooms' own __all__.
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the checker sees every name with its type; at run time they load on use
    from . import deliver, launch, model, panes, script, store, wait  # noqa: F401
    from .deliver import *  # noqa: F403
    from .launch import *  # noqa: F403
    from .model import *  # noqa: F403
    from .panes import *  # noqa: F403
    from .script import *  # noqa: F403
    from .store import *  # noqa: F403
    from .wait import *  # noqa: F403

_ROOMS: dict[str, tuple[str, ...]] = {
    "model": (
        "INTERRUPTED",
        "PARENT_ABORTED",
        "ForkCapReached",
        "ForkRequest",
        "ForkRun",
        "ForkUsage",
        "RunMode",
        "RunStatus",
        "finished",
        "parse_usage",
        "summary",
        "usage_total",
    ),
    "script": (
        "EXIT_MARKER",
        "FORCED_ENV",
        "child_env",
        "child_flags",
        "config_flags",
        "find_exit_code",
        "inherited_flags",
        "launch_script",
        "merge_flags",
        "parent_argv_from_host",
    ),
    "store": ("RunStore",),
    "panes": ("FORK_TAG", "stop_run_process"),
    "launch": ("start_fork",),
    "wait": ("StopRequest", "abort_run", "abort_runs", "reap", "refresh", "wait_run"),
    "deliver": ("due", "mark_delivered", "runs_stamp", "undelivered"),
}
_WHERE = {name: room for room, names in _ROOMS.items() for name in names}

__all__ = [name for names in _ROOMS.values() for name in names]


def __getattr__(name: str) -> Any:
    if name in _ROOMS:
        value = importlib.import_module(f".{name}", __name__)
    elif name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | set(_ROOMS))
