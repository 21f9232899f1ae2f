"""Starting a fork: check the caller and the task, snapshot the session, count the working
directory's running forks under its lock, record the run, and start the child in its pane, which
waits for the go until the run has recorded its pane and process
(docs/decisions.md#a-fork-runs-from-a-snapshot-beside-its-caller).

A launch that fails part-way records the run failed and stops whatever pane it made: a run is
never left running with nobody to learn its end.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Final

import attrs

from .. import pisession, procs
from ..contract import ENV_ALLOWED_PATHS, ENV_FORK, ENV_KEY
from ..dispatch.tmux import Pane, TmuxServer
from ..errors import ContractError, DispatchError, PiMatrixError
from ..identity import ProcessIdentity
from ..matrix.model import bounded
from ..matrix.store import MatrixStore, now_ms
from ..settings import MatrixSettings
from .compaction import compact_snapshot
from .model import ForkCapReached, ForkRequest, ForkRun, RunStatus, new_run_id
from .panes import fork_server, open_pane, stop_pane, stop_run_process
from .script import child_flags, config_flags, fork_script, parent_argv_from_host
from .store import RunStore
from .wait import reap

__all__ = ["start_fork"]

MAX_TASK_BYTES: Final = 32 * 1024


def _check_caller(env: Mapping[str, str]) -> None:
    """Refuse callers that must not fork: a fork child, or a worker confined to its paths."""
    if env.get(ENV_FORK) == "1":
        raise ContractError(
            ENV_FORK, "this is a fork child; forks do not fork", "fork from the parent session"
        )
    if env.get(ENV_ALLOWED_PATHS):
        raise ContractError(
            ENV_ALLOWED_PATHS,
            "set: this is a worker confined to its allowed paths, and a fork would run outside them",
            "ask your master for another worker (tmux_agent_manager fire), or do the task yourself",
        )


def _check_task(task: str) -> None:
    """Refuse a task pi could not take as its prompt: empty, too long, or read as a flag."""
    if not task.strip():
        raise ContractError(
            "TASK", "missing", "give the task after --, e.g. pi-matrix fork --session F -- check X"
        )
    if len(task.encode()) > MAX_TASK_BYTES:
        raise ContractError("TASK", f"longer than {MAX_TASK_BYTES} bytes", "shorten it or point to a file")
    if task.lstrip().startswith("-"):
        raise ContractError("TASK", "starts with '-' (pi would read it as a flag)", "start it with a word")


def _session_cwd(session_file: str) -> str:
    """The folder the session ran in (from its header), which the fork runs in too."""
    cwd = pisession.read_header(session_file).cwd
    if not os.path.isdir(cwd):
        raise ContractError(
            "--session", f"the session's folder {cwd} no longer exists", "restore it or fork another session"
        )
    return cwd


def _record_run(
    runs: RunStore,
    cap: int,
    request: ForkRequest,
    *,
    session_file: str,
    cwd: str,
    pi_argv: Sequence[str],
    flags: Sequence[str],
    server: TmuxServer,
    parent_key: str | None,
) -> ForkRun:
    """Under the working directory's cap lock, count its running forks, then snapshot the session
    and record the run (running): forks started at the same moment never exceed the cap."""
    now = now_ms()
    run_id = new_run_id()
    with runs.cap_lock(cwd):
        running = [r for r in reap(runs, cwd) if r.status is RunStatus.RUNNING]
        if len(running) >= cap:
            raise ForkCapReached(
                f"{len(running)} fork(s) already running in {cwd} (processMatrix.maxConcurrentForks={cap}): "
                "wait for one to finish ('pi-matrix runs'), abort one, or raise the setting"
            )
        snapshot = runs.folder(run_id) / "session.jsonl"
        # Compacted from its observational memory if it has one (the copy only, never the file).
        copied = compact_snapshot(pisession.whole_lines(session_file))
        runs.write_file(run_id, "session.jsonl", copied)
        run = ForkRun(
            id=run_id,
            cwd=cwd,
            task=bounded(request.task, 2000),
            mode=request.mode,
            snapshot_bytes=len(copied),
            parent_session_file=session_file,
            parent_key=parent_key,
            created_at_ms=now,
            updated_at_ms=now,
            argv=(*pi_argv, "--session", str(snapshot), *flags, request.task),
            # Recorded before the pane exists: an abort during the launch finds it by its tag.
            socket=server.socket,
            socket_path=server.socket_path,
        )
        runs.put(run, exclusive=True)
    return run


def _attached(pane: Pane, identity: ProcessIdentity) -> Callable[[ForkRun], ForkRun | None]:
    """The record change that gives a running run its pane and process."""

    def attach(current: ForkRun) -> ForkRun | None:
        if current.status is not RunStatus.RUNNING:
            return None  # aborted while it was being launched: nothing to attach it to
        return attrs.evolve(
            current, pane_id=pane.pane_id, window_id=pane.window_id, process=identity, updated_at_ms=now_ms()
        )

    return attach


def _fail_launch(
    runs: RunStore, server: TmuxServer, run_id: str, pane: Pane | None, exc: BaseException
) -> ForkRun | None:
    """Record the run failed by ``exc`` and stop what was started; the run's own end instead if
    it was aborted while being launched and ``exc`` is what the abort caused, else None (the
    caller re-raises)."""
    message = bounded(f"launch failed: {exc or type(exc).__name__}", 400)
    ended_elsewhere: list[ForkRun] = []

    def fail(current: ForkRun) -> ForkRun | None:
        if current.status is not RunStatus.RUNNING:
            ended_elsewhere.append(current)
            return None
        at = now_ms()
        return attrs.evolve(current, status=RunStatus.FAILED, error=message, updated_at_ms=at, ended_at_ms=at)

    with suppress(PiMatrixError):
        failed = runs.update(run_id, fail)
        if pane is not None:
            stop_pane(server, pane, None)
        else:
            stop_run_process(failed)  # a pane made before the failure is found by its tag
    if ended_elsewhere and isinstance(exc, PiMatrixError):
        # Aborted while it was being launched (its pane went with the abort): that is the run's
        # end, and the failure it caused here is no news.
        return ended_elsewhere[0]
    return None


def _start_in_pane(
    runs: RunStore,
    server: TmuxServer,
    request: ForkRequest,
    run: ForkRun,
    *,
    env: Mapping[str, str],
    settings: MatrixSettings,
    on_started: Callable[[ForkRun], None] | None,
) -> ForkRun:
    """Write the run's script, open its pane, record its pane and process, call ``on_started``,
    then give the go; on any failure on the way, :func:`_fail_launch`."""
    pane: Pane | None = None
    try:
        folder = runs.folder(run.id)
        body = fork_script(
            run.id, run.argv, folder, parent_env=env, overrides=settings.fork.environment, task=request.task
        )
        path = runs.write_file(run.id, "fork.sh", body.encode())
        pane = open_pane(server, request, run, path)
        server.pipe_pane(pane.pane_id, ["tee", "-a", str(folder / "pane.log")])
        identity = procs.identify(pane.pane_pid)
        if identity is None:
            raise DispatchError(f"the fork's pane {pane.pane_id} ended as soon as it started")
        run = runs.update(run.id, _attached(pane, identity))
        if run.status is not RunStatus.RUNNING:
            stop_pane(server, pane, identity)
            return run
        if on_started is not None:
            on_started(run)
        runs.write_file(run.id, "go", b"")
    except BaseException as exc:
        ended = _fail_launch(runs, server, run.id, pane, exc)
        if ended is None:
            raise
        return ended
    return run


def start_fork(
    store: MatrixStore,
    settings: MatrixSettings,
    request: ForkRequest,
    *,
    env: Mapping[str, str] | None = None,
    pi_argv: Sequence[str] = ("pi",),
    bridge: str | None = None,
    on_started: Callable[[ForkRun], None] | None = None,
) -> ForkRun:
    """Snapshot the session, check the cap, and start the child in its pane; the run (running,
    or failed if it was aborted while it was being launched).

    ``on_started`` runs once the run records its pane and process and before pi starts (the pane
    waits for the go): where the caller starts the run's finisher, so no pi ever runs unwatched."""
    source = dict(os.environ if env is None else env)
    _check_caller(source)
    _check_task(request.task)
    session_file = os.path.realpath(request.session_file)
    cwd = _session_cwd(session_file)
    server = fork_server(request)
    if request.parent_argv is not None:
        parent_argv: list[str] = list(request.parent_argv)
    else:
        parent_argv = parent_argv_from_host(source) or []
    flags = child_flags(parent_argv, request.flags, bridge, config=config_flags(settings.fork))
    runs = RunStore(store)
    run = _record_run(
        runs,
        settings.max_concurrent_forks,
        request,
        session_file=session_file,
        cwd=cwd,
        pi_argv=pi_argv,
        flags=flags,
        server=server,
        parent_key=source.get(ENV_KEY) or None,
    )
    return _start_in_pane(runs, server, request, run, env=source, settings=settings, on_started=on_started)
