"""A fork run's end: learning it (the bridge's result, the exit marker, the pane's process gone,
or no update for 30 minutes), recording it, aborting runs, and the waiter that ``fork --wait``
and a run's finisher (``runs RUN --wait``) sit in until the end
(docs/decisions.md#a-forks-end-is-always-recorded).

The waiter installs no signal handlers: the program's edge (the CLI) owns the process's signals
and tells a waiter to stop through a :class:`StopRequest`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Final

import attrs

from .. import procs
from ..errors import CorruptEntry
from ..errors import RunNotFound as NotFound
from ..identity import ProcessIdentity
from ..matrix.store import MatrixStore, now_ms
from .model import INTERRUPTED, PARENT_ABORTED, ForkRun, RunStatus, finished
from .panes import stop_run_process
from .store import RunStore

__all__ = [
    "StopRequest",
    "abort_run",
    "abort_runs",
    "reap",
    "refresh",
    "wait_run",
]

STALE_MS: Final = 30 * 60 * 1000
STALE_ERROR: Final = "no update for 30 minutes: reaped as stale"
HEARTBEAT_S: Final = 60.0
# result.json is read "with retries (up to 2s)" (docs/decisions.md#a-forks-end-is-always-recorded).
RESULT_GRACE_S: Final = 2.0


def _refresh(runs: RunStore, run: ForkRun, now: int, *, settle: bool) -> ForkRun | None:
    """A running run's next state if it ended (or went stale), else None. ``settle`` gives the
    bridge's result up to 2 s to appear after the exit marker and the exit up to 2 s to follow
    the result (a waiter); without it (a listing) a run with a result whose process still runs
    stays running: its exit code lands in a moment, and its waiter records it."""
    if run.status is not RunStatus.RUNNING:
        return None
    result = runs.result(run.id)
    code = runs.exit_code(run.id)
    alive = run.process is not None and procs.is_alive(run.process)
    if result is not None:
        if code is None and alive and not settle:
            return None
        # The bridge writes the result just before pi exits: a waiter gives the exit a moment.
        deadline = time.monotonic() + (RESULT_GRACE_S if settle else 0.0)
        while code is None and time.monotonic() < deadline:
            time.sleep(0.05)
            code = runs.exit_code(run.id)
        return finished(run, result, code, now)
    if code is not None or (run.process is not None and not alive):
        if settle:
            deadline = time.monotonic() + RESULT_GRACE_S
            while result is None and time.monotonic() < deadline:
                time.sleep(0.1)
                result = runs.result(run.id)
        if result is None:
            # No artifact (the bridge never wrote it): what the child's session file says, before
            # a synthetic failure (docs/decisions.md#a-forks-end-is-always-recorded).
            result = runs.session_result(run)
        return finished(run, result, code, now_ms())
    if now - run.updated_at_ms > STALE_MS:
        return attrs.evolve(
            run, status=RunStatus.FAILED, error=STALE_ERROR, updated_at_ms=now, ended_at_ms=now
        )
    return None


def refresh(runs: RunStore, run_id: str, *, settle: bool = False) -> ForkRun:
    """Record the run's end if it has ended (under its lock); the run as it now stands."""
    now = now_ms()
    return runs.update(run_id, lambda run: _refresh(runs, run, now, settle=settle))


def reap(runs: RunStore, cwd: str | None = None) -> list[ForkRun]:
    """Refresh every running run (of ``cwd``); every run (of ``cwd``) as it now stands. A run
    reaped as stale is stopped too: it no longer counts, so it must not keep running unseen."""
    listed, _problems = runs.list()
    found: list[ForkRun] = []
    for run in listed:
        if cwd is not None and run.cwd != cwd:
            continue
        current = run
        if run.status is RunStatus.RUNNING:
            with suppress(NotFound, CorruptEntry):
                current = refresh(runs, run.id)
            if current.status is RunStatus.FAILED and current.error == STALE_ERROR:
                stop_run_process(current)
        found.append(current)
    return found


def abort_run(runs: RunStore, run_id: str, reason: str) -> ForkRun:
    """Record a running run failed with ``reason``, then stop it; a run that already ended (or
    just did) keeps the end it had. The record goes first: a waiter that sees the process die
    must find the abort, not guess "ended without a result"."""
    run = refresh(runs, run_id)
    if run.status is not RunStatus.RUNNING:
        return run
    now = now_ms()
    ours: list[ForkRun] = []

    def fail(current: ForkRun) -> ForkRun | None:
        if current.status is not RunStatus.RUNNING:
            return None
        # The child may have finished just before it was stopped: its result still counts.
        result = runs.result(current.id)
        if result is not None:
            ended = finished(current, result, runs.exit_code(current.id), now)
        else:
            ended = attrs.evolve(
                current, status=RunStatus.FAILED, error=reason, updated_at_ms=now, ended_at_ms=now
            )
        ours.append(ended)
        return ended

    ended = runs.update(run_id, fail)
    if ours:
        stop_run_process(ended)
    return ended


def abort_runs(
    store: MatrixStore,
    *,
    parent_session_file: str | None = None,
    parent_key: str | None = None,
    reason: str = PARENT_ABORTED,
) -> list[ForkRun]:
    """Stop the running forks of a parent (by its session file or its matrix key) and mark them
    failed with ``reason``: what a parent's shutdown does."""
    if not store.exists():
        return []
    runs = RunStore(store)
    listed, _problems = runs.list()
    wanted = os.path.realpath(parent_session_file) if parent_session_file else None
    stopped: list[ForkRun] = []
    for run in listed:
        if run.status is not RunStatus.RUNNING:
            continue
        by_file = wanted is not None and run.parent_session_file == wanted
        by_key = parent_key is not None and run.parent_key == parent_key
        if by_file or by_key:
            with suppress(NotFound, CorruptEntry):
                stopped.append(abort_run(runs, run.id, reason))
    return stopped


class StopRequest:
    """Why a waited fork must stop, told from outside the waiter: the CLI's signal handlers call
    :meth:`parent_shutdown` (SIGTERM, SIGHUP: the caller, the parent session, is going away) or
    :meth:`interrupt` (SIGINT: a person). The first request is the one that counts."""

    def __init__(self) -> None:
        self._reason: str | None = None

    def parent_shutdown(self) -> None:
        self._request(PARENT_ABORTED)

    def interrupt(self) -> None:
        self._request(INTERRUPTED)

    def _request(self, reason: str) -> None:
        if self._reason is None:
            self._reason = reason

    def reason(self) -> str | None:
        """Why the fork must stop, or None while nobody asked."""
        return self._reason


def _heartbeat(runs: RunStore, run_id: str) -> None:
    """Touch a running run's record: a waited run is never reaped as stale while its waiter lives."""
    runs.update(
        run_id,
        lambda r: attrs.evolve(r, updated_at_ms=now_ms()) if r.status is RunStatus.RUNNING else None,
    )


def wait_run(
    store: MatrixStore,
    run_id: str,
    *,
    timeout_s: float | None = None,
    close_pane: bool = True,
    poll_s: float = 0.2,
    watch: ProcessIdentity | None = None,
    stop: StopRequest | None = None,
    on_poll: Callable[[ForkRun, float], None] | None = None,
) -> ForkRun:
    """Wait until the run ends and record how; close its pane (``close_pane``) if this wait saw
    it end. A ``stop`` request (its parent shutting down, a Ctrl-C) stops the fork and fails it
    with the request's reason, and the death of ``watch`` (the ``fork --wait`` process a finisher
    watches: pi's bash tool kills a tool's whole process group with SIGKILL, which no handler
    sees) fails it with :data:`PARENT_ABORTED`; a ``timeout_s`` that passes stops and fails it too.
    ``on_poll`` sees the running run and the seconds waited at each look (a progress line)."""
    runs = RunStore(store)
    started = time.monotonic()
    beat = started
    saw_running = False
    while True:
        why = stop.reason() if stop is not None else None
        if why is not None:
            return abort_run(runs, run_id, why)
        run = refresh(runs, run_id, settle=True)
        if run.status is not RunStatus.RUNNING:
            break
        saw_running = True
        if watch is not None and not procs.is_alive(watch):
            return abort_run(runs, run_id, PARENT_ABORTED)
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            return abort_run(runs, run_id, f"timed out after {timeout_s:g}s")
        if time.monotonic() - beat > HEARTBEAT_S:
            beat = time.monotonic()
            _heartbeat(runs, run_id)
        if on_poll is not None:
            on_poll(run, time.monotonic() - started)
        time.sleep(poll_s)
    if close_pane and saw_running:
        stop_run_process(run)
    return run
