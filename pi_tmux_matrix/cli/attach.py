"""Watching one agent: ``pi-matrix attach KEY`` (into its tmux pane, on the server it runs on)
and ``pi-matrix logs KEY`` (its recent output, made safe for a terminal).

Outside tmux this process becomes ``tmux attach`` to that pane (a terminal is needed). Inside tmux
on the same server the client switches to the pane; inside another tmux server (a person's own,
the agents on the dispatcher's private socket) a new window of the person's session attaches to it
(tmux would not nest one server's client in another's pane unasked). ``--print`` only says the
command a person can paste.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from .. import pisession, procs
from ..errors import EXIT_OK, ContractError, DispatchError, NotFound
from ..matrix.fsio import read_state_file
from ..safetext import printable
from .base import add_verb, store_of
from .names import resolve_key

if TYPE_CHECKING:
    import argparse

    from ..dispatch.tmux import TmuxServer
    from ..matrix.store import MatrixStore
    from .base import Io, Verbs

__all__ = ["cmd_attach", "cmd_logs", "pane_of", "register", "show_inside"]


def register(sub: Verbs, epilog: str) -> None:
    """Add ``attach`` and ``logs``."""
    register_logs(sub, epilog)
    attach = add_verb(sub, "attach", epilog)
    attach.add_argument("key", metavar="KEY", help="the agent (a unique prefix of its key or name will do)")
    attach.add_argument("--print", action="store_true", help="print the tmux command; attach nothing")
    attach.set_defaults(handler=cmd_attach)


def cmd_attach(args: argparse.Namespace, io: Io) -> int:
    store = store_of(args)
    key = resolve_key(store, args.key)
    server, pane_id = pane_of(store, key)
    command = shlex.join(server.attach_argv(pane_id))
    if args.print:
        io.out.write(command + "\n")
        return EXIT_OK
    if server.pane(pane_id) is None:
        raise NotFound(f"{key}'s pane {pane_id} is gone from tmux -L {server.socket} (its agent ended?)")
    if os.environ.get("TMUX"):
        io.out.write(show_inside(server, pane_id, key) + "\n")
        return EXIT_OK
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise DispatchError(f"attach: not on a terminal; run it in one, or: {command}")
    server.attach(pane_id)


def pane_of(store: MatrixStore, key: str) -> tuple[TmuxServer, str]:
    """The tmux server and pane the agent ``key`` runs in (its newest job's record of it)."""
    from ..dispatch.jobs import JobStore
    from ..dispatch.tmux import TmuxServer

    agent = JobStore(store).agent_of(key)
    ref = agent.pane_ref if agent is not None else None
    if ref is None:
        how = f"its output: pi-matrix logs {key}" if agent is not None else "it was not fired into tmux"
        raise NotFound(f"{key} has no tmux pane ({how})")
    return TmuxServer(ref[0]), ref[1]


def show_inside(server: TmuxServer, pane_id: str, key: str) -> str:
    """From inside tmux (``$TMUX``): the agent's pane for the calling client, what was done."""
    from ..dispatch.tmux import TmuxServer

    mine = TmuxServer.of_client(os.environ["TMUX"])
    if server.same_as(mine):
        server.show(pane_id, switch=True)
        return f"switched to {key} ({pane_id})"
    server.show(pane_id, switch=False)
    mine.open_window(key[:32], server.attach_argv(pane_id))
    return f"opened a window attached to {key} on tmux -L {server.socket}"


# -- logs ---------------------------------------------------------------------------------------------
MAX_LINES: Final = 10_000
LOG_TAIL_BYTES: Final = 1024 * 1024  # of a detached agent's log: what its last lines are read from
FOLLOW_S: Final = 1.0


def register_logs(sub: Verbs, epilog: str) -> None:
    """Add ``logs``."""
    logs = add_verb(sub, "logs", epilog)
    logs.add_argument("key", metavar="KEY", help="the agent (a unique prefix of its key or name will do)")
    logs.add_argument(
        "-n", type=int, default=40, metavar="N", help=f"the last N lines (default 40, at most {MAX_LINES})"
    )
    logs.add_argument(
        "-f", "--follow", action="store_true", help="go on printing what comes, until the agent ends"
    )
    logs.set_defaults(handler=cmd_logs)


def cmd_logs(args: argparse.Namespace, io: Io) -> int:
    """The agent's recent output: its pane's scrollback (tmux), its log (detached), its
    conversation (rpc, or no output of its own kept), every line made safe for a terminal."""
    if not 1 <= args.n <= MAX_LINES:
        raise ContractError("-n", f"{args.n} is out of range", f"give 1..{MAX_LINES}")
    store = store_of(args)
    key = resolve_key(store, args.key)
    source = _source(store, key)
    seen = source.lines()
    _write(io, seen[-args.n :])
    while args.follow:
        if not source.running():
            io.out.write(f"-- {key} ended\n")
            break
        time.sleep(FOLLOW_S)
        now = source.lines()
        _write(io, now[_overlap(seen, now) :])
        seen = now
    return EXIT_OK


def _write(io: Io, lines: list[str]) -> None:
    io.out.write("".join(printable(line) + "\n" for line in lines))
    io.out.flush()


def _overlap(before: list[str], after: list[str]) -> int:
    """How many of ``after``'s first lines ``before`` already ended with (a scrolled screen)."""
    for size in range(min(len(before), len(after)), 0, -1):
        if before[-size:] == after[:size]:
            return size
    return 0


class _Source:
    """Where an agent's output is read from, and whether it still runs."""

    def __init__(self, store: MatrixStore, key: str, read: Callable[[], list[str]]) -> None:
        self.store, self.key, self.lines = store, key, read

    def running(self) -> bool:
        entry = self.store.find(self.key)
        return entry is not None and (procs.is_alive(entry.process) or procs.is_alive(entry.child_process))


def _source(store: MatrixStore, key: str) -> _Source:
    from ..dispatch.jobs import JobStore
    from ..dispatch.tmux import TmuxServer

    entry = store.get(key)
    agent = JobStore(store).agent_of(key)
    ref = agent.pane_ref if agent is not None else None
    if ref is not None and TmuxServer(ref[0]).pane(ref[1]) is not None:
        server, pane_id = TmuxServer(ref[0]), ref[1]
        return _Source(store, key, lambda: server.capture(pane_id).rstrip("\n").split("\n"))
    log = agent.log if agent is not None else None
    if log is not None and os.path.exists(log):

        def tail() -> list[str]:
            data = read_state_file(log, max_bytes=LOG_TAIL_BYTES, tail=True)
            return data.decode("utf-8", "replace").rstrip("\n").split("\n")

        return _Source(store, key, tail)
    session = entry.identity.session_file
    if session is not None and os.path.exists(session):

        def said() -> list[str]:
            told = pisession.conversation(session)
            return [f"{role}: {line}" for role, text in told for line in text.split("\n")]

        return _Source(store, key, said)
    raise NotFound(f"{key}: no output kept (no pane, no log, no session file); see pi-matrix show {key}")
