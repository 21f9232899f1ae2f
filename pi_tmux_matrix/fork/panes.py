"""The fork's tmux panes: which server a fork goes to, where its pane goes in the caller's 2x2
grid (docs/decisions.md#a-fork-runs-from-a-snapshot-beside-its-caller), opening it, and finding
and stopping a run's pane later.

A run's pane is known by its tag (:data:`FORK_TAG`, the run id), never by its pane id alone: a
tmux server that restarted reuses pane ids.
"""

from __future__ import annotations

import re
from contextlib import suppress
from pathlib import Path
from typing import Final

from .. import procs
from ..contract import DEFAULT_SOCKET, ENV_TMUX_PANE
from ..dispatch.backends import TMUX_SESSION
from ..dispatch.tmux import Pane, TmuxServer
from ..errors import ContractError, DispatchError, TmuxUnavailable
from ..identity import ProcessIdentity
from .model import ForkRequest, ForkRun
from .script import NOT_INHERITED

__all__ = ["FORK_TAG", "stop_run_process"]

FORK_TAG: Final = "@pi_matrix_fork_run"  # the pane tag holding the run id
_PANE_ID: Final = re.compile(r"%[0-9]{1,9}")


def _stale_pane(pane: str, where: str) -> ContractError:
    return ContractError(
        "TMUX_PANE",
        f"{pane} is not a pane of the tmux server in $TMUX ({where}): a value left from another tmux?",
        "run pi-matrix fork from a pane of that tmux server, or unset TMUX and TMUX_PANE to get a "
        "window on --socket instead",
    )


def fork_server(request: ForkRequest) -> TmuxServer:
    """The tmux server the fork goes to, checked before anything is written: the caller's (its
    pane must be there) or, outside tmux, the ``--socket`` one."""
    if request.tmux_env and request.tmux_pane:
        if _PANE_ID.fullmatch(request.tmux_pane) is None:
            raise ContractError(ENV_TMUX_PANE, f"{request.tmux_pane!r} is not a tmux pane id", "unset it")
        server = TmuxServer.of_client(request.tmux_env)
        if server.pane(request.tmux_pane) is None:
            raise _stale_pane(request.tmux_pane, server.socket_path or server.socket)
        return server
    return TmuxServer(request.socket or DEFAULT_SOCKET, scrub_env=sorted(NOT_INHERITED))


def grid_slot(server: TmuxServer, caller: str) -> tuple[str, bool]:
    """Where the next fork pane goes in the caller's window: (pane to split, vertically?).

    A 2x2 grid with the caller top-left: the first fork takes the right half, the second the
    bottom of the right half, the third the bottom of the caller's half; more forks split the
    oldest fork pane again."""
    panes = server.panes()
    mine = next((p for p in panes if p.pane_id == caller), None)
    if mine is None:
        raise _stale_pane(caller, server.socket_path or server.socket)
    forks = [p for p in panes if p.window_id == mine.window_id and p.tag(FORK_TAG)]
    forks.sort(key=lambda p: int(p.pane_id[1:]))
    if not forks:
        return caller, False
    if len(forks) == 1:
        return forks[0].pane_id, True
    if len(forks) == 2:
        return caller, True
    return forks[0].pane_id, True


def open_pane(server: TmuxServer, request: ForkRequest, run: ForkRun, script: Path) -> Pane:
    """The run's pane running ``script``, tagged with the run id: beside the caller's pane in its
    grid, or (no caller pane) a window of its own. Its env is empty: the script sets it, since
    tmux's command line would show the values to any user's ``ps``."""
    argv = ["/bin/sh", str(script)]
    tags = {FORK_TAG: run.id}
    if request.tmux_env and request.tmux_pane:
        target, vertical = grid_slot(server, request.tmux_pane)
        return server.split(target, argv, vertical=vertical, cwd=run.cwd, env={}, tags=tags)
    return server.launch(
        argv, session=TMUX_SESSION, window_name=f"fork-{run.id[-6:]}", cwd=run.cwd, env={}, tags=tags
    )


def _server(run: ForkRun) -> TmuxServer:
    if run.socket_path:
        return TmuxServer(run.socket or "client", socket_path=run.socket_path)
    return TmuxServer(run.socket or DEFAULT_SOCKET)


def _run_pane(run: ForkRun) -> tuple[TmuxServer | None, Pane | None]:
    """(server, the run's pane) — the pane only while it still is the run's: tagged with the
    run's id, with the recorded pane id and process once they are recorded. A tmux server that
    restarted reuses pane ids: an id alone would name somebody else's pane."""
    if not (run.socket or run.socket_path):
        return None, None
    server = _server(run)
    try:
        panes = server.panes()
    except (TmuxUnavailable, DispatchError, ContractError):
        return server, None
    for pane in panes:
        if pane.tag(FORK_TAG) != run.id:
            continue
        if run.pane_id is not None and pane.pane_id != run.pane_id:
            continue
        if run.process is not None and pane.pane_pid != run.process.pid:
            continue
        return server, pane
    return server, None


def stop_pane(server: TmuxServer | None, pane: Pane | None, leader: ProcessIdentity | None) -> None:
    """Stop everything the pane's script started, then close the pane. The processes go first:
    killing a pane only hangs up its terminal, which pi or a tool's child may ignore."""
    if leader is None and pane is not None:
        leader = procs.identify(pane.pane_pid)
    if leader is not None:
        procs.stop_group(leader)
    if server is not None and pane is not None:
        with suppress(TmuxUnavailable, DispatchError, ContractError):
            server.kill_pane(pane.pane_id)


def stop_run_process(run: ForkRun) -> None:
    """Stop the run's processes (its pane's process group and their descendants: SIGTERM, then
    SIGKILL) and close its pane, if that pane is still the run's."""
    server, pane = _run_pane(run)
    stop_pane(server, pane, run.process)
