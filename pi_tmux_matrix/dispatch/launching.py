"""One fire's launch calls (docs/decisions.md#a-fire-fsyncs-only-what-a-crash-needs): each agent's
session header, its host, its ``launching`` entry; the writes the fire owes before it returns but
that none of its later steps waits for are run on threads beside those steps (:class:`Beside`).

A fire's time is mostly waiting: on its tmux call and on its fsyncs, each a journal commit that
costs milliseconds while other hosts start and write beside it. So a session header's fsync
runs while its tmux call does, and the ``launching`` entry is written while the job's update is
(their fsyncs share commits). Everything started beside is joined before the fire returns and
before it lets go of its cap lock, so a fire that returns has every write done, as before. The
job's first version is written beside the tmux calls (its hosts wait for it); a session header's
bytes are still written before its tmux call (pi opens the file when it starts).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from .. import pisession
from ..errors import EntryExists
from ..identity import ProcessIdentity, Role
from ..matrix import lifecycle
from ..matrix.model import Status
from ..matrix.store import MatrixStore, now_ms
from .backends import Backend, backend_named, start_fenced
from .model import AgentLaunch, JobAgent, PlannedAgent

__all__ = ["Beside", "launch_one", "publish_launching"]

log = logging.getLogger(__name__)


class Beside:
    """Calls run on threads beside the caller's next steps, all joined by :meth:`join`."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._pending: list[tuple[str, Future[object]]] = []

    def run(self, what: str, call: Callable[..., object], *args: object) -> Future[object]:
        """Start ``call``; its future, for a step that must follow it (its failure is joined)."""
        if self._pool is None:  # made on first use: a fire with nothing beside starts no thread
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pi-matrix-fire")
        future = self._pool.submit(call, *args)
        self._pending.append((what, future))
        return future

    def join(self) -> list[tuple[str, BaseException]]:
        """Wait for every call; each failure (what it was, the exception), logged too (a caller
        already failing for another reason raises that one)."""
        failed = []
        for what, future in self._pending:
            exc = future.exception()
            if exc is not None:
                log.warning("fire: %s failed: %s", what, exc)
                failed.append((what, exc))
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        return failed


def launch_one(
    backends: Mapping[str, Backend],
    store: MatrixStore | None,
    job_id: str,
    agent: JobAgent,
    plan: PlannedAgent,
    *,
    beside: Beside,
) -> JobAgent:
    """Start ``agent``'s host (``store`` None: the matrix is off, no ticket, no entry)."""
    # The header's bytes are there before its pane is made (pi opens the file when it starts);
    # their fsync runs during the tmux call, done before the fire returns.
    pi_session = agent.session_file if agent.provider == "pi" else None
    if pi_session is not None and pisession.write_header(pi_session, agent.session_id, plan.cwd, sync=False):
        beside.run(f"{agent.key}: the session header's fsync", _sync_header, pi_session)
    backend = backend_named(backends, agent.backend)
    launched = start_fenced(backend, store, job_id, agent, plan).recorded(agent)
    if store is not None and launched.host is not None:
        beside.run(f"{agent.key}: its launching entry", publish_launching, store, plan.launch, launched.host)
    return launched


def _sync_header(session_file: str) -> None:
    try:
        pisession.sync_header(session_file)
    except OSError as exc:
        # pi's file, not a record: the agent runs and pi appends to it as before (pi syncs none
        # of its own lines); a crash may leave it headerless, which resume then says.
        log.warning("%s: the session header may not survive a crash (fsync: %s)", session_file, exc.strerror)


def publish_launching(store: MatrixStore, launch: AgentLaunch, host: ProcessIdentity) -> None:
    """The launcher publishes the host's pid before the host registers
    (docs/decisions.md#the-launcher-publishes-the-pid-before-the-host-registers)."""
    entry = lifecycle.new_entry(
        role=Role.WORKER,
        identity=launch.identity(),
        process=host,
        now=now_ms(),
        parent=launch.parent,
        parent_session_id=launch.parent_session,
        task_ref=launch.task_ref,
        task_summary=launch.task,
        status=Status.LAUNCHING,
    )
    # Not made durable (no fsync of the state dir:
    # docs/decisions.md#a-fire-fsyncs-only-what-a-crash-needs), and safe so: the host it names
    # already runs, and what gates its agent is the host's own durable ticket and registration
    # (which replaces this record), never this one. A crash that undoes it (an OS crash: an fsync
    # guards against nothing else) ended that host too; the job record, durable when the fire
    # returns, still names the host, which then reads as dead with no entry, and its round is
    # settled so (dispatch/hostless.py). Its bytes are fsynced before it gets its name: a record a
    # crash keeps is whole.
    with contextlib.suppress(EntryExists):  # the host registered first: its registration is the record
        store.create(entry, sync_dir=False)
