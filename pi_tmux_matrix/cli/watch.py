"""``pi-matrix watch`` (hidden): one agent's completion watcher, as the dispatcher starts it.

Not for people: the dispatcher starts it per agent and marker round (tmux ``pipe-pane`` feeds it
the pane's output on stdin, or it follows the host's log), see
:func:`pi_tmux_matrix.programs.watch_argv`. Its process-wide choices live here, at the program's
edge: the signals it ignores, its log format, the plugin manager it notifies.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import TYPE_CHECKING, Any

from ..errors import EXIT_USAGE
from ..settings import load_settings
from .base import store_of

if TYPE_CHECKING:
    from .base import Io

__all__ = ["register"]


def register(sub: Any, epilog: str) -> None:
    watch = sub.add_parser("watch", epilog=epilog)  # no help: hidden (see base.public_verbs)
    watch.add_argument("--job", required=True)
    watch.add_argument("--agent", required=True)
    watch.add_argument("--round", type=int, required=True)
    watch.add_argument("--socket")
    watch.add_argument("--pane")
    watch.add_argument("--follow")
    watch.set_defaults(handler=cmd_watch)


def cmd_watch(args: argparse.Namespace, io: Io) -> int:
    # Imported here: every other verb starts without pluggy and the watcher.
    from ..dispatch.jobs import JobStore
    from ..dispatch.plugins import plugin_manager
    from ..dispatch.watch import Watcher

    # tmux closes the pipe when the pane goes; a hang-up must not cost the result.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    store = store_of(args)
    job = JobStore(store).get(args.job)
    agent = job.agent(args.agent)
    if agent is None:
        io.err.write(f"pi-matrix: error: job {args.job} has no agent {args.agent}\n")
        return EXIT_USAGE
    watcher = Watcher(
        store, job, agent, args.round, follow=args.follow, socket=args.socket, pane=args.pane,
        plugins=plugin_manager(matrix=load_settings(agent.cwd).enabled),
        pipe_fd=None if args.follow else sys.stdin.fileno(),
    )  # fmt: skip
    return watcher.run()
