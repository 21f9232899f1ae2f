"""Parser, dispatch, and the one place errors become exit codes."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import IO

from .. import __version__
from ..errors import EXIT_FAILED, EXIT_USAGE, PiMatrixError, UsageError, exit_code_for
from . import (
    completion,
    demo,
    dispatch,
    doctor,
    entries,
    host,
    lanes,
    master,
    owner,
    runs,
    status,
    teamwork,
    top,
    tree,
    watch,
)
from .base import EPILOG, Io, Parser

__all__ = ["Io", "build_parser", "main", "run"]


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (also the source of the generated CLI reference)."""
    parser = Parser(
        prog="pi-matrix",
        description="The durable process matrix for pi coding agents in tmux.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"pi-matrix {__version__}")
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="the matrix state dir (default: see below)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    sub.required = True
    entries.register(sub, EPILOG)
    # The supervision verbs, in their --help order: host, master, the owner's verbs, tree.
    host.register(sub, EPILOG)
    master.register(sub, EPILOG)
    owner.register(sub, EPILOG)
    tree.register(sub, EPILOG)
    dispatch.register(sub, EPILOG)
    teamwork.register(sub, EPILOG)
    lanes.register(sub, EPILOG)
    status.register(sub, EPILOG)
    runs.register(sub, EPILOG)
    demo.register(sub, EPILOG)
    doctor.register(sub, EPILOG)
    completion.register(sub, EPILOG)
    top.register(sub, EPILOG)
    watch.register(sub, EPILOG)
    return parser


class _StderrHandler(logging.Handler):
    def __init__(self, stream: IO[str]) -> None:
        super().__init__(logging.WARNING)
        self.stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        try:
            level = "warning" if record.levelno < logging.ERROR else "error"
            self.stream.write(f"pi-matrix: {level}: {record.getMessage()}\n")
            self.stream.flush()
        except Exception:  # noqa: BLE001 - logging must never take the command down
            self.handleError(record)


def main(argv: Sequence[str] | None = None, *, io: Io | None = None) -> int:
    """Run ``pi-matrix`` with ``argv``; returns the exit code (never calls sys.exit)."""
    io = io or Io(sys.stdout, sys.stderr)
    parser = build_parser()
    words = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first "--" is the agent's argv, passed on untouched (never parsed,
    # never joined into a shell string).
    trailing: list[str] | None = None
    if "--" in words:
        cut = words.index("--")
        words, trailing = words[:cut], words[cut + 1 :]
    try:
        args = parser.parse_args(words)
    except UsageError as exc:
        io.err.write(f"pi-matrix: error: {exc}\n")
        return exit_code_for(exc)
    except SystemExit as exc:  # --help, --version
        return exit_code_for(exc)
    if trailing is not None and not getattr(args, "takes_argv", False):
        io.err.write(f"pi-matrix: error: '{args.command}' takes no arguments after --\n")
        return EXIT_USAGE
    args.argv = trailing or []
    args.parser = parser  # completion walks the parser it was parsed with
    package_log = logging.getLogger("pi_tmux_matrix")
    handler = _StderrHandler(io.err)
    package_log.addHandler(handler)
    if package_log.level == logging.NOTSET:
        package_log.setLevel(logging.WARNING)
    try:
        command: Callable[[argparse.Namespace, Io], int] = args.handler
        return command(args, io)
    except PiMatrixError as exc:
        io.err.write(f"pi-matrix: error: {exc}\n")
        return exit_code_for(exc)
    except KeyboardInterrupt:
        io.err.write("pi-matrix: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_FAILED
    except OSError as exc:
        # A full disk, a read-only folder, a file where a folder should be: one line, never a
        # traceback (what the library could name, it already raised as a PiMatrixError).
        io.err.write(f"pi-matrix: error: {exc}\n")
        return exit_code_for(exc)
    finally:
        package_log.removeHandler(handler)


def run() -> None:
    """Console-script entry point."""
    sys.exit(main())
