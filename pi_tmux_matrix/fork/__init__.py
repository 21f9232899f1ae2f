"""Fork runs (seed 003): a child pi started from a snapshot of a session, in a pane beside the caller.

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

# Each room's __all__ is what it offers outside the package: the package's public names are theirs.
from . import deliver, launch, model, panes, script, store, wait
from .deliver import *  # noqa: F403
from .launch import *  # noqa: F403
from .model import *  # noqa: F403
from .panes import *  # noqa: F403
from .script import *  # noqa: F403
from .store import *  # noqa: F403
from .wait import *  # noqa: F403

__all__ = (
    model.__all__
    + script.__all__
    + store.__all__
    + panes.__all__
    + launch.__all__
    + wait.__all__
    + deliver.__all__
)
