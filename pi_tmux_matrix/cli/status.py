"""``status``, ``setup-help`` and ``guard`` (the origin's actions of those names:
docs/decisions.md#the-tool-keeps-the-origins-words): tmux detection with a matrix summary, what
to do next, and whether the tmux route is open. Diagnostic only: none of them starts a tmux
server or changes anything."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ..contract import DEFAULT_SOCKET, ENV_TMUX_SOCKET
from ..errors import EXIT_FAILED, EXIT_OK
from ..identity import validate_id
from .base import add_verb
from .dispatch import default_socket, dispatcher_of, dump_json

if TYPE_CHECKING:
    from ..dispatch.tmux_status import TmuxStatus
    from .base import Io, Verbs

__all__ = ["register"]


def register(sub: Verbs, epilog: str) -> None:
    """Add ``status``, ``setup-help`` and ``guard``."""
    for verb in ("status", "setup-help", "guard"):
        parser = add_verb(sub, verb, epilog)
        parser.add_argument(
            "--socket",
            metavar="S",
            help=f"the dispatcher's tmux -L socket (default: ${ENV_TMUX_SOCKET} or {DEFAULT_SOCKET})",
        )
        parser.add_argument("--json", action="store_true")
        parser.set_defaults(
            handler={"status": cmd_status, "setup-help": cmd_setup_help, "guard": cmd_guard}[verb]
        )


def _detect(args: argparse.Namespace) -> TmuxStatus:
    from ..dispatch.tmux_status import detect

    return detect(validate_id(args.socket or default_socket(), "--socket"), os.environ)


def cmd_status(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix status``: the origin's ``status``, with the matrix summary."""
    from ..dispatch.tmux_status import matrix_summary

    status = _detect(args)
    summary = matrix_summary(dispatcher_of(args))
    if args.json:
        dump_json(io, {"tmux": status.to_json(), "matrix": summary})
        return EXIT_OK
    states: dict[str, int] = summary["jobs"]  # type: ignore[assignment]
    jobs = ", ".join(f"{count} {state}" for state, count in states.items()) or "none"
    live = f"{summary['liveMasters']} live master(s), {summary['liveWorkers']} live worker(s)"
    lines = [*status.lines(), f"matrix: {live}; jobs: {jobs}"]
    io.out.write("".join(line + "\n" for line in lines))
    return EXIT_OK


def cmd_setup_help(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix setup-help``: the origin's ``setup_help`` (and the text of ``/tmux-agents``)."""
    from ..dispatch.tmux_status import setup_help

    status = _detect(args)
    text = setup_help(status)
    if args.json:
        dump_json(io, {"available": status.available, "text": text})
    else:
        io.out.write(text + "\n")
    return EXIT_OK


def cmd_guard(args: argparse.Namespace, io: Io) -> int:
    """``pi-matrix guard``: the origin's ``guard``; exit 1 when the tmux route is closed."""
    from ..dispatch.tmux_status import guard_text

    status = _detect(args)
    text = guard_text(status)
    if args.json:
        dump_json(io, {"allowed": status.available, "text": text, "tmux": status.to_json()})
    else:
        io.out.write(text + "\n")
    return EXIT_OK if status.available else EXIT_FAILED


HANDLERS = {"status": cmd_status, "setup-help": cmd_setup_help, "guard": cmd_guard}
