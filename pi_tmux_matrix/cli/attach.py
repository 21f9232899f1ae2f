"""``pi-matrix attach KEY``: into the agent's tmux pane, on the server it runs on.

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
from typing import TYPE_CHECKING

from ..errors import EXIT_OK, DispatchError, NotFound
from .base import add_verb, store_of
from .names import resolve_key

if TYPE_CHECKING:
    import argparse

    from .base import Io, Verbs

__all__ = ["cmd_attach", "register"]


def register(sub: Verbs, epilog: str) -> None:
    """Add ``attach``."""
    attach = add_verb(sub, "attach", epilog)
    attach.add_argument("key", metavar="KEY", help="the agent (a unique prefix of its key or name will do)")
    attach.add_argument("--print", action="store_true", help="print the tmux command; attach nothing")
    attach.set_defaults(handler=cmd_attach)


def cmd_attach(args: argparse.Namespace, io: Io) -> int:
    from ..dispatch.jobs import JobStore
    from ..dispatch.tmux import TmuxServer

    store = store_of(args)
    key = resolve_key(store, args.key)
    agent = JobStore(store).agent_of(key)
    ref = agent.pane_ref if agent is not None else None
    if ref is None:
        how = f"its log: pi-matrix show {key}" if agent is not None else "it was not fired into tmux"
        raise NotFound(f"{key} has no tmux pane ({how})")
    socket, pane_id = ref
    server = TmuxServer(socket)
    command = shlex.join(server.attach_argv(pane_id))
    if args.print:
        io.out.write(command + "\n")
        return EXIT_OK
    if server.pane(pane_id) is None:
        raise NotFound(f"{key}'s pane {pane_id} is gone from tmux -L {socket} (its agent ended?)")
    inside = os.environ.get("TMUX")
    if inside:
        mine = TmuxServer.of_client(inside)
        if server.same_as(mine):
            server.show(pane_id, switch=True)
            io.out.write(f"switched to {key} ({pane_id})\n")
        else:
            server.show(pane_id, switch=False)
            mine.open_window(key[:32], server.attach_argv(pane_id))
            io.out.write(f"opened a window attached to {key} on tmux -L {socket}\n")
        return EXIT_OK
    if not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise DispatchError(f"attach: not on a terminal; run it in one, or: {command}")
    server.attach(pane_id)
